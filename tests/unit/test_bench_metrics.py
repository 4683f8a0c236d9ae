"""The quality benchmark's pure parts: metrics, coverage, budget filling, BM25, turn formats."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest

from bench.baselines import BASELINES, BM25, rrf
from bench.locomo import (
    Question,
    Turn,
    aggregate,
    answer_tokens,
    answer_words,
    context_coverage,
    dia_id_of,
    evidence_recall,
    fill_budget,
    flatten,
    format_turn,
    hit_at_k,
    mean,
    recall_at_k,
    reciprocal_rank,
    score_ranking,
    shown,
    to_event,
)

# positions: a turn is one dia_id, a memory all of its sources
RANKING = [{"D1:1"}, {"D2:5", "D2:6", "D2:7"}, {"D3:1"}, {"D1:2"}]


@pytest.mark.parametrize(
    ("evidence", "k", "expected"),
    [
        (["D1:1"], 1, 1.0),
        (["D1:2"], 3, 0.0),
        (["D1:2"], 4, 1.0),
        (["D1:1", "D1:2"], 1, 0.5),
        (["D2:6", "D9:9"], 2, 0.5),  # a memory retrieves every source at its rank
        (["D2:6", "D2:7"], 2, 1.0),
        (["D1:1", "D1:1"], 1, 1.0),  # duplicated evidence counts once
        (["D9:9"], 20, 0.0),  # k past the end of the ranking
    ],
)
def test_recall_at_k(evidence: list[str], k: int, expected: float) -> None:
    assert recall_at_k(RANKING, evidence, k) == pytest.approx(expected)


def test_recall_needs_evidence() -> None:
    with pytest.raises(ValueError, match="evidence"):
        recall_at_k(RANKING, [], 5)
    with pytest.raises(ValueError, match="evidence"):
        evidence_recall({"D1:1"}, [])


def test_hit_at_k() -> None:
    assert hit_at_k(RANKING, ["D3:1", "D9:9"], 3) == 1.0
    assert hit_at_k(RANKING, ["D3:1", "D9:9"], 2) == 0.0
    assert hit_at_k([], ["D1:1"], 5) == 0.0


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [(["D1:1"], 1.0), (["D2:7"], 0.5), (["D1:2", "D3:1"], 1 / 3), (["D9:9"], 0.0)],
)
def test_reciprocal_rank(evidence: list[str], expected: float) -> None:
    assert reciprocal_rank(RANKING, evidence) == pytest.approx(expected)


def test_score_ranking_cuts_at_top_k() -> None:
    ranking = [{f"D1:{i}"} for i in range(1, 31)]
    scores = score_ranking(ranking, ["D1:3", "D1:25"])
    assert scores["R@2"] == 0.0
    assert scores["R@3"] == 0.5
    assert scores["R@20"] == 0.5  # D1:25 is past the first 20
    assert "R@21" not in scores
    assert scores["Hit@5"] == 1.0
    assert scores["MRR"] == pytest.approx(1 / 3)


def test_flatten_gives_every_source_its_own_slot() -> None:
    # a memory of three sources takes three slots; a turn met again is not counted twice
    ranking = [["D1:1"], ["D2:5", "D1:1", "D2:6"], ["D2:6"], ["D3:1"]]
    flat = flatten(ranking)
    assert flat == [frozenset({d}) for d in ("D1:1", "D2:5", "D2:6", "D3:1")]
    assert recall_at_k(flat, ["D3:1"], 3) == 0.0  # the generous rule found it at position 4
    assert recall_at_k(flat, ["D3:1"], 4) == 1.0
    assert recall_at_k([set(p) for p in ranking], ["D2:6"], 2) == 1.0
    assert recall_at_k(flat, ["D2:6"], 2) == 0.0


def test_rrf_fuses_by_rank_not_by_score() -> None:
    # sum of 1 / (k + rank): doc 2 is second in both rankings, docs 0 and 1 first in one
    # and last in the other, however far apart their scores were
    fused = rrf([[0, 2, 1], [1, 2, 0]], 3, k=1)
    np.testing.assert_allclose(fused, [1 / 2 + 1 / 4, 1 / 4 + 1 / 2, 1 / 3 + 1 / 3])
    np.testing.assert_allclose(rrf([[2, 0, 1]], 3, k=60), [1 / 62, 1 / 63, 1 / 61])
    hybrids = [b.name for b in BASELINES if b.retriever == "hybrid"]
    assert hybrids == [
        "BM25 + MiniLM (RRF) over `speaker (date): text`",
        "BM25 + MiniLM (RRF) over `speaker (date): text + caption`",
    ]


def test_evidence_recall() -> None:
    assert evidence_recall({"D1:1", "D1:2", "D7:7"}, ["D1:1", "D1:3"]) == 0.5
    assert evidence_recall(set(), ["D1:1"]) == 0.0


def test_context_coverage_items_memories_and_visible_text() -> None:
    texts = {
        "D1:1": "I went to a support group yesterday. It was powerful.",
        "D1:2": "We adopted a puppy named Oscar last weekend, he loves the beach and the snow!",
        "D1:3": "Yes!",  # too short to prove anything by text
        "D1:4": "Painting sunsets is how I relax after a long week at work.",
    }
    context = (
        "## Memories\nSupport (updated 2023-05-08 13:56)\n"
        "- We adopted a puppy named Oscar last weekend, he…\n\n"
        "## Recent turns\n[2023-05-08 13:56] Caroline (session 1): Yes!"
    )
    covered = context_coverage(context, ["D1:3"], [], texts)
    assert covered == {"D1:3", "D1:2"}  # the item, and the clipped fact copied from D1:2
    with_sources = context_coverage(context, ["D1:3"], ["D1:1", "D1:2"], texts)
    assert with_sources == {"D1:1", "D1:2", "D1:3"}
    assert "D1:4" not in with_sources
    assert shown(texts["D1:1"], "x  I went to a   support group\nyesterday. y")  # spacing ignored


def test_fill_budget_skips_what_does_not_fit_and_keeps_trying() -> None:
    costs = {"a": 300, "b": 400, "c": 200, "d": 10, "e": 0}
    assert fill_budget(["a", "b", "c", "d", "e"], costs, 512) == ["a", "c", "d"]
    assert fill_budget(["b", "a"], costs, 100) == []
    assert fill_budget(["d", "c"], costs, 210) == ["d", "c"]  # exactly the budget fits


def test_aggregate_groups_categories_and_keeps_adversarial_apart() -> None:
    questions = [
        Question("q1", "conv-1", "?", 1, ("D1:1",)),
        Question("q2", "conv-1", "?", 4, ("D1:1",)),
        Question("q3", "conv-1", "?", 5, ("D1:1",)),
    ]
    per = {"q1": {"R@10": 1.0}, "q2": {"R@10": 0.0}, "q3": {"R@10": 1.0}}
    summary = aggregate(per, questions)
    assert summary["1-4"] == {"n": 2.0, "R@10": 0.5}
    assert summary["5"] == {"n": 1.0, "R@10": 1.0}
    assert set(summary) == {"1-4", "1", "4", "5"}
    assert math.isnan(mean([]))


def test_bm25_okapi_by_hand() -> None:
    docs = [["apple", "pie"], ["apple", "apple", "tart", "crust"], ["banana"]]
    index = BM25(docs, k1=1.2, b=0.75)
    n, avgdl = 3, 7 / 3

    def weight(tf: float, df: int, dl: int) -> float:
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))

    scores = index.scores(["apple", "tart", "unknown"])
    expected = [weight(1, 2, 2), weight(2, 2, 4) + weight(1, 1, 4), 0.0]
    np.testing.assert_allclose(scores, expected)
    np.testing.assert_allclose(index.scores(["nothing"]), [0.0, 0.0, 0.0])
    assert index.scores(["banana"]).argmax() == 2


TURN = Turn(
    conversation_id="conv-26",
    session=3,
    dia_id="D3:4",
    speaker="Caroline",
    text="Look at this.",
    timestamp=datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
    session_date_time="1:56 pm on 8 May, 2023",
    turn_index=40,
    image_caption="a dog on a beach",
)


def test_turn_formats_and_event() -> None:
    assert format_turn(TURN, "text") == "Look at this."
    assert format_turn(TURN, "text + caption") == "Look at this. [shares a photo: a dog on a beach]"
    assert format_turn(TURN, "speaker (date): text") == "Caroline (8 May, 2023): Look at this."
    event = to_event(TURN)
    assert event.event_id == "conv-26:D3:4"
    assert dia_id_of(event.event_id) == "D3:4"
    assert (event.tenant_id, event.user_id, event.session_id) == ("demo", "conv-26", "3")
    assert event.ts == datetime(2023, 5, 8, 13, 56, 40, tzinfo=UTC)
    assert event.metadata.speaker == "Caroline"
    assert event.text.endswith("[shares a photo: a dog on a beach]")


def test_answer_tokens_share_of_the_answers_content_words_in_the_context() -> None:
    assert answer_words("7 May 2023") == {"7", "may", "2023"}
    assert answer_words("in August, the lake") == {"aug", "lake"}  # stop words out
    context = "[8 May 2023]\nCaroline: We went to the lake in Aug"
    assert answer_tokens(context, "the lake in August") == 1.0
    assert answer_tokens(context, "7 May 2023") == 2 / 3  # "7" is not there
    assert answer_tokens(context, "No") == 0.0  # stop words only: its plain words
    assert answer_tokens("no, never", "No") == 1.0
    assert answer_tokens(context, "") == 1.0
