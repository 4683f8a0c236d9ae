"""One retrieval's ranking: everything gathered for a query in, the ranked items and the
context out.

``rpc.retrieval.Retriever`` does every read first (the query's vectors, the user's turns,
the memories found by vector and by key, the clusters) and hands them over as one
``Gathered`` value; ``rank_gathered`` then scores (``memory.candidates``), ranks and
budgets (``memory.ranking``) with no I/O and no clock: the same value always gives the
same answer, however long after it was gathered and whatever was written since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from memstream.memory.candidates import ShortTermMode, TurnRows, score_candidates
from memstream.memory.clustering import Cluster
from memstream.memory.excerpts import excerpt, question_terms
from memstream.memory.profile import NO_ATTRIBUTE
from memstream.memory.ranking import (
    Candidate,
    RankingParams,
    assemble_context,
    named_speakers,
    rank,
    strip_names,
)
from memstream.memory.render import memory_text
from memstream.schemas import ConsolidatedMemory


def turn_query(query: str, speakers: Sequence[str]) -> str:
    """What to embed against the user's turns: the query without the ``speakers`` it names.

    Turns are embedded without their speaker, who is matched apart (the speaker bonus, BM25
    over ``speaker (date): text``): a name left in the query only pulls the dense side
    toward turns that mention the person. The query itself when it names nobody."""
    named = named_speakers(query, speakers)
    return strip_names(query, named) if named else query


@dataclass(frozen=True)
class Gathered:
    """Every read of one retrieval, all done: the ranking's whole input.

    ``turns`` is a snapshot (``stores.turn_index.UserTurns``): later writes build a new one,
    so this value stays what it was when gathered."""

    query: str
    vector: np.ndarray  # the query's embedding (memories, clusters)
    turn_vector: np.ndarray  # the embedding of ``turn_query`` (turns)
    keys: tuple[str, ...]  # the query's lookup keys (``memory.text.lookup_keys``)
    keyed: tuple[ConsolidatedMemory, ...]  # memories found by those keys
    scored: tuple[tuple[ConsolidatedMemory, float], ...]  # found by vector, with their cosine
    turns: TurnRows
    clusters: tuple[Cluster, ...] | None  # None: not read (the flat mode needs none)
    now: datetime | None  # the request's; None: the user's newest event
    top_k: int
    budget_tokens: int
    # The standing attribute the query asks about by meaning (``memory.profile``).
    asked: int = NO_ATTRIBUTE


@dataclass(frozen=True)
class Ranked:
    """The best ``top_k`` that fit the budget, as laid out in ``context``."""

    items: tuple[tuple[Candidate, float], ...]  # in the context's order, with their scores
    context: str
    context_tokens: int


def rank_gathered(
    gathered: Gathered,
    params: RankingParams,
    *,
    count_tokens: Callable[[str], int],
    additive_lines: bool = False,
    render: Callable[[ConsolidatedMemory], str] = memory_text,
    short_term_candidates: int = 0,
    mode: ShortTermMode = "flat",
) -> Ranked:
    """Score every candidate ``gathered`` holds (``score_candidates``), keep the best
    ``top_k`` (``rank``) and lay out as many as fit ``budget_tokens`` (``assemble_context``;
    ``additive_lines``: ``count_tokens`` of a text is the sum of its lines')."""
    g = gathered
    candidates = score_candidates(
        g.query,
        g.vector,
        g.keys,
        g.turns,
        g.scored,
        g.keyed,
        g.clusters,
        top_k=g.top_k,
        now=g.now,
        turn_vector=g.turn_vector,
        params=params,
        short_term_candidates=short_term_candidates,
        mode=mode,
        render=render,
        asked=g.asked,
    )
    ranked = rank(candidates, g.top_k, exploration_share=params.exploration_share)
    if params.excerpt_over_tokens:
        terms = question_terms(g.query)
        ranked = [
            (_excerpted(c, terms, count_tokens, params.excerpt_over_tokens), score)
            for c, score in ranked
        ]
    context, used = assemble_context(
        ranked, g.budget_tokens, count_tokens, additive_lines=additive_lines
    )
    return Ranked(tuple(used), context, count_tokens(context) if context else 0)


def _excerpted(
    c: Candidate, terms: frozenset[str], count_tokens: Callable[[str], int], over_tokens: int
) -> Candidate:
    """``c`` with its excerpt, shown when the whole turn does not fit (a turn only)."""
    if c.kind != "turn" or c.whole:
        return c
    cut = excerpt(c.body or c.text, terms, count_tokens, over_tokens=over_tokens)
    if cut is None:
        return c
    return replace(c, excerpt=cut)
