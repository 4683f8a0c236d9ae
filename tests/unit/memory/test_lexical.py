"""The incremental BM25 index scores like one built from scratch, whatever the edit order."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.baselines import BM25
from memory.lexical import LexicalIndex, lexical_text, tokens_of

WORDS = ["parcel", "refund", "order", "a-10293", "late", "caroline", "paint", "lake", "退款"]
_doc = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None, database=None)
@given(
    docs=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), _doc, max_size=12),
    removed=st.sets(st.text("abcdefgh", min_size=1, max_size=3), max_size=4),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
)
def test_incremental_index_scores_like_a_fresh_okapi_bm25(
    docs: dict[str, list[str]], removed: set[str], query: list[str]
) -> None:
    index = LexicalIndex()
    for doc_id, tokens in docs.items():
        index.add(doc_id, ["stale"] * 3)  # replaced below: re-adding an id replaces it
        index.add(doc_id, tokens)
    for doc_id in removed:
        index.remove(doc_id)  # unknown ids are ignored
    kept = [d for d in docs if d not in removed]
    positions = {d: i for i, d in enumerate(kept)}
    got = index.scores(query, positions, len(kept))
    assert len(index) == len(kept)
    if not kept:
        return
    reference = BM25([docs[d] for d in kept]).scores(list(dict.fromkeys(query)))
    assert np.allclose(got, reference)
    for d in kept:  # an outside text with the same words scores like the indexed doc
        assert np.isclose(index.score_text(query, docs[d]), got[positions[d]])


def test_speaker_and_date_are_matched_like_words() -> None:
    ts = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    text = lexical_text("Caroline", ts, "I went to a support group")
    assert text == "Caroline (8 May 2023): I went to a support group"
    index = LexicalIndex()
    index.add("c", tokens_of(text))
    index.add("m", tokens_of(lexical_text("Melanie", ts, "I went to a pottery class")))
    scores = index.scores(tokens_of("What did Caroline do in May 2023?"), {"c": 0, "m": 1}, 2)
    assert scores[0] > scores[1]
