"""Final ranking of retrieval candidates and the layered, token-budgeted context.

The retrieval RPC gathers candidates (long-term memories from Qdrant, short-term turns from
the selected clusters, exact key matches), turns each into a ``Candidate`` and calls
``rank`` then ``assemble_context``. Both are pure and deterministic.

Score = relevance x strength factor x boost. Relevance is whatever the caller measured
(higher is better, in [0, 1]): ``fused_relevance`` turns a dense and a lexical score into one.
Strength is the memory's use-and-decay weight (1.0 for raw turns); it enters through
``strength_factor``, bounded to [1 - span, 1 + span], so a much-used memory cannot outrank
a far more relevant turn. ``boost`` carries recency when the query asks for the latest.

Fusion, measured on LoCoMo-dev (231 answerable questions, MiniLM over the turn's words,
BM25 over ``speaker (date): text``, a 0.15 cosine bonus for the speaker the question names):
R@5 / R@10 / R@20 0.554 / 0.661 / 0.752 with z-score fusion (weights 0.5 / 0.5) against
0.493 / 0.597 / 0.684 with reciprocal rank fusion (k = 60). RRF does best at k = 10 when the
dense side embeds ``speaker (date): text`` (0.564 / 0.675 / 0.744), which the pipeline does
not store: it embeds the turn's words, for clustering and recurrence too. BM25 alone
0.524 / 0.582 / 0.648, dense alone 0.164 / 0.251 / 0.404. RRF throws away how
far ahead a score is; z-scores keep it, and a lone dense or lexical standout survives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np
import numpy.typing as npt

from schemas import ConsolidatedMemory, StoredTurn

MEMORIES_HEADER = "## Memories"
TURNS_HEADER = "## Recent turns"
_TIME = "%Y-%m-%d %H:%M"

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RankingParams:
    """The knobs of hybrid ranking; defaults are the measured ones (see the module doc)."""

    dense_weight: float = 0.5  # lexical gets the rest
    speaker_bonus: float = 0.15  # cosine units, for a turn whose speaker the query names
    strength_span: float = 0.25  # strength moves a score by at most this share either way
    exploration_share: float = 0.05  # of top_k, for mid-strength recent memories
    recency_half_life_days: float = 30.0  # when the query asks for the latest


def zscores(values: npt.ArrayLike) -> FloatArray:
    """(x - mean) / std; all zeros when the values do not vary (nothing to tell apart)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    std = float(x.std())
    if std < 1e-12:
        return np.zeros_like(x)
    out: FloatArray = (x - float(x.mean())) / std
    return out


def fused_relevance(
    dense: npt.ArrayLike, lexical: npt.ArrayLike, dense_weight: float = 0.5
) -> FloatArray:
    """One relevance in (0, 1) per candidate from its dense and lexical scores.

    Each score is standardised over the candidate pool, mixed by weight, and squashed by the
    logistic function, which keeps the order and makes the result a valid ``relevance``.
    """
    mixed = dense_weight * zscores(dense) + (1.0 - dense_weight) * zscores(lexical)
    out: FloatArray = 1.0 / (1.0 + np.exp(-mixed))
    return out


def strength_factor(strength: float, span: float = 0.25) -> float:
    """1 + span * tanh(ln strength): 1 at strength 1, never outside [1 - span, 1 + span].

    Strength grows x1.2 per use without bound; left raw, a memory used often beats every
    turn whatever the question (measured: strength 3-5 memories led every LoCoMo ranking).
    """
    if strength <= 0:
        return 1.0 - span
    return 1.0 + span * math.tanh(math.log(strength))


_LATEST = re.compile(
    r"\b(?:latest|newest|most recent(?:ly)?|recently|current(?:ly)?|right now|these days"
    r"|last time|any update|still)\b|最近|最新|目前|现在",
    re.IGNORECASE,
)


def asks_for_latest(query: str) -> bool:
    """Whether the query asks what is newest ("latest", "currently", "最近"), not "last year"."""
    return _LATEST.search(query) is not None


def recency_factor(ts: datetime, newest: datetime, half_life_days: float) -> float:
    """In [0.5, 1]: halves the distance to 0.5 every half-life before the newest candidate.

    Measured from the newest candidate, not the wall clock: the question is which of the
    user's own memories is latest, however long ago the user last spoke.
    """
    age_days = max(0.0, (newest - ts).total_seconds() / 86_400)
    return 0.5 + 0.5 * math.pow(0.5, age_days / max(half_life_days, 1e-9))


def named_speakers(query: str, speakers: Sequence[str]) -> set[str]:
    """Which of ``speakers`` the query names as a whole word (case-insensitive)."""
    lowered = query.lower()
    found = set()
    for name in set(speakers):
        if name and re.search(rf"(?<!\w){re.escape(name.lower())}(?!\w)", lowered):
            found.add(name)
    return found


@dataclass(frozen=True)
class Candidate:
    """One thing that may go into the context: a consolidated memory or a raw turn.

    For a turn, ``id`` is its event id; for a memory, ``source_event_ids`` are the turns it
    was consolidated from (a turn a chosen memory already covers is not shown twice).
    """

    kind: Literal["memory", "turn"]
    id: str
    text: str
    relevance: float
    strength: float
    ts: datetime
    source_event_ids: tuple[str, ...] = ()
    boost: float = 1.0  # recency, when the query asks for the latest
    strength_span: float = 0.25

    @property
    def score(self) -> float:
        return self.relevance * strength_factor(self.strength, self.strength_span) * self.boost


def rank(
    candidates: Sequence[Candidate], top_k: int, *, exploration_share: float = 0.0
) -> list[tuple[Candidate, float]]:
    """The best ``top_k`` candidates by score, best first.

    A turn whose event id is a source of a memory that made the cut is dropped, and the
    next candidate takes its place. Ties break by kind (memories first), newer first, then
    id, so the order never depends on the input order.

    Exploration: ``int(top_k * exploration_share)`` of the last places go to memories the
    score alone left out -- mid strength (factor within the middle half of its span), at
    least median relevance, newest first -- so a memory that has not been used yet can earn
    its boosts. Deterministic: the same candidates always give the same answer.
    """
    if top_k <= 0:
        return []
    ordered = sorted(
        candidates,
        key=lambda c: (-c.score, c.kind != "memory", -c.ts.timestamp(), c.id),
    )
    explore = min(int(top_k * exploration_share), top_k)
    top = _top(ordered, top_k - explore)
    if explore:
        taken = {c.id for c in top}
        relevances = sorted(c.relevance for c in ordered)
        median = relevances[len(relevances) // 2] if relevances else 0.0
        newcomers = sorted(
            (
                c
                for c in ordered
                if c.kind == "memory"
                and c.id not in taken
                and c.relevance >= median
                and abs(strength_factor(c.strength, c.strength_span) - 1.0) <= c.strength_span / 2
            ),
            key=lambda c: (-c.ts.timestamp(), c.id),
        )
        top = _top([*top, *newcomers[:explore], *ordered], top_k)
    return [(c, c.score) for c in top]


def _top(ordered: Sequence[Candidate], k: int) -> list[Candidate]:
    """The first ``k`` of ``ordered`` (distinct ids) once turns covered by chosen memories go."""
    unique: dict[str, Candidate] = {}
    for c in ordered:
        unique.setdefault(c.id, c)
    covered: set[str] = set()
    while True:
        # Dropping a covered turn can only pull more memories into the top: coverage grows
        # monotonically, so this reaches its fixed point in a few passes.
        top = [c for c in unique.values() if c.kind == "memory" or c.id not in covered][:k]
        now_covered = {e for c in top if c.kind == "memory" for e in c.source_event_ids}
        if now_covered == covered:
            return top
        covered = now_covered


def memory_text(m: ConsolidatedMemory) -> str:
    """A compact rendering, one line each: title, status, facts, open actions with due."""
    lines = [f"{_line(m.title)} (updated {m.updated_at.strftime(_TIME)})"]
    if m.status:
        lines.append(f"Status: {_line(m.status)}")
    lines.extend(f"- {_line(f.text)}" for f in m.facts)
    for a in m.open_actions:
        due = f" (due {a.due.strftime(_TIME)})" if a.due is not None else ""
        lines.append(f"- Open: {_line(a.text)}{due}")
    return "\n".join(lines)


def turn_text(t: StoredTurn) -> str:
    """``[2026-11-03 14:05] customer (session s2): text`` — the speaker if known, else role."""
    return (
        f"[{t.ts.strftime(_TIME)}] {t.speaker or t.role} (session {t.session_id}): {_line(t.text)}"
    )


def assemble_context(
    ranked: Sequence[tuple[Candidate, float]],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    additive_lines: bool = False,
) -> tuple[str, list[tuple[Candidate, float]]]:
    """The layered context and the items it holds, never over ``budget_tokens``.

    Memories come first, best score first, under ``## Memories``; then turns in time order
    under ``## Recent turns``. Items are admitted best score first; one that does not fit
    is skipped and smaller ones are still tried. Every admission re-counts the whole
    rendered string (headers and separators included), so the bound holds for any counter.

    ``additive_lines``: the caller vouches that a text's count is the sum of its lines'
    counts (BERT's WordPiece: no token spans a newline). Then each item is counted once
    and the admissions are the same without re-rendering; the final context is still
    counted whole, and the plain path runs if that ever disagrees.
    """
    by_score = sorted(ranked, key=lambda item: -item[1])  # stable: keeps the ranking's ties
    if additive_lines:
        fast = _assemble_additive(by_score, budget_tokens, count_tokens)
        if fast is not None:
            return fast
    chosen: list[tuple[Candidate, float]] = []
    context = ""
    for item in by_score:
        trial = _render([*chosen, item])
        if count_tokens(trial) <= budget_tokens:
            chosen.append(item)
            context = trial
    return context, _layered(chosen)


def _assemble_additive(
    by_score: Sequence[tuple[Candidate, float]],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> tuple[str, list[tuple[Candidate, float]]] | None:
    headers = {"memory": count_tokens(MEMORIES_HEADER), "turn": count_tokens(TURNS_HEADER)}
    chosen: list[tuple[Candidate, float]] = []
    opened: set[str] = set()
    used = 0
    for item in by_score:
        kind = item[0].kind
        cost = count_tokens(item[0].text.strip()) + (0 if kind in opened else headers[kind])
        if used + cost <= budget_tokens:
            chosen.append(item)
            opened.add(kind)
            used += cost
    context = _render(chosen)
    if count_tokens(context) != used:
        return None  # the counter is not additive after all: take the plain path
    return context, _layered(chosen)


def _layered(items: Sequence[tuple[Candidate, float]]) -> list[tuple[Candidate, float]]:
    memories = sorted((i for i in items if i[0].kind == "memory"), key=lambda i: -i[1])
    turns = sorted((i for i in items if i[0].kind == "turn"), key=lambda i: (i[0].ts, i[0].id))
    return [*memories, *turns]


def _render(items: Sequence[tuple[Candidate, float]]) -> str:
    layered = _layered(items)
    memories = [c.text.strip() for c, _ in layered if c.kind == "memory"]
    turns = [c.text.strip() for c, _ in layered if c.kind == "turn"]
    sections = []
    if memories:
        sections.append(MEMORIES_HEADER + "\n" + "\n\n".join(memories))
    if turns:
        sections.append("\n".join([TURNS_HEADER, *turns]))
    return "\n\n".join(sections)


def _line(text: str) -> str:
    return " ".join(text.split())
