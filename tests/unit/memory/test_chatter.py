"""Chatter: structural vetoes, the vector decision on hand-made vectors, and one pass with
the product's encoder on sentences written for this test."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from memstream.memory.chatter import (
    CHATTER,
    CONTENT,
    MIN_COSINE,
    Prototypes,
    chatter_mask,
    exemplar_texts,
    judge,
    structural_veto,
)
from memstream.memory.vectors import FloatArray, normalize

# --- structure ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Thanks, my order is A-10293.", "digit"),
        ("Cheers, it's jo.bloggs@example.com", "entity"),
        ("Lovely, see you on Thursday then.", "date"),
        ("Great, and when will the engineer come?", "question"),
        ("Okay, do I need to keep the box?", "question"),
        ("Thanks, the blender jug cracked and the lid hinge snapped off too", "words"),
        ("Hello! " * 30, "long"),
    ],
)
def test_structure_vetoes_turns_that_can_hold_a_fact(text: str, reason: str) -> None:
    assert structural_veto(text) == reason


@pytest.mark.parametrize(
    "text", ["Hi!", "Thanks a lot.", "How are you today?", "Can I help with anything else?"]
)
def test_structure_lets_short_social_turns_through(text: str) -> None:
    assert structural_veto(text) is None


# --- vectors (hand-made, 4-d) -------------------------------------------------------------


def _unit(*rows: Sequence[float]) -> FloatArray:
    return normalize(np.array(rows, dtype=np.float32))


# Axis 0: "social"; axis 1: "order matters"; axes 2, 3: unrelated.
PROTOS = Prototypes(chatter=_unit([1, 0, 0, 0], [0.9, 0.1, 0.3, 0]), content=_unit([0, 1, 0, 0]))


def test_close_to_chatter_and_far_from_content_is_chatter() -> None:
    vectors = _unit([1, 0.05, 0, 0])
    assert chatter_mask(["Hi there."], vectors, PROTOS) == [True]


def test_no_margin_over_content_is_not_chatter() -> None:
    # As close to "order matters" as to "social": the margin keeps it as content.
    verdict = judge(["Thanks, is it here?"], _unit([1, 1, 0, 0]), PROTOS)[0]
    assert not verdict.chatter
    assert abs(verdict.margin) < 0.05


def test_far_from_every_exemplar_is_not_chatter() -> None:
    verdict = judge(["Hm."], _unit([0.1, 0, 0, 1]), PROTOS)[0]
    assert verdict.score < MIN_COSINE
    assert not verdict.chatter


def test_a_veto_beats_the_vector() -> None:
    # The same vector as a plain greeting, but the text names an email address.
    verdict = judge(["Hi, it is jo@example.com"], _unit([1, 0, 0, 0]), PROTOS)[0]
    assert verdict.veto == "entity"
    assert not verdict.chatter


def test_more_words_ask_for_more_margin() -> None:
    vec = _unit([1, 0.75, 0, 0])  # margin ~0.2
    assert judge(["Hi."], vec, PROTOS, min_margin=0.15)[0].chatter
    six_words = "Hello, welcome, thanks, cheers, lovely, goodbye."
    assert not judge([six_words], vec, PROTOS, min_margin=0.15, word_margin=0.02)[0].chatter


def test_shapes_are_checked_and_empty_is_empty() -> None:
    assert judge([], np.zeros((0, 4), np.float32), PROTOS) == []
    with pytest.raises(ValueError, match="texts"):
        judge(["a", "b"], _unit([1, 0, 0, 0]), PROTOS)


def test_build_embeds_every_exemplar_once_in_order() -> None:
    seen: list[str] = []

    def fake_encode(texts: Sequence[str]) -> FloatArray:
        seen.extend(texts)
        return normalize(np.ones((len(texts), 4), np.float32))

    protos = Prototypes.build(fake_encode)
    chatter, content = exemplar_texts()
    assert seen == chatter + content
    assert protos.chatter.shape == (sum(len(v) for v in CHATTER.values()), 4)
    assert protos.content.shape == (len(CONTENT), 4)


# --- the product's encoder ------------------------------------------------------------------


def test_with_the_real_encoder() -> None:
    pytest.importorskip("onnxruntime")
    from memstream.settings import Settings
    from memstream.stores.encoder import OnnxEncoder

    encoder = OnnxEncoder.from_settings(Settings().encoder)
    protos = Prototypes.build(encoder.encode)
    talk = ["Hiya, hope all's well!", "Cheers, much obliged.", "Bye now, all the best!"]
    content = [
        "The washing machine leaks from the door seal.",
        "Please send the invoice to my work address.",
        "My daughter starts university in the autumn.",
    ]
    said = chatter_mask(talk + content, encoder.encode(talk + content), protos)
    assert said == [True] * len(talk) + [False] * len(content)
