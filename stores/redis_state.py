"""Short-term memory and per-user state in Redis (or any Redis-protocol server).

Every key of a user carries the hash tag ``{tenant:user}`` so Redis Cluster keeps a user on
one shard and a user's update can be one MULTI/EXEC transaction:

    {p}:{t:u}:turn:<event_id>   hash   doc (StoredTurn JSON), emb (float16 bytes)
    {p}:{t:u}:timeline          zset   event ids of short-term turns by time (the hot tier)
    {p}:{t:u}:pinned            set    pinned turn ids on the timeline (never expire by age)
    {p}:{t:u}:pending           hash   event id -> TurnSignal bytes: salient turns not yet
                                       handed to consolidation (the recurrence window)
    {p}:{t:u}:clusters          hash   cluster id -> serialised Cluster (members, description)
    {p}:{t:u}:meta              hash   engine: the rest of the user's ClusterState (fuzzy
                                       buffer, adaptive thresholds, counters); cgen + cver:
                                       generation token and version of the cluster state;
                                       tver: turn version (fresh on every write), tall:
                                       turns ever written, newest: newest event time
    {p}:{t:u}:keys              hash   recurrence key -> KeyState JSON
    {p}:{t:u}:seen:<event_id>   string processed-event marker (idempotency); TTL
    {p}:{t:u}:trig:<trigger_id> string consolidated-trigger marker; TTL
    {p}:{t:u}:etrig:<event_id>  hash   trigger id -> RecurrenceTrigger JSON an event emitted,
                                       so a replay can re-send the unconsolidated; TTL
    {p}:users                   set    every "tenant:user" seen (operators, rebuilds)
    {tp}:forgotten:{t:u}        string forget tombstone: epoch seconds (see mark_forgotten);
                                       tp = the tombstone prefix, shared by every generation

Short-term turns leave the hot tier in event time (``memory.hot_tier``): older than the
user's newest event minus ``ttl_days``, or past ``max_turns``, oldest first; never by a
wall-clock TTL, so a replay leaves the same turns hot as the live stream did. Nothing is
lost: the archive worker (``workers.archive``) has written every turn to the long-term
store's archive, which the RPC ranks with the hot turns.

Writers: the ``memorize`` processor owning the user's partition writes everything except
``trig:`` markers, which the consolidator owning the user writes.

Cluster cache. Loading and decoding a few hundred clusters per event costs milliseconds, and
the clustering state changes only through ``apply``, called by the state's one writer. So
``RedisState`` keeps the last ``ClusterState`` it wrote per user in process, tagged with the
(generation, version) it wrote; ``load_user`` reads only those two numbers and reuses the
cached state when they match. Anything else that changes a user's clusters -- another process
after a rebalance, a forget (which deletes the token) -- changes the tag, and the next load
reads the clusters from Redis again.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import TypedDict, Unpack

import numpy as np
from redis.asyncio import Redis

from memory.clustering import (
    Cluster,
    ClusterState,
    cluster_from_bytes,
    cluster_to_bytes,
    engine_from_bytes,
    engine_to_bytes,
)
from memory.hot_tier import Eviction, cutoff, evictions, prefix_needed
from memory.recurrence import (
    KeyState,
    TurnSignal,
    key_state_from_json,
    key_state_to_json,
    signal_from_bytes,
    signal_to_bytes,
)
from schemas import StoredTurn
from stores.redis_client import SlotTransactions, async_redis

DAY_S = 86_400

# Clusters and pending turns are re-read for every event of a user but rarely change: decode
# each distinct serialised value once (content-addressed, so never stale; values are frozen).
_decode_cluster = lru_cache(maxsize=16_384)(cluster_from_bytes)
_decode_signal = lru_cache(maxsize=16_384)(signal_from_bytes)


def _text(value: object) -> str:
    """A member or field as text: the client answers bytes (no ``decode_responses``), which
    redis-py's types cannot tell from str (or, for some commands, from score pairs)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def user_tag(tenant_id: str, user_id: str) -> str:
    return "{" + f"{tenant_id}:{user_id}" + "}"


@dataclass(frozen=True)
class TurnWithVector:
    turn: StoredTurn
    vector: np.ndarray  # float32, unit norm (restored from float16)


@dataclass(frozen=True)
class UserSnapshot:
    """What ``memorize`` reads before it handles one event of a user."""

    already_processed: bool
    clusters: ClusterState | None  # None: the user has no clustering state yet
    pending: list[TurnSignal]  # oldest first
    keys: dict[str, KeyState]
    cluster_version: tuple[str, int] = ("", 0)  # (generation, version) the state was read at
    forgotten_at: float | None = None  # the user was forgotten then: older events are dropped


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


class StateOptions(TypedDict, total=False):
    """``RedisState``'s settings, as ``from_url`` passes them on."""

    prefix: str
    tombstone_prefix: str | None
    ttl_days: float
    max_turns: int
    processed_ttl_days: float
    cluster_cache_users: int


class RedisState:
    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "ms",
        tombstone_prefix: str | None = None,
        ttl_days: float = 7.0,
        max_turns: int = 2000,
        processed_ttl_days: float = 30.0,
        cluster_cache_users: int = 10_000,
        transactions: SlotTransactions | None = None,
    ) -> None:
        self.redis = redis
        self.transactions = transactions or SlotTransactions(redis)
        self.prefix = prefix
        self.tombstone_prefix = tombstone_prefix or prefix
        self.ttl_s = int(ttl_days * DAY_S)
        self.max_turns = max_turns
        self.processed_ttl_s = int(processed_ttl_days * DAY_S)
        self.cluster_cache_users = cluster_cache_users
        self._cluster_cache: OrderedDict[tuple[str, str], tuple[tuple[str, int], ClusterState]]
        self._cluster_cache = OrderedDict()
        self.cluster_cache_hits = 0
        self.cluster_cache_misses = 0

    @classmethod
    def from_url(cls, url: str, **options: Unpack[StateOptions]) -> RedisState:
        """``redis://`` (one server) or ``redis+cluster://`` (stores/redis_client.py)."""
        client = async_redis(url)
        return cls(client, transactions=SlotTransactions(client, url), **options)

    def _key(self, tenant_id: str, user_id: str, *parts: str) -> str:
        return ":".join((self.prefix, user_tag(tenant_id, user_id), *parts))

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.transactions.close()
        await self.redis.aclose()

    # -- memorize: read, then write atomically -------------------------------------------

    async def load_user(self, tenant_id: str, user_id: str, event_id: str) -> UserSnapshot:
        k = partial(self._key, tenant_id, user_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.exists(k("seen", event_id))
        pipe.hmget(k("meta"), "cgen", "cver")
        pipe.hgetall(k("pending"))
        pipe.hgetall(k("keys"))
        pipe.get(self._forgotten_key(tenant_id, user_id))
        seen, (gen, ver), raw_pending, raw_keys, forgotten = await pipe.execute()
        version = ((gen or b"").decode(), int(ver or 0))
        clusters = await self._cluster_state(tenant_id, user_id, version)
        pending = sorted(
            (_decode_signal(v) for v in raw_pending.values()), key=lambda p: (p.ts, p.event_id)
        )
        keys = {name.decode(): key_state_from_json(v.decode()) for name, v in raw_keys.items()}
        return UserSnapshot(
            already_processed=bool(seen),
            clusters=clusters,
            pending=pending,
            keys=keys,
            cluster_version=version,
            forgotten_at=float(forgotten) if forgotten is not None else None,
        )

    async def _hot_tier(
        self, tenant_id: str, user_id: str, turn: StoredTurn
    ) -> tuple[Eviction, bool]:
        """What leaves the hot tier as ``turn`` is written (``memory.hot_tier``), and whether
        ``turn`` was on the timeline already. Read before the transaction: memorize is the
        user's one writer, so nothing changes in between."""
        k = partial(self._key, tenant_id, user_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(k("meta"), "newest")
        pipe.zcard(k("timeline"))
        pipe.smembers(k("pinned"))
        pipe.zscore(k("timeline"), turn.event_id)
        raw_newest, total, raw_pinned, score = await pipe.execute()
        newest = float(raw_newest) if raw_newest is not None else None
        pinned = {p.decode() for p in raw_pinned}
        ts = turn.ts.timestamp()
        limit = cutoff(ts if newest is None else max(newest, ts), self.ttl_s)
        needed = prefix_needed(int(total), len(pinned), self.max_turns)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrangebyscore(k("timeline"), "-inf", f"({limit}", withscores=True)
        pipe.zrange(k("timeline"), 0, needed - 1, withscores=True)
        expired, first = await pipe.execute() if total else ([], [])
        prefix = expired if len(expired) >= needed else first  # both are prefixes of one zset
        oldest = [(i.decode(), float(t)) for i, t in prefix]
        already = score is not None
        new = (turn.event_id, ts, turn.pinned)
        hot = evictions(
            oldest, int(total), pinned, new, newest, self.ttl_s, self.max_turns, already=already
        )
        return hot, already

    async def _cluster_state(
        self, tenant_id: str, user_id: str, version: tuple[str, int]
    ) -> ClusterState | None:
        if not version[0]:
            return None  # never written (or forgotten)
        cached = self._cluster_cache.get((tenant_id, user_id))
        if cached is not None and cached[0] == version:
            self._cluster_cache.move_to_end((tenant_id, user_id))
            self.cluster_cache_hits += 1
            return cached[1]
        self.cluster_cache_misses += 1
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self._key(tenant_id, user_id, "clusters"))
        pipe.hget(self._key(tenant_id, user_id, "meta"), "engine")
        raw_clusters, engine = await pipe.execute()
        if engine is None:
            return None
        clusters = tuple(
            sorted(
                (_decode_cluster(v) for v in raw_clusters.values()),
                key=_creation_order,
            )
        )
        state = engine_from_bytes(engine, clusters)
        self._remember(tenant_id, user_id, version, state)
        return state

    def _remember(
        self, tenant_id: str, user_id: str, version: tuple[str, int], state: ClusterState
    ) -> None:
        if self.cluster_cache_users <= 0:
            return
        self._cluster_cache[(tenant_id, user_id)] = (version, state)
        self._cluster_cache.move_to_end((tenant_id, user_id))
        while len(self._cluster_cache) > self.cluster_cache_users:
            self._cluster_cache.popitem(last=False)

    async def apply(self, tenant_id: str, user_id: str, update: UserUpdate) -> None:
        """One transaction: the turn, the indexes, the cluster, the keys and the seen mark."""
        k = partial(self._key, tenant_id, user_id)
        turn = update.turn
        ts = turn.ts.timestamp()
        turn_key = k("turn", turn.event_id)
        hot, already = await self._hot_tier(tenant_id, user_id, turn)
        # The users set is another slot: outside the user's transaction, and first, so a
        # user with state is always listed (SADD is idempotent; a failed update lists a user
        # with nothing, whom delete_user and the readers treat as empty).
        await self.redis.sadd(f"{self.prefix}:users", f"{tenant_id}:{user_id}")
        pipe = await self.transactions.pipeline(turn_key)
        if hot.keep_new:
            pipe.hset(
                turn_key,
                mapping={
                    "doc": turn.model_dump_json(),
                    "emb": np.asarray(update.vector, dtype=np.float16).tobytes(),
                },
            )
            pipe.persist(turn_key)  # no wall-clock TTL: turns leave by event time, below
            pipe.zadd(k("timeline"), {turn.event_id: ts})
            if turn.pinned:
                pipe.sadd(k("pinned"), turn.event_id)
        if hot.evicted:  # left the hot tier; the archive (workers/archive.py) keeps them
            pipe.zrem(k("timeline"), *hot.evicted)
            pipe.delete(*(k("turn", i) for i in hot.evicted))
            pipe.srem(k("pinned"), *hot.evicted)
        # The RPC's turn index re-syncs on a new tver; tall counts every turn ever written.
        pipe.hset(k("meta"), mapping={"tver": uuid.uuid4().hex, "newest": repr(hot.newest)})
        if not already:
            pipe.hincrby(k("meta"), "tall", 1)
        if update.pending_add is not None:
            pipe.hset(k("pending"), turn.event_id, signal_to_bytes(update.pending_add))
        if update.pending_remove:
            pipe.hdel(k("pending"), *update.pending_remove)
        state = update.clusters
        generation = update.cluster_version[0] or uuid.uuid4().hex
        if state is not None:
            changed = [c for c in (state.cluster(i) for i in update.clusters_changed) if c]
            if changed:
                pipe.hset(
                    k("clusters"), mapping={c.cluster_id: cluster_to_bytes(c) for c in changed}
                )
            if update.clusters_removed:
                pipe.hdel(k("clusters"), *update.clusters_removed)
            pipe.hset(k("meta"), mapping={"engine": engine_to_bytes(state), "cgen": generation})
            version_at = len(pipe.command_stack)
            pipe.hincrby(k("meta"), "cver", 1)
        if update.keys:
            pipe.hset(k("keys"), mapping={n: key_state_to_json(s) for n, s in update.keys.items()})
        pipe.set(k("seen", update.event_id), b"1", ex=self.processed_ttl_s)
        try:
            results = await self.transactions.execute(pipe)
        except BaseException:
            self._cluster_cache.pop((tenant_id, user_id), None)  # unknown outcome: re-read
            raise
        if state is not None:
            version = int(results[version_at])
            if version == update.cluster_version[1] + 1:
                self._remember(tenant_id, user_id, (generation, version), state)
            else:  # someone else changed the state meanwhile (a forget): trust Redis, not us
                self._cluster_cache.pop((tenant_id, user_id), None)

    # -- readers: consolidator and RPC ---------------------------------------------------

    async def turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[TurnWithVector]:
        """The turns that still exist, in the order asked (expired ones are skipped)."""
        if not event_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for event_id in event_ids:
            pipe.hmget(self._key(tenant_id, user_id, "turn", event_id), "doc", "emb")
        found: list[TurnWithVector] = []
        for doc, emb in await pipe.execute():
            if doc is None or emb is None:
                continue
            vector = np.frombuffer(emb, dtype=np.float16).astype(np.float32)
            found.append(TurnWithVector(StoredTurn.model_validate_json(doc), vector))
        return found

    async def clusters(self, tenant_id: str, user_id: str) -> list[Cluster]:
        """Every cluster of a user (archived ones too: they stay searchable), oldest first.

        Each carries its centroid, ``member_ids``, ``description`` and ``description_vector``:
        what ``memory.hierarchy.hierarchical_search`` reads. Members still in the fuzzy
        buffer belong to no cluster yet.
        """
        raw = await self.redis.hgetall(self._key(tenant_id, user_id, "clusters"))
        return sorted(
            (_decode_cluster(v) for v in raw.values()),
            key=_creation_order,
        )

    async def member_vectors(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Unit float32 embeddings of the turns asked for that still exist (for splits)."""
        if not event_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for event_id in event_ids:
            pipe.hget(self._key(tenant_id, user_id, "turn", event_id), "emb")
        found: dict[str, np.ndarray] = {}
        for event_id, emb in zip(event_ids, await pipe.execute(), strict=True):
            if emb is not None:
                found[event_id] = np.frombuffer(emb, dtype=np.float16).astype(np.float32)
        return found

    async def trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> bool:
        return bool(await self.redis.exists(self._key(tenant_id, user_id, "trig", trigger_id)))

    async def mark_trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> None:
        await self.redis.set(
            self._key(tenant_id, user_id, "trig", trigger_id), b"1", ex=self.processed_ttl_s
        )

    # An event's triggers, kept as long as its seen mark. A trigger is delivered before its
    # event is marked seen, but a broker that loses its log (or a trigger topic cut short)
    # loses it after delivery; the event, replayed, is then a duplicate and would never send
    # it again. So a duplicate event re-sends the triggers whose ``trig:`` marker is unset
    # (the consolidator skips a trigger it already did: re-sending is safe).

    async def remember_event_triggers(
        self, tenant_id: str, user_id: str, event_id: str, triggers: dict[str, bytes]
    ) -> None:
        key = self._key(tenant_id, user_id, "etrig", event_id)
        pipe = await self.transactions.pipeline(key)
        # redis-py types ``mapping`` with an invariant key type that no dict[str, ...] meets.
        pipe.hset(key, mapping=triggers)  # type: ignore[arg-type]
        pipe.expire(key, self.processed_ttl_s)
        await self.transactions.execute(pipe)

    async def open_event_triggers(self, tenant_id: str, user_id: str, event_id: str) -> list[bytes]:
        """The triggers ``event_id`` emitted that are not consolidated yet."""
        key = self._key(tenant_id, user_id, "etrig", event_id)
        # bytes: the client does not decode responses (redis-py types them bytes | str).
        raw: dict[bytes, bytes] = await self.redis.hgetall(key)  # type: ignore[assignment]
        if not raw:
            return []
        ids = sorted(raw)
        pipe = self.redis.pipeline(transaction=False)
        for trigger_id in ids:
            pipe.exists(self._key(tenant_id, user_id, "trig", trigger_id.decode()))
        done = await pipe.execute()
        return [raw[t] for t, d in zip(ids, done, strict=True) if not d]

    # Reminders (workers/reminders.py): one marker per reminder id, claimed before it is
    # sent and released if the send fails, so each due action is emitted once.
    async def claim_reminder(
        self, tenant_id: str, user_id: str, reminder_id: str, ttl_s: float
    ) -> bool:
        key = self._key(tenant_id, user_id, "remind", reminder_id)
        return bool(await self.redis.set(key, b"1", nx=True, ex=max(1, int(ttl_s))))

    async def release_reminder(self, tenant_id: str, user_id: str, reminder_id: str) -> None:
        await self.redis.delete(self._key(tenant_id, user_id, "remind", reminder_id))

    # Phrase statistics (memory.text.phrase_keys): per tenant, how many distinct users said
    # each sentence fingerprint. The user's own set makes counting idempotent (a replayed
    # event adds nothing); the tenant's hash is shared by every partition, written with
    # HINCRBY only (commutative, so concurrent processors never lose a count).
    def _phrases_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:phr:{tenant_id}"

    async def phrase_users(self, tenant_id: str, phrases: Sequence[str]) -> list[int]:
        if not phrases:
            return []
        counts = await self.redis.hmget(self._phrases_key(tenant_id), list(phrases))
        return [int(c) if c is not None else 0 for c in counts]

    async def record_phrases(self, tenant_id: str, user_id: str, phrases: Sequence[str]) -> None:
        if not phrases:
            return
        own = self._key(tenant_id, user_id, "phr")
        pipe = self.redis.pipeline(transaction=False)
        for phrase in phrases:
            pipe.sadd(own, phrase)
        # No TTL: a wall-clock expiry of the user's own set would let a replay after it count
        # the user again, so the same log would give other counts (and salience) later.
        # delete_user removes it with the user's other keys.
        added = (await pipe.execute())[: len(phrases)]
        new = [p for p, a in zip(phrases, added, strict=True) if a]
        if new:
            pipe = self.redis.pipeline(transaction=False)
            for phrase in new:
                pipe.hincrby(self._phrases_key(tenant_id), phrase, 1)
            await pipe.execute()

    async def users(self) -> list[str]:
        return sorted(_text(u) for u in await self.redis.smembers(f"{self.prefix}:users"))

    async def count_turns(self, tenant_id: str, user_id: str) -> int:
        """Turns memorize wrote for the user: hot, or gone on to the archive."""
        return await self.turns_written(tenant_id, user_id) or await self.count_hot_turns(
            tenant_id, user_id
        )

    async def count_hot_turns(self, tenant_id: str, user_id: str) -> int:
        """Turns in the hot tier (the timeline) now."""
        return int(await self.redis.zcard(self._key(tenant_id, user_id, "timeline")))

    async def turns_written(self, tenant_id: str, user_id: str) -> int:
        """Distinct turns ever written for the user (0 before any, or after a forget)."""
        raw = await self.redis.hget(self._key(tenant_id, user_id, "meta"), "tall")
        return int(raw or 0)

    async def newest_event(self, tenant_id: str, user_id: str) -> float | None:
        raw = await self.redis.hget(self._key(tenant_id, user_id, "meta"), "newest")
        return float(raw) if raw is not None else None

    # -- retrieval's turn index and forgetting (the RPC) -----------------------------------

    async def turns_version(self, tenant_id: str, user_id: str) -> bytes | None:
        """A token that changes whenever a turn is written (None: none ever was, or forgotten)."""
        token = await self.redis.hget(self._key(tenant_id, user_id, "meta"), "tver")
        return token.encode() if isinstance(token, str) else token

    async def timeline_since(self, tenant_id: str, user_id: str, ts: float) -> list[str]:
        """The timeline's ids stamped at or after ``ts`` (epoch seconds), oldest first."""
        ids = await self.redis.zrangebyscore(
            self._key(tenant_id, user_id, "timeline"), repr(float(ts)), "+inf"
        )
        return [_text(i) for i in ids]

    async def timeline_ids(self, tenant_id: str, user_id: str) -> list[str]:
        """Every short-term turn id on the user's timeline, oldest first."""
        ids = await self.redis.zrange(self._key(tenant_id, user_id, "timeline"), 0, -1)
        return [_text(i) for i in ids]

    async def turns_state(self, tenant_id: str, user_id: str) -> tuple[bytes | None, int]:
        """``turns_version`` and ``turns_written`` in one read."""
        token, total = await self.redis.hmget(self._key(tenant_id, user_id, "meta"), "tver", "tall")
        return (token if isinstance(token, bytes) else None), int(total or 0)

    def _forgotten_key(self, tenant_id: str, user_id: str) -> str:
        # The user's hash tag (same slot) but outside ``{p}:{t:u}:*``, so delete_user keeps it.
        return f"{self.tombstone_prefix}:forgotten:{user_tag(tenant_id, user_id)}"

    async def mark_forgotten(self, tenant_id: str, user_id: str, at: float) -> None:
        """Tombstone: memorize drops this user's events stamped at or before ``at``.

        Kept (no TTL, a few bytes) so a replay of the log does not bring the user back; a
        later forget moves it forward, never back.
        """
        key = self._forgotten_key(tenant_id, user_id)
        old = await self.redis.get(key)
        if old is None or float(old) < at:
            await self.redis.set(key, repr(at))

    async def forgotten_at(self, tenant_id: str, user_id: str) -> float | None:
        raw = await self.redis.get(self._forgotten_key(tenant_id, user_id))
        return None if raw is None else float(raw)

    async def clear_forgotten(self, tenant_id: str, user_id: str) -> bool:
        """Lift the tombstone (an operator's ``--restore-forgotten`` replay); True if one was
        there. Every generation reads the same one, so this lifts it for all of them."""
        return bool(await self.redis.delete(self._forgotten_key(tenant_id, user_id)))

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        """Forget a user: every key under the user's hash tag, and the users-set entry."""
        pattern = self._key(tenant_id, user_id, "*")
        deleted = 0
        batch: list[bytes] = []
        async for key in self.redis.scan_iter(match=_glob_escape(pattern), count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(await self.redis.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(await self.redis.delete(*batch))
        await self.redis.srem(f"{self.prefix}:users", f"{tenant_id}:{user_id}")
        return deleted


def _creation_order(c: Cluster) -> tuple[int, float]:
    """The engine's order: clusters are numbered as they open (event times may not be)."""
    digits = c.cluster_id.lstrip("c")
    return (int(digits) if digits.isdigit() else -1, c.created_ts)


def _glob_escape(pattern: str) -> str:
    """Escape glob metacharacters except the trailing ``*`` (ids may contain none, but be safe)."""
    body, star = pattern[:-1], pattern[-1]
    for ch in "[]?*":
        body = body.replace(ch, "\\" + ch)
    return body + star
