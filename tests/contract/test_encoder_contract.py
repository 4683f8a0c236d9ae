"""The ``TextEncoder`` contract, run on the deterministic ``HashEncoder`` fake and on the real
ONNX encoder (the pinned MiniLM): every test taking ``encoder`` runs once on each."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from memstream.settings import EncoderSettings
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.text_encoder import TextEncoder
from tests.fakes import HashEncoder

TEXTS = [
    "Where is my order A-10293?",
    "Has my package A-10293 shipped yet?",
    "I like hiking in the mountains",
    "",
    "Line one\nline two, with more words\n\nline four",
]


@pytest.fixture(scope="module")
def onnx() -> Iterator[OnnxEncoder]:
    encoder = OnnxEncoder.from_settings(EncoderSettings(run_texts=4))
    yield encoder
    encoder.close()


@pytest.fixture(params=["fake", "onnx"])
def encoder(request: pytest.FixtureRequest) -> TextEncoder:
    if request.param == "fake":
        return HashEncoder(dim=32)
    real: OnnxEncoder = request.getfixturevalue("onnx")
    return real


def test_is_a_text_encoder(encoder: TextEncoder) -> None:
    assert isinstance(encoder, TextEncoder)
    assert encoder.model_id
    assert encoder.dim > 0
    assert encoder.runners >= 1


def test_rows_are_unit_float32_in_input_order(encoder: TextEncoder) -> None:
    vectors = encoder.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), encoder.dim)
    assert vectors.dtype == np.float32
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    reversed_ = encoder.encode(TEXTS[::-1])
    np.testing.assert_allclose(reversed_[::-1], vectors, atol=1e-6)


def test_empty_input_and_a_single_str(encoder: TextEncoder) -> None:
    empty = encoder.encode([])
    assert empty.shape == (0, encoder.dim)
    assert empty.dtype == np.float32
    with pytest.raises(TypeError):
        encoder.encode(TEXTS[0])  # type: ignore[arg-type]  # a str is a Sequence[str]


def test_deterministic_and_batch_equals_one_by_one(encoder: TextEncoder) -> None:
    batch = encoder.encode(TEXTS)
    again = encoder.encode(TEXTS)
    one_by_one = np.stack([encoder.encode([t])[0] for t in TEXTS])
    np.testing.assert_allclose(again, batch, atol=1e-6)
    np.testing.assert_allclose(one_by_one, batch, atol=1e-5)


def test_query_and_cache_change_no_vector(encoder: TextEncoder) -> None:
    plain = encoder.encode(TEXTS)
    np.testing.assert_allclose(encoder.encode(TEXTS, query=True), plain, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(TEXTS, cache=True), plain, atol=1e-5)
    np.testing.assert_allclose(encoder.encode(TEXTS, cache=True), plain, atol=1e-5)  # a hit


def test_a_near_copy_is_closer_than_an_unrelated_text(encoder: TextEncoder) -> None:
    base, near, far = encoder.encode(
        ["Where is my order A-10293?", "Where is my order A-10293 now?", "I like hiking"]
    )
    assert float(base @ near) > float(base @ far)


def test_token_counts(encoder: TextEncoder) -> None:
    assert encoder.count_tokens("") == 0
    assert encoder.count_tokens("hello world") >= 2
    text = TEXTS[-1]
    if encoder.counts_by_line:
        assert encoder.count_tokens(text) == sum(encoder.count_tokens(x) for x in text.split("\n"))
