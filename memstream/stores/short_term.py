"""The short-term state's interface: what memorize, the workers and the RPC need of Redis,
and the values it reads and writes (``UserSnapshot``, ``UserUpdate``, ...).

``stores.redis_state.RedisState`` is the adapter (one Redis-protocol server or a Redis
Cluster); ``tests/fakes.py``'s ``FakeShortTermState`` keeps the same state in process dicts for
unit tests. ``tests/contract/test_short_term_contract.py`` runs one suite on both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from memstream.memory.clustering import Cluster, ClusterState
from memstream.memory.recurrence import KeyState, TurnSignal
from memstream.schemas import StoredTurn
from memstream.stores.codecs import (
    decode_signal,
    key_state_from_json,
    key_state_to_json,
    signal_to_bytes,
)


@dataclass(frozen=True)
class TurnWithVector:
    turn: StoredTurn
    vector: np.ndarray  # float32, unit norm (restored from float16)


@dataclass(frozen=True)
class UserRead:
    """What ``load_users`` is asked of one user: which of ``event_ids`` were processed, and
    which of ``phrases`` are in the user's heard set."""

    tenant_id: str
    user_id: str
    event_ids: Sequence[str] = ()
    phrases: Sequence[str] = ()


@dataclass(frozen=True)
class UserSnapshot:
    """What ``memorize`` reads before it handles a user's events."""

    clusters: ClusterState | None  # None: the user has no clustering state yet
    pending: list[TurnSignal]  # oldest first
    keys: dict[str, KeyState]
    cluster_version: tuple[str, int] = ("", 0)  # (generation, version) the state was read at
    forgotten_at: float | None = None  # the user was forgotten then: older events are dropped
    processed: frozenset[str] = frozenset()  # of the event ids asked, those already applied
    heard: frozenset[str] = frozenset()  # of the phrases asked, those in the heard set

    @property
    def already_processed(self) -> bool:
        """Whether an event asked for (``load_user``: the one) was applied already."""
        return bool(self.processed)


@dataclass
class UserUpdate:
    """Everything ``memorize`` writes for one event, applied atomically."""

    event_id: str
    turn: StoredTurn
    vector: np.ndarray
    pending_add: TurnSignal | None = None
    pending_remove: Sequence[str] = ()  # consumed by a trigger, or fallen out of the window
    clusters: ClusterState | None = None  # the user's new clustering state, if it changed
    clusters_changed: Sequence[str] = ()  # cluster ids to (re)write
    clusters_removed: Sequence[str] = ()  # cluster ids merged away
    cluster_version: tuple[str, int] = ("", 0)  # the snapshot's, handed back
    keys: dict[str, KeyState] = field(default_factory=dict)
    heard: Sequence[str] = ()  # phrases the user heard from the assistant (a set: no TTL)
    # Trigger id -> payload this event emitted, kept like ``remember_event_triggers`` (in the
    # event's transaction: a duplicate replay finds them exactly when the event is marked).
    triggers: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class UserWrite:
    """One user's updates of a batch, in event order, for ``apply_users``."""

    tenant_id: str
    user_id: str
    updates: Sequence[UserUpdate]


def snapshot_after(snapshot: UserSnapshot, update: UserUpdate) -> UserSnapshot:
    """What ``load_users`` would read (asked the same) once ``update`` is applied.

    memorize chains a user's events of one batch through it instead of re-reading Redis,
    so values go through the stored form exactly as a read would give them back (pending
    vectors in float16, keys through their JSON).
    """
    pending = {p.event_id: p for p in snapshot.pending}
    if update.pending_add is not None:
        pending[update.turn.event_id] = decode_signal(signal_to_bytes(update.pending_add))
    for event_id in update.pending_remove:
        pending.pop(event_id, None)
    keys = dict(snapshot.keys)
    for name, state in update.keys.items():
        keys[name] = key_state_from_json(key_state_to_json(state))
    generation, version = snapshot.cluster_version
    clusters = snapshot.clusters
    if update.clusters is not None:
        clusters, version = update.clusters, version + 1
    return replace(
        snapshot,
        clusters=clusters,
        pending=sorted(pending.values(), key=lambda p: (p.ts, p.event_id)),
        keys=keys,
        cluster_version=(generation, version),
        processed=snapshot.processed | {update.event_id},
        heard=snapshot.heard | frozenset(update.heard),
    )


class MemorizeState(Protocol):
    """What the ``memorize`` processor, a user's one writer, reads and writes: snapshots in,
    one transaction per user out (the rules are ``ShortTermState``'s)."""

    async def load_user(self, tenant_id: str, user_id: str, event_id: str) -> UserSnapshot: ...

    async def apply(self, tenant_id: str, user_id: str, update: UserUpdate) -> None: ...

    async def load_users(self, reads: Sequence[UserRead]) -> list[UserSnapshot]:
        """One snapshot per read, in order, in one pipelined read (see the contract)."""
        ...

    async def apply_users(self, writes: Sequence[UserWrite]) -> None:
        """Per user one transaction of its updates, equal to ``apply`` of each in order
        (each user in one ``UserWrite`` at most: ``ValueError`` otherwise)."""
        ...

    async def remember_event_triggers(
        self, tenant_id: str, user_id: str, event_id: str, triggers: dict[str, bytes]
    ) -> None: ...

    async def open_event_triggers(self, tenant_id: str, user_id: str, event_id: str) -> list[bytes]:
        """The payloads ``event_id`` emitted whose trigger is not marked done, by trigger id."""
        ...

    async def member_vectors(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Unit embeddings of the hot turns among ``event_ids`` (for a cluster split)."""
        ...


class TurnReader(Protocol):
    """What the RPC reads: the turn index's turns and version, the clusters, whether an
    event is memorized (the rules are ``ShortTermState``'s)."""

    async def turns_version(self, tenant_id: str, user_id: str) -> bytes | None: ...

    async def turns_state(self, tenant_id: str, user_id: str) -> tuple[bytes | None, int]:
        """``turns_version`` and ``turns_written`` read together."""
        ...

    async def timeline_since(self, tenant_id: str, user_id: str, ts: float) -> list[str]:
        """Hot turn ids stamped at or after ``ts``, in (time, id) order."""
        ...

    async def timeline_ids(self, tenant_id: str, user_id: str) -> list[str]:
        """Every hot turn id, in (time, id) order."""
        ...

    async def leaving(self, users: Sequence[tuple[str, str]]) -> list[list[str]]:
        """Per user, the ids of turns that left the hot tier and are not yet released by the
        archive worker: ``turns`` still reads them, so no turn is ever in neither tier."""
        ...

    async def turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[TurnWithVector]:
        """The turns among ``event_ids`` still in Redis (hot or leaving), in the order
        asked (others are skipped)."""
        ...

    async def clusters(self, tenant_id: str, user_id: str) -> list[Cluster]:
        """Every cluster of the user, in the engine's creation order."""
        ...

    async def memorized(self, tenant_id: str, user_id: str, event_id: str) -> bool:
        """Whether memorize applied the event (its processed mark: kept for its TTL)."""
        ...

    async def memorized_many(self, events: Sequence[tuple[str, str, str]]) -> list[bool]:
        """``memorized`` of each (tenant, user, event id), in the order asked, in one
        pipelined read (the RPC's intake journal checks thousands at a start)."""
        ...


@runtime_checkable
class ShortTermState(MemorizeState, TurnReader, Protocol):
    """A user's short-term memory (hot turns), clustering and recurrence state, and markers.

    The contract every implementation keeps:

    - **One user, one unit.** Everything of a user lives under the user's hash tag
      ``{tenant:user}`` (one Redis Cluster slot), so ``apply`` writes a whole event --
      turn, timeline, pending window, clusters, keys, the seen mark -- atomically. Users
      never see each other's state: every method names both tenant and user. (The list of
      users is the only state shared across users; nothing memorize decides reads it.)
    - **One writer per user.** ``memorize``, owning the user's partition, is the only
      caller of ``apply`` (it reads the hot tier before the transaction and relies on
      nothing changing in between); the consolidator writes only ``trig:`` markers.
      Everything else only reads.
    - **Hot tier in event time.** A turn leaves the timeline when it is older than the
      user's newest event minus ``ttl_days``, or past ``max_turns`` (oldest first, pinned
      last), exactly as ``memory.hot_tier.evictions`` decides -- never by a wall-clock TTL,
      so a replay leaves the same turns hot. A turn applied again is not counted again.
      A turn that leaves stays readable by ``turns`` (not by ``member_vectors``: a split
      decides the same whatever the archive's progress), listed by ``leaving``, until
      ``release_archived``: no turn is ever in neither Redis nor the archive.
    - **Vectors as stored.** Embeddings are kept as float16 and read back as float32, so a
      turn ranks the same from the hot tier and from the archive.
    - **The turn version token.** ``turns_version`` (``tver``) is fresh on every ``apply``
      and None before any write or after ``delete_user``; ``turns_written`` (``tall``)
      counts distinct turns ever written, hot or gone. The RPC's turn index
      (``stores.turn_index``) re-syncs exactly when the token changed and trusts its cache
      otherwise, so a write that keeps the old token would be invisible to retrieval.
    - **Cluster version.** ``UserSnapshot.cluster_version`` is (generation, version):
      ("", 0) with no clustering state; each ``apply`` that carries clusters bumps the
      version (keeping the snapshot's generation, or starting one). ``apply`` is handed the
      snapshot's version back.
    - **Idempotency markers** (seen events, consolidated triggers, an event's triggers,
      claimed reminders) expire on a wall-clock TTL (they only guard against re-delivery).
    - **Batches equal events one by one.** ``load_users`` reads many users at once (one
      pipelined read): each snapshot is what ``load_user`` gives, with ``processed`` the
      asked event ids already applied and ``heard`` the asked phrases in the user's heard
      set. ``apply_users`` writes each user's updates in one transaction, and the state after
      it equals applying them one by one with ``apply`` in the order given (hot tier,
      timeline, pending, keys, clusters and their version, ``tall``, seen marks, ``heard``,
      the event's triggers); only ``tver`` may be fresh once per user rather than per
      update. ``stores.redis_state.snapshot_after(snapshot, update)`` is what a load asked
      the same would read after ``update``: memorize chains a user's events through it.
    - **The heard set** (``UserUpdate.heard``): sentence fingerprints the user heard from
      the assistant or system, kept without TTL (a replay decides the same) and removed by
      ``delete_user``.
    - **Forgetting.** ``delete_user`` removes every key of the user but keeps the forget
      tombstone (``mark_forgotten``: only ever moves forward), which ``load_user`` reports
      so memorize drops events stamped at or before it.
    """

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...

    # -- markers (consolidator, reminders) and the operators' reads (strength, metrics)
    async def trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> bool: ...

    async def mark_trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> None: ...

    async def claim_reminder(
        self, tenant_id: str, user_id: str, reminder_id: str, ttl_s: float
    ) -> bool:
        """True for the first claim only, until released (or its TTL passes)."""
        ...

    async def release_reminder(self, tenant_id: str, user_id: str, reminder_id: str) -> None: ...

    async def users(self) -> list[tuple[str, str]]:
        """Every (tenant, user) with state, sorted by ``schemas.identity.user_key``."""
        ...

    async def count_turns(self, tenant_id: str, user_id: str) -> int: ...

    async def count_hot_turns(self, tenant_id: str, user_id: str) -> int: ...

    async def turns_written(self, tenant_id: str, user_id: str) -> int: ...

    async def newest_events(self, users: Sequence[tuple[str, str]]) -> list[float | None]:
        """Each (tenant, user)'s newest turn's event time (epoch seconds), in the order asked,
        read in one round trip: the user's clock for strength decay and recency. None before
        any turn, or after a forget."""
        ...

    # -- the archive worker
    async def release_archived(self, tenant_id: str, user_id: str, event_ids: Sequence[str]) -> int:
        """Drop the leaving turns among ``event_ids`` (the archive holds them); how many."""
        ...

    # -- forgetting
    async def mark_forgotten(self, tenant_id: str, user_id: str, at: float) -> None: ...

    async def forgotten_at(self, tenant_id: str, user_id: str) -> float | None: ...

    async def clear_forgotten(self, tenant_id: str, user_id: str) -> bool: ...

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        """Remove the user's keys (not the tombstone); how many there were."""
        ...
