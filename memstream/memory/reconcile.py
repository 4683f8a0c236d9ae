"""Read-time reconciliation: a memory shown to a bot is never read before a newer statement.

A memory changes when recurrence fires and a consolidator folds its turns in; the stream
moves on in between ("the refund was issued", "the parcel is stuck at a hub"). So when the
RPC shows a memory, the newest conversation about the memory's keys that came after it --
the turns of the newest session that named one of its keys (an order number, an email),
and the newer turns close in meaning to one of its sources ("my parcel turned up", "the
refund was issued": whatever the wording), newer than the memory's newest source -- competes
for the context as turns as relevant as the memory (``memory.candidates``), and turns are
listed newest first, above any memory older than them (``memory.ranking``). Not a whole session:
one chat often moves on to another order (measured on the customer-service benchmark's
development half: the turns around a named key added unrelated lines and no current value).
Pure: the caller passes the user's turns as the RPC's turn index holds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.schemas import StoredTurn

MAX_LATEST = 6  # newer rows a memory brings in: one session rarely says more
NEWEST_ROWS = 512  # how far back from the newest turn a conversation is looked for
# all-MiniLM-L6-v2 cosines, measured: an address or a refund restated with other words
# 0.65-0.73, a phone 0.61; statements about different things 0.1-0.2.
LIKE_COSINE = 0.6


class KeyedTurns(Protocol):
    """The parts of the RPC's turn index read here (rows in time order)."""

    @property
    def docs(self) -> list[StoredTurn]: ...
    @property
    def ts(self) -> npt.NDArray[np.float64]: ...
    @property
    def salient(self) -> npt.NDArray[np.bool_]: ...
    @property
    def by_entity(self) -> dict[str, list[int]]: ...


def newer_conversation(keys: Sequence[str], since: datetime, turns: KeyedTurns) -> list[int]:
    """Rows, newest first, of the newest conversation naming ``keys`` after ``since``: the
    turns of the newest session that named one of them (stamped after ``since``) that name
    one, at most ``MAX_LATEST``. Empty when the memory is as new as the stream (or none of
    its keys was named since)."""
    start = _first_after(since, turns)
    named = sorted({r for k in keys for r in turns.by_entity.get(k, ()) if r >= start})
    if not named:
        return []
    session = turns.docs[named[-1]].session_id
    return [r for r in reversed(named) if turns.docs[r].session_id == session][:MAX_LATEST]


def newer_like_sources(
    sources: Sequence[int],
    since: datetime,
    turns: KeyedTurns,
    vectors: npt.NDArray[np.float32],
    min_cosine: float = LIKE_COSINE,
) -> list[int]:
    """Rows, newest first, stamped after ``since`` that say something about what the memory's
    ``sources`` (rows) said: salient, and at least ``min_cosine`` like one of them (in the
    newest ``NEWEST_ROWS``; at most ``MAX_LATEST``). "The refund was issued" after "the
    refund is pending", "we moved, the new address is ..." after the old address: whatever
    the words, a statement that close in meaning is the same thing said again, newer."""
    size, start = len(turns.docs), _first_after(since, turns)
    if start >= size or not sources:
        return []
    later = np.arange(start, size)[turns.salient[start:]]
    if not later.size:
        return []
    like = (vectors[later] @ vectors[np.asarray(sources)].T).max(axis=1) >= min_cosine
    return [int(r) for r in later[like][::-1][:MAX_LATEST]]


def _first_after(since: datetime, turns: KeyedTurns) -> int:
    """The first row stamped after ``since``, within the newest ``NEWEST_ROWS``."""
    after = int(np.searchsorted(turns.ts, since.timestamp(), side="right"))
    return max(after, len(turns.docs) - NEWEST_ROWS)
