"""The RPC's in-process index of a user's short-term turns: vectors, texts, BM25 postings.

Reading a user's turns from Redis per query (every embedding, then some texts) cost more
than everything else in a retrieval, and BM25 needs every turn's words. So each RPC process
keeps, per user it serves (LRU), what it last read, tagged with the user's turn version
(``RedisState.turns_version``, a fresh token on every write by ``memorize``). A query reads
that token (one small round trip); when it changed, only the turns added to the timeline
since are read, and those that left it are dropped (``LexicalIndex`` updates in place).

Deletions Redis makes silently are known in advance: a turn's TTL is set once, when
``memorize`` writes it, so the index reads it with the turn and leaves out expired turns
by the clock (``alive``), with no read per query. A forget deletes the version token with
everything else, so the next query re-syncs (to nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from memory.lexical import LexicalIndex, lexical_text, tokens_of
from memory.ranking import turn_text
from schemas import StoredTurn
from stores.redis_state import RedisState, TurnWithVector


@dataclass(frozen=True)
class UserTurns:
    """One consistent view of a user's turns, row for row. Replaced, never mutated, on sync
    (only ``lexical`` is shared and updated in place: score it before the next await)."""

    version: bytes | None
    ids: list[str]
    docs: list[StoredTurn]
    ts: npt.NDArray[np.float64]
    vectors: npt.NDArray[np.float32]  # (n, dim), unit norm
    lexical: LexicalIndex
    positions: dict[str, int] = field(default_factory=dict)
    speakers: list[str] = field(default_factory=list)  # speaker, else role
    texts: list[str] = field(default_factory=list)  # ``memory.ranking.turn_text``, rendered once
    speaker_of: npt.NDArray[np.object_] = field(default_factory=lambda: np.array([], object))
    speaker_names: tuple[str, ...] = ()  # distinct speakers
    by_entity: dict[str, list[int]] = field(default_factory=dict)  # normalised key -> rows
    expires_at: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))  # epoch s
    # On the timeline but already gone from Redis (expired): not asked for again, so a
    # long-lived user's dead ids do not cost every sync a read.
    missing: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls,
        version: bytes | None,
        rows: Sequence[TurnWithVector],
        lexical: LexicalIndex,
        dim: int,
        expires_at: Sequence[float] = (),
    ) -> UserTurns:
        docs = [r.turn for r in rows]
        by_entity: dict[str, list[int]] = {}
        for row, turn in enumerate(docs):
            for key in turn.entities:
                by_entity.setdefault(key, []).append(row)
        vectors = (
            np.stack([r.vector for r in rows]).astype(np.float32)
            if rows
            else np.zeros((0, dim), dtype=np.float32)
        )
        return cls(
            version=version,
            ids=[t.event_id for t in docs],
            docs=docs,
            ts=np.array([t.ts.timestamp() for t in docs], dtype=np.float64),
            vectors=vectors,
            lexical=lexical,
            positions={t.event_id: i for i, t in enumerate(docs)},
            speakers=[t.speaker or t.role for t in docs],
            texts=[turn_text(t) for t in docs],
            speaker_of=np.array([t.speaker or t.role for t in docs], dtype=object),
            speaker_names=tuple(sorted({t.speaker or t.role for t in docs})),
            by_entity=by_entity,
            expires_at=np.array(expires_at or [np.inf] * len(docs), dtype=np.float64),
        )

    def alive(self, now: float) -> npt.NDArray[np.intp]:
        """Rows whose TTL has not run out at ``now`` (epoch seconds)."""
        found: npt.NDArray[np.intp] = np.flatnonzero(self.expires_at > now)
        return found

    def rows(self) -> list[tuple[TurnWithVector, float]]:
        return [
            (TurnWithVector(t, v), float(e))
            for t, v, e in zip(self.docs, self.vectors, self.expires_at, strict=True)
        ]


def index_turn(lexical: LexicalIndex, turn: StoredTurn) -> None:
    text = lexical_text(turn.speaker or turn.role, turn.ts, turn.text)
    lexical.add(turn.event_id, tokens_of(text))


class TurnIndex:
    """Per-user ``UserTurns``, kept in sync with Redis incrementally; at most ``max_users``."""

    def __init__(self, state: RedisState, *, dim: int, max_users: int = 256) -> None:
        self.state = state
        self.dim = dim
        self.max_users = max_users
        self._users: OrderedDict[tuple[str, str], UserTurns] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.syncs = 0  # how many queries had to read turns (tests, benchmarks)

    async def get(self, tenant_id: str, user_id: str) -> UserTurns:
        key = (tenant_id, user_id)
        version = await self.state.turns_version(tenant_id, user_id)
        cached = self._users.get(key)
        if cached is not None and cached.version == version:
            self._users.move_to_end(key)
            return cached
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one sync per user at a time; the others reuse its result
            cached = self._users.get(key)
            if cached is not None and cached.version == version:
                return cached
            fresh = await self._sync(tenant_id, user_id, version, cached)
            self._users[key] = fresh
            self._users.move_to_end(key)
            while len(self._users) > self.max_users:
                old, _ = self._users.popitem(last=False)
                self._locks.pop(old, None)
            return fresh

    def evict(self, tenant_id: str, user_id: str) -> None:
        self._users.pop((tenant_id, user_id), None)

    async def _sync(
        self, tenant_id: str, user_id: str, version: bytes | None, cached: UserTurns | None
    ) -> UserTurns:
        self.syncs += 1
        lexical = cached.lexical if cached is not None else LexicalIndex()
        if version is None:  # nothing written, or forgotten
            return UserTurns.build(None, [], LexicalIndex(), self.dim)
        ids = await self.state.timeline_ids(tenant_id, user_id)
        known = cached.positions if cached is not None else {}
        missing = cached.missing if cached is not None else frozenset()
        added = [i for i in ids if i not in known and i not in missing]
        read_at = time.time()
        found, ttls = await asyncio.gather(
            self.state.turns(tenant_id, user_id, added),
            self.state.turn_ttls_ms(tenant_id, user_id, added),
        )
        expiry = {
            i: (np.inf if t == -1 else read_at + t / 1000) for i, t in zip(added, ttls, strict=True)
        }
        fetched = {r.turn.event_id: (r, expiry[r.turn.event_id]) for r in found}
        kept = {r.turn.event_id: (r, e) for r, e in cached.rows()} if cached is not None else {}
        wanted = set(ids)
        for dropped in [i for i in kept if i not in wanted]:
            lexical.remove(dropped)
            del kept[dropped]
        for turn_id, (row, expires) in fetched.items():
            index_turn(lexical, row.turn)
            kept[turn_id] = (row, expires)
        rows = [kept[i] for i in ids if i in kept]  # timeline order: oldest first
        fresh = UserTurns.build(
            version, [r for r, _ in rows], lexical, self.dim, [e for _, e in rows]
        )
        vanished = (missing | {i for i in added if i not in fetched}) & wanted
        return dataclasses.replace(fresh, missing=frozenset(vanished))
