"""Final ranking of retrieval candidates and the layered, token-budgeted context.

The retrieval RPC gathers candidates (long-term memories from Qdrant, short-term turns from
the selected clusters, exact key matches), turns each into a ``Candidate`` and calls
``rank`` then ``assemble_context``. Both are pure and deterministic.

Score = relevance x strength. Relevance is whatever similarity the caller measured (higher
is better, e.g. cosine in [0, 1]); strength is the memory's use-and-decay weight (1.0 for
raw turns unless the caller says otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from schemas import ConsolidatedMemory, StoredTurn

MEMORIES_HEADER = "## Memories"
TURNS_HEADER = "## Recent turns"
_TIME = "%Y-%m-%d %H:%M"


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

    @property
    def score(self) -> float:
        return self.relevance * self.strength


def rank(candidates: Sequence[Candidate], top_k: int) -> list[tuple[Candidate, float]]:
    """The best ``top_k`` candidates by relevance x strength, best first.

    A turn whose event id is a source of a memory that made the cut is dropped, and the
    next candidate takes its place. Ties break by kind (memories first), newer first, then
    id, so the order never depends on the input order.
    """
    if top_k <= 0:
        return []
    ordered = sorted(
        candidates,
        key=lambda c: (-c.score, c.kind != "memory", -c.ts.timestamp(), c.id),
    )
    covered: set[str] = set()
    while True:
        # Dropping a covered turn can only pull more memories into the top: coverage grows
        # monotonically, so this reaches its fixed point in a few passes.
        top = [c for c in ordered if c.kind == "memory" or c.id not in covered][:top_k]
        now_covered = {e for c in top if c.kind == "memory" for e in c.source_event_ids}
        if now_covered == covered:
            return [(c, c.score) for c in top]
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
) -> tuple[str, list[tuple[Candidate, float]]]:
    """The layered context and the items it holds, never over ``budget_tokens``.

    Memories come first, best score first, under ``## Memories``; then turns in time order
    under ``## Recent turns``. Items are admitted best score first; one that does not fit
    is skipped and smaller ones are still tried. Every admission re-counts the whole
    rendered string (headers and separators included), so the bound holds for any counter.
    """
    by_score = sorted(ranked, key=lambda item: -item[1])  # stable: keeps the ranking's ties
    chosen: list[tuple[Candidate, float]] = []
    context = ""
    for item in by_score:
        trial = _render([*chosen, item])
        if count_tokens(trial) <= budget_tokens:
            chosen.append(item)
            context = trial
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
