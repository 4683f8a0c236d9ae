"""In-process fakes of the stores' interfaces, for unit tests of processors, workers and RPC.

Each keeps its interface's contract (``stores.short_term.ShortTermState``,
``stores.text_encoder.TextEncoder``): ``tests/contract/`` runs the same suite on a fake and
on its real adapter. The pure parts are the product's own: the hot tier is
``memory.hot_tier.evictions`` and clusters go through the same byte codecs as in Redis, so a
fake answers what Redis would, only without a server.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from memstream.memory.clustering import Cluster
from memstream.memory.hot_tier import evictions
from memstream.schemas import StoredTurn
from memstream.schemas.identity import user_key
from memstream.stores.codecs import (
    cluster_from_bytes,
    cluster_to_bytes,
    engine_from_bytes,
    engine_to_bytes,
    key_state_from_json,
    key_state_to_json,
    signal_from_bytes,
    signal_to_bytes,
)
from memstream.stores.short_term import (
    TurnWithVector,
    UserRead,
    UserSnapshot,
    UserUpdate,
    UserWrite,
)
from memstream.stores.text_encoder import FloatArray

DAY_S = 86_400


def _as_stored(vector: np.ndarray) -> np.ndarray:
    """float16 as the hot tier keeps it, read back as float32."""
    return np.asarray(vector, dtype=np.float16).astype(np.float32)


@dataclass
class _User:
    """One user's keys (what Redis holds under ``{tenant:user}``); values kept as bytes where
    Redis keeps bytes, so nothing a caller still holds aliases the stored state."""

    turns: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)  # doc JSON, vector
    timeline: dict[str, float] = field(default_factory=dict)
    pinned: set[str] = field(default_factory=set)
    leaving: set[str] = field(default_factory=set)
    pending: dict[str, bytes] = field(default_factory=dict)
    clusters: dict[str, bytes] = field(default_factory=dict)
    engine: bytes | None = None
    generation: str = ""
    version: int = 0
    tver: bytes | None = None
    tall: int = 0
    newest: float | None = None
    keys: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    done_triggers: set[str] = field(default_factory=set)
    event_triggers: dict[str, dict[str, bytes]] = field(default_factory=dict)
    reminders: set[str] = field(default_factory=set)
    heard: set[str] = field(default_factory=set)

    def key_count(self) -> int:
        """How many Redis keys this user's state occupies (what ``delete_user`` reports)."""
        hashes = (
            self.timeline,
            self.pinned,
            self.leaving,
            self.pending,
            self.clusters,
            self.keys,
            self.heard,
        )
        meta = self.tver is not None or self.engine is not None or self.tall > 0
        return (
            len(self.turns)
            + sum(1 for h in hashes if h)
            + int(meta)
            + len(self.seen)
            + len(self.done_triggers)
            + len(self.event_triggers)
            + len(self.reminders)
        )


class FakeShortTermState:
    """``ShortTermState`` in process dicts. Wall-clock TTLs of markers are not modelled
    (a unit test never outlives them); the event-time hot tier is, exactly."""

    def __init__(self, *, ttl_days: float = 7.0, max_turns: int = 2000) -> None:
        self.ttl_s = int(ttl_days * DAY_S)
        self.max_turns = max_turns
        self._users: dict[tuple[str, str], _User] = {}
        self._forgotten: dict[tuple[str, str], float] = {}
        self.applied = 0  # how many updates were applied (assertions on writes)

    def _user(self, tenant_id: str, user_id: str) -> _User:
        return self._users.setdefault((tenant_id, user_id), _User())

    def _peek(self, tenant_id: str, user_id: str) -> _User:
        """The user's state without creating it (readers never make a user appear)."""
        return self._users.get((tenant_id, user_id)) or _User()

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    async def load_user(self, tenant_id: str, user_id: str, event_id: str) -> UserSnapshot:
        [snapshot] = await self.load_users([UserRead(tenant_id, user_id, (event_id,))])
        return snapshot

    async def load_users(self, reads: Sequence[UserRead]) -> list[UserSnapshot]:
        return [self._snapshot(r) for r in reads]

    def _snapshot(self, read: UserRead) -> UserSnapshot:
        tenant_id, user_id = read.tenant_id, read.user_id
        u = self._peek(tenant_id, user_id)
        clusters = None
        if u.generation and u.engine is not None:
            decoded = sorted((cluster_from_bytes(b) for b in u.clusters.values()), key=_order)
            clusters = engine_from_bytes(u.engine, tuple(decoded))
        pending = sorted(
            (signal_from_bytes(b) for b in u.pending.values()), key=lambda p: (p.ts, p.event_id)
        )
        return UserSnapshot(
            processed=frozenset(e for e in read.event_ids if e in u.seen),
            heard=frozenset(p for p in read.phrases if p in u.heard),
            clusters=clusters,
            pending=pending,
            keys={name: key_state_from_json(v) for name, v in u.keys.items()},
            cluster_version=(u.generation, u.version),
            forgotten_at=self._forgotten.get((tenant_id, user_id)),
        )

    async def apply(self, tenant_id: str, user_id: str, update: UserUpdate) -> None:
        u = self._user(tenant_id, user_id)
        turn = update.turn
        ts = turn.ts.timestamp()
        oldest = sorted(u.timeline.items(), key=lambda e: (e[1], e[0]))
        already = turn.event_id in u.timeline
        hot = evictions(
            oldest,
            len(oldest),
            u.pinned,
            (turn.event_id, ts, turn.pinned),
            u.newest,
            self.ttl_s,
            self.max_turns,
            already=already,
        )
        u.turns[turn.event_id] = (turn.model_dump_json(), _as_stored(update.vector))
        if hot.keep_new:
            u.timeline[turn.event_id] = ts
            if turn.pinned:
                u.pinned.add(turn.event_id)
        else:
            u.leaving.add(turn.event_id)
        for gone in hot.evicted:  # readable until the archive worker releases it
            u.timeline.pop(gone, None)
            u.pinned.discard(gone)
            u.leaving.add(gone)
        u.tver = uuid.uuid4().hex.encode()
        u.newest = hot.newest
        if not already:
            u.tall += 1
        if update.pending_add is not None:
            u.pending[turn.event_id] = signal_to_bytes(update.pending_add)
        for event_id in update.pending_remove:
            u.pending.pop(event_id, None)
        state = update.clusters
        if state is not None:
            for c in (state.cluster(i) for i in update.clusters_changed):
                if c is not None:
                    u.clusters[c.cluster_id] = cluster_to_bytes(c)
            for cluster_id in update.clusters_removed:
                u.clusters.pop(cluster_id, None)
            u.engine = engine_to_bytes(state)
            u.generation = update.cluster_version[0] or uuid.uuid4().hex
            u.version += 1
        for name, key_state in update.keys.items():
            u.keys[name] = key_state_to_json(key_state)
        u.heard.update(update.heard)
        if update.triggers:
            u.event_triggers.setdefault(update.event_id, {}).update(update.triggers)
        u.seen.add(update.event_id)
        self.applied += 1

    async def apply_users(self, writes: Sequence[UserWrite]) -> None:
        # One by one, as the contract says it equals; the user's updates share one cluster
        # generation, as in one Redis transaction.
        users = [(w.tenant_id, w.user_id) for w in writes if w.updates]
        if len(set(users)) != len(users):
            raise ValueError("apply_users: a user appears in more than one UserWrite")
        for w in writes:
            generation = next(
                (u.cluster_version[0] for u in w.updates if u.clusters is not None), ""
            )
            generation = generation or uuid.uuid4().hex
            for update in w.updates:
                version = (generation, update.cluster_version[1])
                await self.apply(w.tenant_id, w.user_id, replace(update, cluster_version=version))

    async def remember_event_triggers(
        self, tenant_id: str, user_id: str, event_id: str, triggers: dict[str, bytes]
    ) -> None:
        held = self._user(tenant_id, user_id).event_triggers.setdefault(event_id, {})
        held.update(triggers)

    async def open_event_triggers(self, tenant_id: str, user_id: str, event_id: str) -> list[bytes]:
        u = self._peek(tenant_id, user_id)
        held = u.event_triggers.get(event_id, {})
        return [held[t] for t in sorted(held) if t not in u.done_triggers]

    async def turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[TurnWithVector]:
        u = self._peek(tenant_id, user_id)
        found = [u.turns[i] for i in event_ids if i in u.turns]
        return [TurnWithVector(StoredTurn.model_validate_json(d), v.copy()) for d, v in found]

    async def clusters(self, tenant_id: str, user_id: str) -> list[Cluster]:
        u = self._peek(tenant_id, user_id)
        return sorted((cluster_from_bytes(b) for b in u.clusters.values()), key=_order)

    async def member_vectors(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> dict[str, np.ndarray]:
        u = self._peek(tenant_id, user_id)
        return {i: u.turns[i][1].copy() for i in event_ids if i in u.timeline and i in u.turns}

    async def trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> bool:
        return trigger_id in self._peek(tenant_id, user_id).done_triggers

    async def mark_trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> None:
        self._user(tenant_id, user_id).done_triggers.add(trigger_id)

    async def claim_reminder(
        self, tenant_id: str, user_id: str, reminder_id: str, ttl_s: float
    ) -> bool:
        held = self._user(tenant_id, user_id).reminders
        if reminder_id in held:
            return False
        held.add(reminder_id)
        return True

    async def release_reminder(self, tenant_id: str, user_id: str, reminder_id: str) -> None:
        self._user(tenant_id, user_id).reminders.discard(reminder_id)

    async def users(self) -> list[tuple[str, str]]:
        # Listed once memorize wrote for them (Redis: SADD before the user's transaction).
        return sorted(
            (p for p, s in self._users.items() if s.tall or s.seen), key=lambda p: user_key(*p)
        )

    async def count_turns(self, tenant_id: str, user_id: str) -> int:
        return await self.turns_written(tenant_id, user_id) or await self.count_hot_turns(
            tenant_id, user_id
        )

    async def count_hot_turns(self, tenant_id: str, user_id: str) -> int:
        return len(self._peek(tenant_id, user_id).timeline)

    async def turns_written(self, tenant_id: str, user_id: str) -> int:
        return self._peek(tenant_id, user_id).tall

    async def newest_events(self, users: Sequence[tuple[str, str]]) -> list[float | None]:
        return [self._peek(tenant_id, user_id).newest for tenant_id, user_id in users]

    async def memorized(self, tenant_id: str, user_id: str, event_id: str) -> bool:
        return event_id in self._peek(tenant_id, user_id).seen

    async def memorized_many(self, events: Sequence[tuple[str, str, str]]) -> list[bool]:
        return [event_id in self._peek(t, u).seen for t, u, event_id in events]

    async def turns_version(self, tenant_id: str, user_id: str) -> bytes | None:
        return self._peek(tenant_id, user_id).tver

    async def turns_state(self, tenant_id: str, user_id: str) -> tuple[bytes | None, int]:
        u = self._peek(tenant_id, user_id)
        return u.tver, u.tall

    async def timeline_since(self, tenant_id: str, user_id: str, ts: float) -> list[str]:
        timeline = self._peek(tenant_id, user_id).timeline
        return [i for i, t in sorted(timeline.items(), key=lambda e: (e[1], e[0])) if t >= ts]

    async def timeline_ids(self, tenant_id: str, user_id: str) -> list[str]:
        timeline = self._peek(tenant_id, user_id).timeline
        return [i for i, _ in sorted(timeline.items(), key=lambda e: (e[1], e[0]))]

    async def leaving(self, users: Sequence[tuple[str, str]]) -> list[list[str]]:
        return [sorted(self._peek(tenant_id, user_id).leaving) for tenant_id, user_id in users]

    async def release_archived(self, tenant_id: str, user_id: str, event_ids: Sequence[str]) -> int:
        u = self._peek(tenant_id, user_id)
        released = [i for i in dict.fromkeys(event_ids) if i in u.leaving]
        for event_id in released:
            u.leaving.discard(event_id)
            if event_id not in u.timeline:
                u.turns.pop(event_id, None)
        return len(released)

    async def mark_forgotten(self, tenant_id: str, user_id: str, at: float) -> None:
        key = (tenant_id, user_id)
        old = self._forgotten.get(key)
        if old is None or old < at:
            self._forgotten[key] = at

    async def forgotten_at(self, tenant_id: str, user_id: str) -> float | None:
        return self._forgotten.get((tenant_id, user_id))

    async def clear_forgotten(self, tenant_id: str, user_id: str) -> bool:
        return self._forgotten.pop((tenant_id, user_id), None) is not None

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        gone = self._users.pop((tenant_id, user_id), None)
        return gone.key_count() if gone is not None else 0


def _order(c: Cluster) -> tuple[int, float]:
    """The engine's creation order (as ``stores.redis_state`` sorts clusters)."""
    digits = c.cluster_id.lstrip("c")
    return (int(digits) if digits.isdigit() else -1, c.created_ts)


_WORD = re.compile(r"\w+|[^\w\s]")


class HashEncoder:
    """A deterministic ``TextEncoder``: each lower-cased word adds a signed hash direction,
    so texts that share words are close and anything else is near-orthogonal. No model, no
    threads; the same text gives the same vector in any process (blake2b, not ``hash``)."""

    counts_by_line = True  # a token never spans whitespace
    runners = 1

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.model_id = f"hash-{dim}"
        self.calls = 0  # encode calls (tests of batching and caching)

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray:
        if isinstance(texts, str):
            raise TypeError("encode() takes a sequence of texts, not a single str")
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._vector(text)
        return out

    def _vector(self, text: str) -> FloatArray:
        v = np.zeros(self.dim, dtype=np.float64)
        for word in [w.lower() for w in _WORD.findall(text)] or [""]:
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            slot = int.from_bytes(digest[:4], "little") % self.dim
            v[slot] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(v))
        if norm == 0.0:  # every word cancelled out: still a unit vector
            v[0], norm = 1.0, 1.0
        return (v / norm).astype(np.float32)

    def count_tokens(self, text: str) -> int:
        return len(_WORD.findall(text))

    def close(self) -> None:
        return None
