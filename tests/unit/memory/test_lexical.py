"""The incremental BM25 index scores like one built from scratch, whatever the edit order."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.baselines import BM25
from memstream.memory.lexical import LexicalIndex, document_tokens, lexical_text, tokens_of

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


def _loop_scores(
    docs: dict[str, list[str]], query: list[str], positions: dict[str, int], size: int
) -> list[float]:
    """The per-posting Python loop ``LexicalIndex.scores`` replaced, over the documents
    themselves (the index's contents, as the test holds them), as the reference."""
    out = np.zeros(size, dtype=np.float64)
    if not docs:
        return out.tolist()
    k1, b = LexicalIndex.k1, LexicalIndex.b
    avg = sum(len(tokens) for tokens in docs.values()) / len(docs) or 1.0
    counts = {doc_id: Counter(tokens) for doc_id, tokens in docs.items()}
    for term in dict.fromkeys(query):
        df = sum(term in c for c in counts.values())
        if not df:
            continue
        idf = float(np.log(1.0 + (len(docs) - df + 0.5) / (df + 0.5)))
        for doc_id, c in counts.items():
            row = positions.get(doc_id)
            if term in c and row is not None:
                norm = k1 * (1.0 - b + b * float(len(docs[doc_id])) / avg)
                out[row] += idf * c[term] * (k1 + 1.0) / (c[term] + norm)
    return out.tolist()


@settings(max_examples=100, deadline=None, database=None)
@given(
    docs=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), _doc, max_size=16),
    edits=st.lists(st.tuples(st.text("abcdefgh", min_size=1, max_size=3), _doc), max_size=6),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
)
def test_vectorised_scores_are_the_loops_floats_through_edits(
    docs: dict[str, list[str]], edits: list[tuple[str, list[str]]], query: list[str]
) -> None:
    # Elementwise IEEE arithmetic in the same order: equal bits, not just close.
    index = LexicalIndex()
    for doc_id, tokens in docs.items():
        index.add(doc_id, tokens)
    ids = sorted(docs)
    positions = {d: i for i, d in enumerate(ids)}
    held = dict(docs)
    assert index.scores(query, positions, len(ids)).tolist() == _loop_scores(
        held, query, positions, len(ids)
    )
    for doc_id, tokens in edits:  # the same mapping object, the index edited under it
        if tokens:
            index.add(doc_id, tokens)
            held[doc_id] = tokens
        else:
            index.remove(doc_id)
            held.pop(doc_id, None)
        got = index.scores(query, positions, len(ids))
        assert got.tolist() == _loop_scores(held, query, positions, len(ids))
    # A new mapping (a new turn-index view) is read afresh: a subset, in another order.
    fresh = {d: i for i, d in enumerate(reversed(ids[::2]))}
    assert index.scores(query, fresh, len(fresh)).tolist() == _loop_scores(
        held, query, fresh, len(fresh)
    )


@settings(max_examples=100, deadline=None, database=None)
@given(
    docs=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), _doc, max_size=12),
    added=st.lists(st.tuples(st.text("abcdefgh", min_size=1, max_size=3), _doc), max_size=6),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
)
def test_with_docs_is_adding_to_a_copy(
    docs: dict[str, list[str]], added: list[tuple[str, list[str]]], query: list[str]
) -> None:
    """``with_docs`` scores as adding in place would, and the index it grew from scores as
    it did before (an id added again, a replacement, included)."""
    held = LexicalIndex()
    for doc_id, tokens in docs.items():
        held.add(doc_id, tokens)
    ids = sorted({*docs, *(d for d, _ in added)})
    positions = {d: i for i, d in enumerate(ids)}
    before = held.scores(query, positions, len(ids)).tolist()
    grown = held.with_docs(added)
    in_place = LexicalIndex()
    for doc_id, tokens in [*docs.items(), *added]:
        in_place.add(doc_id, tokens)
    assert grown.scores(query, positions, len(ids)).tolist() == (
        in_place.scores(query, positions, len(ids)).tolist()
    )
    assert held.scores(query, positions, len(ids)).tolist() == before
    assert len(held) == len(docs)


@settings(max_examples=100, deadline=None, database=None)
@given(
    docs=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), _doc, max_size=12),
    removed=st.sets(st.text("abcdefgh", min_size=1, max_size=3), max_size=4),
    terms=st.lists(st.sampled_from(WORDS), max_size=3),
)
def test_having_and_document_frequency_follow_the_documents(
    docs: dict[str, list[str]], removed: set[str], terms: list[str]
) -> None:
    index = LexicalIndex()
    index.add_all(docs.items())
    for doc_id in removed:
        index.remove(doc_id)
    kept = {d: tokens for d, tokens in docs.items() if d not in removed}
    expected = {d for d, tokens in kept.items() if all(t in tokens for t in terms)}
    assert index.having(terms) == (expected if terms else set())
    for term in WORDS:
        assert index.document_frequency(term) == sum(term in t for t in kept.values())


def test_a_document_is_tokenised_as_a_query_is_without_filling_the_memo() -> None:
    text = lexical_text("Caroline", datetime(2023, 5, 8, tzinfo=UTC), "Order A-10293 to Köln")
    kept = tokens_of.cache_info().currsize
    tokens = document_tokens(text)
    assert tokens_of.cache_info().currsize == kept  # read once: nothing kept
    assert tokens == tokens_of(text) == ("caroline", "8", "may", "2023", "order", "a-10293", "köln")
