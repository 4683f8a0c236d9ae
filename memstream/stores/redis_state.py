"""Short-term memory and per-user state in Redis (or any Redis-protocol server).

Every key of a user carries the hash tag ``{t:u}`` (``schemas.identity.user_key``: its parts
percent-encoded, so no two users share it and the tag holds no brace) so Redis Cluster keeps
a user on one shard and a user's update can be one MULTI/EXEC transaction:

    {p}:{t:u}:turn:<event_id>   hash   doc (StoredTurn JSON), emb (float16 bytes)
    {p}:{t:u}:timeline          zset   event ids of short-term turns by time (the hot tier)
    {p}:{t:u}:pinned            set    pinned turn ids on the timeline (never expire by age)
    {p}:{t:u}:leaving           zset   ids of turns that left the timeline, their hashes
                                       kept until the archive worker has them (score: when
                                       the hash expires; see LEAVING_TTL_S)
    {p}:{t:u}:pending           hash   event id -> TurnSignal bytes: salient turns not yet
                                       handed to consolidation (the recurrence window)
    {p}:{t:u}:clusters          hash   cluster id -> serialised Cluster (members, description)
    {p}:{t:u}:meta              hash   engine: the rest of the user's ClusterState (fuzzy
                                       buffer, adaptive thresholds, counters); cgen + cver:
                                       generation token and version of the cluster state;
                                       tver: turn version (fresh on every write), tall:
                                       turns ever written, newest: newest event time
    {p}:{t:u}:keys              hash   recurrence key -> KeyState JSON
    {p}:{t:u}:heard             set    sentence fingerprints (memory.text.phrase_keys) the
                                       user heard from the assistant or system (see
                                       memory.memorize.canned_phrases); no TTL
    {p}:{t:u}:seen:<event_id>   string processed-event marker (idempotency); TTL
    {p}:{t:u}:trig:<trigger_id> string consolidated-trigger marker; TTL
    {p}:{t:u}:etrig:<event_id>  hash   trigger id -> RecurrenceTrigger JSON an event emitted,
                                       so a replay can re-send the unconsolidated; TTL
    {p}:{t:u}:remind:<rem_id>   string claimed-reminder marker (workers.reminders); TTL
    {p}:{t:u}:markers           zset   index of the seen/etrig/trig markers: member the
                                       marker key's suffix (``seen:<event_id>``), score its
                                       expiry (epoch seconds); TTL: the newest marker's
    {p}:{t:u}:reminders         zset   the same index for the remind markers (their TTLs
                                       differ per claim, so they keep their own index)
    {p}:users                   set    every user key seen (operators, rebuilds)
    {tp}:forgotten:{t:u}        string forget tombstone: epoch seconds (see mark_forgotten);
                                       tp = the tombstone prefix, shared by every generation;
                                       TTL forgotten_ttl_days (0: none)

Forgetting a user finds every key without scanning the keyspace (``delete_user``): the fixed
names above, ``turn:<id>`` for the members of the timeline, the pinned set and ``leaving``
(an evicted turn's key goes once the archive has it), and the markers the two indexes
list. Each marker is indexed in the transaction that writes it (one ZADD per transaction,
however many markers), and the index is pruned there (ZREMRANGEBYSCORE of entries expired
``CLOCK_SLACK_S`` ago) and given the newest marker's TTL, so an idle user's index goes with
its markers. Markers from before the indexes
are listed nowhere and expire by their own TTL.

Short-term turns leave the hot tier in event time (``memory.hot_tier``): older than the
user's newest event minus ``ttl_days``, or past ``max_turns``, oldest first; never by a
wall-clock TTL, so a replay leaves the same turns hot as the live stream did. Nothing is
lost, not even for a moment: a turn that leaves is listed in ``leaving`` and stays readable
until the archive worker (``workers.archive``), which writes every turn to the long-term
store's archive, releases it (``release_archived``). The RPC ranks the three alike.

Writers: the ``memorize`` processor owning the user's partition writes everything except
``trig:`` markers, which the consolidator owning the user writes, ``remind:`` markers
(with their index), the reminder worker's, and the release of ``leaving`` turns, the archive
worker's. Both memorize and the consolidator add to the
``markers`` index, in the transaction of their marker (ZADD, prune and EXPIRE commute).

Batches. memorize reads a fetched batch's users in one pipeline (``load_users``) and writes
them with ``apply_users``: per user one MULTI/EXEC holding every event of the user in the
batch, equal to applying them one by one (the hot tier is read once and its evictions
chained in process); on one server all users' blocks go in one round trip.

Cluster cache. Loading and decoding a few hundred clusters per event costs milliseconds, and
the clustering state changes only through ``apply``, called by the state's one writer. So
``RedisState`` keeps the last ``ClusterState`` it wrote per user in process, tagged with the
(generation, version) it wrote; ``load_user`` reads only those two numbers and reuses the
cached state when they match. Anything else that changes a user's clusters -- another process
after a rebalance, a forget (which deletes the token) -- changes the tag, and the next load
reads the clusters from Redis again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypedDict, Unpack

import numpy as np
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster

from memstream.memory.clustering import Cluster, ClusterState
from memstream.memory.hot_tier import Eviction, cutoff, evictions, prefix_needed
from memstream.memory.recurrence import KeyState
from memstream.schemas import StoredTurn
from memstream.schemas.identity import parse_user_key, user_key
from memstream.stores.codecs import (
    cluster_to_bytes,
    decode_cluster,
    decode_signal,
    engine_from_bytes,
    engine_to_bytes,
    key_state_from_json,
    key_state_to_json,
    signal_to_bytes,
)
from memstream.stores.redis_client import SlotTransactions, async_redis
from memstream.stores.short_term import (
    TurnWithVector,
    UserRead,
    UserSnapshot,
    UserUpdate,
    UserWrite,
)

DAY_S = 86_400
# A marker's index entry is scored by its expiry on the writer's wall clock and pruned on
# another's: prune only this long after, so a clock a little ahead never unlists a live marker.
CLOCK_SLACK_S = 300
# The keys every user may have, besides turns and markers (see the module docstring). Those
# that lead to other keys (timeline, pinned, the indexes) come last: a forget cut short
# leaves them for the next try.
_FIXED_KEYS = ("pending", "clusters", "meta", "keys", "heard", "timeline", "pinned", "leaving")
_INDEXES = ("markers", "reminders")
DELETE_BATCH = 500
# A turn that leaves the hot tier stays readable (its hash kept, listed in ``leaving``) until
# the archive worker has it (``release_archived``). This wall-clock bound only caps what
# Redis holds while no archive worker runs; it decides nothing about ranking.
LEAVING_TTL_S = DAY_S
# Drop the listed turns that the archive holds: a turn leaves ``leaving`` and its hash goes in
# one step, the hash kept if a redelivered event put the turn back on the timeline.
_RELEASE = """
local n = 0
for i = 3, #KEYS do
  local id = ARGV[i - 2]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    if not redis.call('ZSCORE', KEYS[2], id) then
      redis.call('UNLINK', KEYS[i])
    end
    n = n + 1
  end
end
return n
"""


def _text(value: object) -> str:
    """A member or field as text: the client answers bytes (no ``decode_responses``), which
    redis-py's types cannot tell from str (or, for some commands, from score pairs)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def user_tag(tenant_id: str, user_id: str) -> str:
    return "{" + user_key(tenant_id, user_id) + "}"


class StateOptions(TypedDict, total=False):
    """``RedisState``'s settings, as ``from_url`` passes them on."""

    prefix: str
    tombstone_prefix: str | None
    ttl_days: float
    max_turns: int
    processed_ttl_days: float
    forgotten_ttl_days: float
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
        forgotten_ttl_days: float = 400.0,
        cluster_cache_users: int = 10_000,
        transactions: SlotTransactions | None = None,
    ) -> None:
        self.redis = redis
        self.transactions = transactions or SlotTransactions(redis)
        self._release = redis.register_script(_RELEASE)
        self.prefix = prefix
        self.tombstone_prefix = tombstone_prefix or prefix
        self.ttl_s = int(ttl_days * DAY_S)
        self.max_turns = max_turns
        self.processed_ttl_s = int(processed_ttl_days * DAY_S)
        self.forgotten_ttl_s = int(forgotten_ttl_days * DAY_S)  # 0: tombstones never expire
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
        [snapshot] = await self.load_users([UserRead(tenant_id, user_id, (event_id,))])
        return snapshot

    async def load_users(self, reads: Sequence[UserRead]) -> list[UserSnapshot]:
        """Every user's snapshot in one pipelined read (clusters not in the cache: one more)."""
        pipe = self.redis.pipeline(transaction=False)
        for r in reads:
            k = partial(self._key, r.tenant_id, r.user_id)
            for event_id in r.event_ids:  # (a cluster pipeline refuses MGET)
                pipe.exists(k("seen", event_id))
            pipe.hmget(k("meta"), "cgen", "cver")
            pipe.hgetall(k("pending"))
            pipe.hgetall(k("keys"))
            pipe.get(self._forgotten_key(r.tenant_id, r.user_id))
            if r.phrases:
                pipe.smismember(k("heard"), list(r.phrases))
        results = iter(await pipe.execute() if reads else [])
        parsed = []
        for r in reads:
            seen = [next(results) for _ in r.event_ids]
            gen, ver = next(results)
            raw_pending, raw_keys, forgotten = next(results), next(results), next(results)
            heard = next(results) if r.phrases else []
            parsed.append(
                (
                    r,
                    ((gen or b"").decode(), int(ver or 0)),
                    UserSnapshot(
                        clusters=None,
                        pending=sorted(
                            (decode_signal(v) for v in raw_pending.values()),
                            key=lambda p: (p.ts, p.event_id),
                        ),
                        keys={
                            name.decode(): key_state_from_json(v.decode())
                            for name, v in raw_keys.items()
                        },
                        forgotten_at=float(forgotten) if forgotten is not None else None,
                        processed=frozenset(e for e, s in zip(r.event_ids, seen, strict=True) if s),
                        heard=frozenset(p for p, h in zip(r.phrases, heard, strict=True) if h),
                    ),
                )
            )
        states = await self._cluster_states([(r.tenant_id, r.user_id, v) for r, v, _ in parsed])
        return [
            replace(snap, clusters=state, cluster_version=version)
            for (_, version, snap), state in zip(parsed, states, strict=True)
        ]

    async def _cluster_states(
        self, users: Sequence[tuple[str, str, tuple[str, int]]]
    ) -> list[ClusterState | None]:
        """Each user's clustering state at ``version``: the cache's, else read (one pipeline)."""
        found: list[ClusterState | None] = [None] * len(users)
        missing = []
        for i, (tenant_id, user_id, version) in enumerate(users):
            if not version[0]:
                continue  # never written (or forgotten)
            cached = self._cluster_cache.get((tenant_id, user_id))
            if cached is not None and cached[0] == version:
                self._cluster_cache.move_to_end((tenant_id, user_id))
                self.cluster_cache_hits += 1
                found[i] = cached[1]
            else:
                self.cluster_cache_misses += 1
                missing.append(i)
        if not missing:
            return found
        pipe = self.redis.pipeline(transaction=False)
        for i in missing:
            tenant_id, user_id, _ = users[i]
            pipe.hgetall(self._key(tenant_id, user_id, "clusters"))
            pipe.hget(self._key(tenant_id, user_id, "meta"), "engine")
        results = await pipe.execute()
        for n, i in enumerate(missing):
            raw_clusters, engine = results[2 * n], results[2 * n + 1]
            if engine is None:
                continue
            tenant_id, user_id, version = users[i]
            clusters = tuple(
                sorted((decode_cluster(v) for v in raw_clusters.values()), key=_creation_order)
            )
            state = found[i] = engine_from_bytes(engine, clusters)
            self._remember(tenant_id, user_id, version, state)
        return found

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
        await self.apply_users([UserWrite(tenant_id, user_id, (update,))])

    async def apply_users(self, writes: Sequence[UserWrite]) -> None:
        """Per user one transaction holding all its updates, equal to applying them in order."""
        writes = [w for w in writes if w.updates]
        if not writes:
            return
        _once_each(writes)
        hot = await self._hot_tiers(writes)
        members = [user_key(w.tenant_id, w.user_id) for w in writes]
        try:
            if isinstance(self.redis, RedisCluster):
                # The users set is another slot: outside the users' transactions, and first,
                # so a user with state is always listed (SADD is idempotent; a failed update
                # lists a user with nothing, whom delete_user and the readers treat as empty).
                await self.redis.sadd(f"{self.prefix}:users", *members)
                await asyncio.gather(
                    *(self._apply_alone(w, h) for w, h in zip(writes, hot, strict=True))
                )
            else:  # one server: every user's block (and the users set) in one transaction
                pipe = self.redis.pipeline(transaction=True)
                pipe.sadd(f"{self.prefix}:users", *members)
                queued = [self._queue(pipe, w, h) for w, h in zip(writes, hot, strict=True)]
                results = await self.transactions.execute(pipe)
                for w, q in zip(writes, queued, strict=True):
                    self._after_write(w, q, results)
        except BaseException:
            for w in writes:  # unknown outcome: re-read
                self._cluster_cache.pop((w.tenant_id, w.user_id), None)
            raise

    async def _apply_alone(self, write: UserWrite, hot: list[tuple[Eviction, bool]]) -> None:
        pipe = await self.transactions.pipeline(self._key(write.tenant_id, write.user_id, "meta"))
        queued = self._queue(pipe, write, hot)
        self._after_write(write, queued, await self.transactions.execute(pipe))

    async def _hot_tiers(self, writes: Sequence[UserWrite]) -> list[list[tuple[Eviction, bool]]]:
        """Per user, what leaves the hot tier as each of its turns is written
        (``memory.hot_tier``), and whether the turn was on the timeline already.

        Read before the transaction (memorize is the user's one writer, so nothing changes
        in between): the timeline's prefix that the whole batch can need -- every entry older
        than the batch's last cutoff, and after those as many as the cap can evict plus the
        pinned ones it passes over -- then each turn's eviction chained in process.
        """
        pipe = self.redis.pipeline(transaction=False)
        for w in writes:
            k = partial(self._key, w.tenant_id, w.user_id)
            pipe.hget(k("meta"), "newest")
            pipe.zcard(k("timeline"))
            pipe.smembers(k("pinned"))
            pipe.zmscore(k("timeline"), [u.turn.event_id for u in w.updates])
        first = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        reads: list[tuple[bool, bool]] = []
        heads = []
        for n, w in enumerate(writes):
            raw_newest, total, raw_pinned, scores = first[4 * n : 4 * n + 4]
            newest = float(raw_newest) if raw_newest is not None else None
            pinned = {p.decode() for p in raw_pinned}
            on = {u.turn.event_id for u, s in zip(w.updates, scores, strict=True) if s is not None}
            heads.append((newest, int(total), pinned, on))
            if not total:
                reads.append((False, False))
                continue
            latest = max(u.turn.ts.timestamp() for u in w.updates)
            limit = cutoff(latest if newest is None else max(newest, latest), self.ttl_s)
            n_new = len(w.updates)
            more = prefix_needed(int(total) + n_new, len(pinned) + n_new, self.max_turns)
            timeline = self._key(w.tenant_id, w.user_id, "timeline")
            pipe.zrangebyscore(timeline, "-inf", f"({limit}", withscores=True)
            if more:
                pipe.zrangebyscore(timeline, limit, "+inf", start=0, num=more, withscores=True)
            reads.append((True, bool(more)))
        second = iter(await pipe.execute() if any(r for r, _ in reads) else [])
        plans = []
        for w, (newest, total, pinned, on), (read, more) in zip(writes, heads, reads, strict=True):
            prefix = [(i.decode(), float(t)) for i, t in next(second)] if read else []
            if more:
                prefix += [(i.decode(), float(t)) for i, t in next(second)]
            plans.append(self._chain(w.updates, prefix, total, pinned, on, newest))
        return plans

    def _chain(
        self,
        updates: Sequence[UserUpdate],
        prefix: list[tuple[str, float]],
        total: int,
        pinned: set[str],
        on: set[str],
        newest: float | None,
    ) -> list[tuple[Eviction, bool]]:
        """Each update's eviction, the timeline prefix kept as Redis would hold it after each."""
        plans = []
        for u in updates:
            new_id, ts = u.turn.event_id, u.turn.ts.timestamp()
            already = new_id in on
            hot = evictions(
                prefix, total, pinned, (new_id, ts, u.turn.pinned), newest, self.ttl_s,
                self.max_turns, already=already,
            )  # fmt: skip
            plans.append((hot, already))
            entries = [(i, t) for i, t in prefix if i != new_id]
            if len(prefix) >= total or (
                entries and (ts, new_id) < (entries[-1][1], entries[-1][0])
            ):
                entries.append((new_id, ts))
                entries.sort(key=lambda e: (e[1], e[0]))
            gone = set(hot.evicted) | (set() if hot.keep_new else {new_id})
            prefix = [e for e in entries if e[0] not in gone]
            total += (1 if hot.keep_new and not already else 0) - len(hot.evicted)
            pinned = (pinned - gone) | ({new_id} if hot.keep_new and u.turn.pinned else set())
            on = (on - gone) | ({new_id} if hot.keep_new else set())
            newest = hot.newest
        return plans

    def _queue(
        self, pipe: Pipeline, write: UserWrite, hot: list[tuple[Eviction, bool]]
    ) -> tuple[int | None, str, int, ClusterState | None]:
        """Queue one user's updates; (index of the cver result, generation, version the
        first update handed back, the last clustering state)."""
        k = partial(self._key, write.tenant_id, write.user_id)
        block = _UserBlock()
        # Per event, its own commands in event order; what the events share is folded and
        # written once after them.
        for update, (evicted, already) in zip(write.updates, hot, strict=True):
            self._queue_event(pipe, k, update, evicted, block.markers)
            block.fold(update, already)
        # Every marker of the transaction in one index entry write (3 commands a user, any
        # number of events).
        self._index_markers(
            pipe, write.tenant_id, write.user_id, block.markers, self.processed_ttl_s
        )
        _queue_user_meta(pipe, k, hot[-1][0].newest, block)
        generation, version_at = "", None
        if block.state is not None and block.base is not None:
            generation, version_at = _queue_clusters(pipe, k, block.state, block.base, block)
        base_version = block.base[1] if block.base else 0
        return version_at, generation, base_version + block.stepped, block.state

    def _queue_event(
        self,
        pipe: Pipeline,
        k: Callable[..., str],
        update: UserUpdate,
        evicted: Eviction,
        markers: list[str],
    ) -> None:
        """Queue one event's commands: its turn and the hot tier's evictions, its pending
        changes, the triggers it emitted and its seen marker (whose suffixes join
        ``markers``)."""
        _queue_hot_tier(pipe, k, update.turn, update.vector, evicted)
        if update.pending_add is not None:
            pipe.hset(k("pending"), update.turn.event_id, signal_to_bytes(update.pending_add))
        if update.pending_remove:
            pipe.hdel(k("pending"), *update.pending_remove)
        if update.triggers:
            etrig = k("etrig", update.event_id)
            # redis-py types ``mapping`` with an invariant key type no dict[str, ...] meets.
            pipe.hset(etrig, mapping=dict(update.triggers))  # type: ignore[arg-type]
            pipe.expire(etrig, self.processed_ttl_s)
            markers.append(f"etrig:{update.event_id}")
        pipe.set(k("seen", update.event_id), b"1", ex=self.processed_ttl_s)
        markers.append(f"seen:{update.event_id}")

    def _index_markers(
        self,
        pipe: Pipeline,
        tenant_id: str,
        user_id: str,
        suffixes: Sequence[str],
        ttl_s: int,
        *,
        index: str = "markers",
    ) -> None:
        """Queue, beside the markers it writes (``{p}:{t:u}:<suffix>``, each with TTL
        ``ttl_s``), their entries in the user's ``index``, which ``delete_user`` reads instead
        of scanning the keyspace: scored by expiry (never lowered: GT), entries expired a while
        ago pruned, and the index kept as long as its newest marker.

        ``markers`` (seen, etrig, trig) all take ``processed_ttl_s``, so the newest write's TTL
        is the longest and a plain EXPIRE is exact. ``reminders`` take the TTL each claim
        asks: the index's expiry only moves forward (NX on a fresh index, else GT).
        """
        key = self._key(tenant_id, user_id, index)
        now = time.time()
        pipe.zadd(key, dict.fromkeys(suffixes, now + ttl_s), gt=True)
        pipe.zremrangebyscore(key, "-inf", now - CLOCK_SLACK_S)
        if index == "markers":
            pipe.expire(key, ttl_s)
        else:
            pipe.expire(key, ttl_s, nx=True)
            pipe.expire(key, ttl_s, gt=True)

    def _after_write(
        self,
        write: UserWrite,
        queued: tuple[int | None, str, int, ClusterState | None],
        results: list[object],
    ) -> None:
        version_at, generation, expected, state = queued
        if version_at is None or state is None:
            return
        raw = results[version_at]
        if isinstance(raw, int) and raw == expected:
            self._remember(write.tenant_id, write.user_id, (generation, raw), state)
        else:  # someone else changed the state meanwhile (a forget): trust Redis, not us
            self._cluster_cache.pop((write.tenant_id, write.user_id), None)

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
            (decode_cluster(v) for v in raw.values()),
            key=_creation_order,
        )

    async def member_vectors(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Unit float32 embeddings of the turns asked for that still exist (for splits)."""
        if not event_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        # Hot turns only: whether a leaving turn is still readable depends on the archive's
        # progress, and a split must decide the same in a replay.
        pipe.zmscore(self._key(tenant_id, user_id, "timeline"), list(event_ids))
        for event_id in event_ids:
            pipe.hget(self._key(tenant_id, user_id, "turn", event_id), "emb")
        hot, *embs = await pipe.execute()
        found: dict[str, np.ndarray] = {}
        for event_id, score, emb in zip(event_ids, hot, embs, strict=True):
            if score is not None and emb is not None:
                found[event_id] = np.frombuffer(emb, dtype=np.float16).astype(np.float32)
        return found

    async def trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> bool:
        return bool(await self.redis.exists(self._key(tenant_id, user_id, "trig", trigger_id)))

    async def mark_trigger_done(self, tenant_id: str, user_id: str, trigger_id: str) -> None:
        key = self._key(tenant_id, user_id, "trig", trigger_id)
        pipe = await self.transactions.pipeline(key)
        pipe.set(key, b"1", ex=self.processed_ttl_s)
        self._index_markers(pipe, tenant_id, user_id, [f"trig:{trigger_id}"], self.processed_ttl_s)
        await self.transactions.execute(pipe)

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
        self._index_markers(pipe, tenant_id, user_id, [f"etrig:{event_id}"], self.processed_ttl_s)
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
        ttl = max(1, int(ttl_s))
        pipe = await self.transactions.pipeline(key)
        pipe.set(key, b"1", nx=True, ex=ttl)
        # Claimed already: the entry's score may pass the marker's expiry (GT keeps the later
        # one), never fall short of it.
        self._index_markers(
            pipe, tenant_id, user_id, [f"remind:{reminder_id}"], ttl, index="reminders"
        )
        claimed, *_ = await self.transactions.execute(pipe)
        return bool(claimed)

    async def release_reminder(self, tenant_id: str, user_id: str, reminder_id: str) -> None:
        key = self._key(tenant_id, user_id, "remind", reminder_id)
        pipe = await self.transactions.pipeline(key)
        pipe.delete(key)
        pipe.zrem(self._key(tenant_id, user_id, "reminders"), f"remind:{reminder_id}")
        await self.transactions.execute(pipe)

    async def users(self) -> list[tuple[str, str]]:
        members = sorted(_text(u) for u in await self.redis.smembers(f"{self.prefix}:users"))
        return [parse_user_key(m) for m in members]

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

    async def newest_events(self, users: Sequence[tuple[str, str]]) -> list[float | None]:
        pipe = self.redis.pipeline(transaction=False)
        for tenant_id, user_id in users:
            pipe.hget(self._key(tenant_id, user_id, "meta"), "newest")
        return [float(raw) if raw is not None else None for raw in await pipe.execute()]

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

    async def memorized(self, tenant_id: str, user_id: str, event_id: str) -> bool:
        """Whether memorize applied the event: its processed mark, written in the turn's own
        transaction (kept for the mark's TTL: what a caller just posted is covered)."""
        return bool(await self.redis.exists(self._key(tenant_id, user_id, "seen", event_id)))

    async def memorized_many(self, events: Sequence[tuple[str, str, str]]) -> list[bool]:
        """``memorized`` of each (tenant, user, event id), in order, in one pipelined read."""
        if not events:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for tenant_id, user_id, event_id in events:
            pipe.exists(self._key(tenant_id, user_id, "seen", event_id))
        return [bool(found) for found in await pipe.execute()]

    async def timeline_ids(self, tenant_id: str, user_id: str) -> list[str]:
        """Every short-term turn id on the user's timeline, oldest first."""
        ids = await self.redis.zrange(self._key(tenant_id, user_id, "timeline"), 0, -1)
        return [_text(i) for i in ids]

    async def leaving(self, users: Sequence[tuple[str, str]]) -> list[list[str]]:
        """Per user, the ids of turns that left the hot tier and that the archive worker has
        not released yet (still readable through ``turns``), in one pipelined read."""
        if not users:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for tenant_id, user_id in users:
            pipe.zrange(self._key(tenant_id, user_id, "leaving"), 0, -1)
        return [sorted(_text(i) for i in ids) for ids in await pipe.execute()]

    async def release_archived(self, tenant_id: str, user_id: str, event_ids: Sequence[str]) -> int:
        """Drop the leaving turns among ``event_ids`` (the archive has them); how many."""
        if not event_ids:
            return 0
        k = partial(self._key, tenant_id, user_id)
        keys = [k("leaving"), k("timeline"), *(k("turn", i) for i in event_ids)]
        return int(await self._release(keys=keys, args=list(event_ids)))

    async def turns_state(self, tenant_id: str, user_id: str) -> tuple[bytes | None, int]:
        """``turns_version`` and ``turns_written`` in one read."""
        token, total = await self.redis.hmget(self._key(tenant_id, user_id, "meta"), "tver", "tall")
        return (token if isinstance(token, bytes) else None), int(total or 0)

    def _forgotten_key(self, tenant_id: str, user_id: str) -> str:
        # The user's hash tag (same slot) but outside ``{p}:{t:u}:*``, so delete_user keeps it.
        return f"{self.tombstone_prefix}:forgotten:{user_tag(tenant_id, user_id)}"

    async def mark_forgotten(self, tenant_id: str, user_id: str, at: float) -> None:
        """Tombstone: memorize drops this user's events stamped at or before ``at``.

        Kept ``forgotten_ttl_days`` (a few bytes; longer than memstream.events' retention,
        so a replay of the log does not bring the user back; 0: forever). A later forget
        moves it forward, never back, and restarts its TTL.
        """
        key = self._forgotten_key(tenant_id, user_id)
        ttl = self.forgotten_ttl_s or None
        old = await self.redis.get(key)
        if old is None or float(old) < at:
            await self.redis.set(key, repr(at), ex=ttl)
        elif ttl is not None:
            await self.redis.expire(key, ttl)

    async def forgotten_at(self, tenant_id: str, user_id: str) -> float | None:
        raw = await self.redis.get(self._forgotten_key(tenant_id, user_id))
        return None if raw is None else float(raw)

    async def clear_forgotten(self, tenant_id: str, user_id: str) -> bool:
        """Lift the tombstone (an operator's ``--restore-forgotten`` replay); True if one was
        there. Every generation reads the same one, so this lifts it for all of them."""
        return bool(await self.redis.delete(self._forgotten_key(tenant_id, user_id)))

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        """Forget a user: every key under the user's hash tag, and the users-set entry; how
        many keys there were.

        No SCAN of the keyspace: the keys are the fixed names, ``turn:<id>`` for the
        members of the timeline, the pinned set and ``leaving``, and the markers the two
        indexes list (``_index_markers``), unlinked in batches (one slot: valid on a Redis Cluster).
        Markers written before the indexes existed are not listed: they expire by their
        TTL (``processed_ttl_days``; a reminder's, 2 x its max lateness + 1 day). The
        tombstone (``_forgotten_key``) lies outside ``{p}:{t:u}:`` and stays. A write that
        lands between the read and the unlinks survives (as one after a SCAN did): the
        ``control`` processor's second forget, behind the in-flight events, takes it.
        """
        k = partial(self._key, tenant_id, user_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(k("timeline"), 0, -1)
        pipe.smembers(k("pinned"))
        pipe.zrange(k("leaving"), 0, -1)
        for index in _INDEXES:
            pipe.zrange(k(index), 0, -1)
        timeline, pinned, leaving, *indexed = await pipe.execute()
        turns = dict.fromkeys(_text(i) for i in (*timeline, *pinned, *leaving))
        keys = [k("turn", i) for i in turns]
        keys += [k(_text(m)) for members in indexed for m in members]
        keys += [k(name) for name in (*_FIXED_KEYS, *_INDEXES)]
        deleted = 0
        for at in range(0, len(keys), DELETE_BATCH):
            deleted += int(await self.redis.unlink(*keys[at : at + DELETE_BATCH]))
        await self.redis.srem(f"{self.prefix}:users", user_key(tenant_id, user_id))
        return deleted


@dataclass
class _UserBlock:
    """What one user's updates in a transaction share, folded in event order and written once
    after the events' own commands."""

    added: int = 0  # turns new to the timeline (``tall``)
    keys: dict[str, KeyState] = field(default_factory=dict)
    heard: dict[str, None] = field(default_factory=dict)  # an ordered set
    dirty: dict[str, None] = field(default_factory=dict)  # cluster ids to write, in order
    removed: set[str] = field(default_factory=set)  # cluster ids to delete
    state: ClusterState | None = None  # the last clustering state
    base: tuple[str, int] | None = None  # the first update's cluster version
    stepped: int = 0  # updates that changed the clustering state
    markers: list[str] = field(default_factory=list)  # marker suffixes to index

    def fold(self, update: UserUpdate, already: bool) -> None:
        """Add one update (``already``: its turn was on the timeline)."""
        self.added += not already
        if update.clusters is not None:
            self.state, self.stepped = update.clusters, self.stepped + 1
            self.base = self.base or update.cluster_version
            for cluster_id in update.clusters_changed:
                self.dirty[cluster_id] = None
                self.removed.discard(cluster_id)
            for cluster_id in update.clusters_removed:
                self.dirty.pop(cluster_id, None)
                self.removed.add(cluster_id)
        self.keys.update(update.keys)
        self.heard.update(dict.fromkeys(update.heard))


def _queue_hot_tier(
    pipe: Pipeline, k: Callable[..., str], turn: StoredTurn, vector: np.ndarray, hot: Eviction
) -> None:
    """Queue a turn's write (when the hot tier keeps it) and the turns it evicts."""
    turn_key = k("turn", turn.event_id)
    if hot.keep_new:
        pipe.hset(
            turn_key,
            mapping={
                "doc": turn.model_dump_json(),
                "emb": np.asarray(vector, dtype=np.float16).tobytes(),
            },
        )
        pipe.persist(turn_key)  # no wall-clock TTL: turns leave by event time, below
        pipe.zadd(k("timeline"), {turn.event_id: turn.ts.timestamp()})
        if turn.pinned:
            pipe.sadd(k("pinned"), turn.event_id)
    else:  # a late turn already past the cutoff: readable until the archive has it
        pipe.hset(
            turn_key,
            mapping={
                "doc": turn.model_dump_json(),
                "emb": np.asarray(vector, dtype=np.float16).tobytes(),
            },
        )
        _queue_leaving(pipe, k, [turn.event_id])
    if hot.evicted:  # left the hot tier; kept readable until the archive has them
        pipe.zrem(k("timeline"), *hot.evicted)
        pipe.srem(k("pinned"), *hot.evicted)
        _queue_leaving(pipe, k, hot.evicted)


def _queue_leaving(pipe: Pipeline, k: Callable[..., str], event_ids: Sequence[str]) -> None:
    """List turns that left the hot tier in ``leaving``, scored by when their hashes expire
    (the markers' index pattern: pruned here, the set itself expiring after its last entry)."""
    now = time.time()
    for event_id in event_ids:
        pipe.expire(k("turn", event_id), LEAVING_TTL_S)
    pipe.zadd(k("leaving"), dict.fromkeys(event_ids, now + LEAVING_TTL_S))
    pipe.zremrangebyscore(k("leaving"), "-inf", now - CLOCK_SLACK_S)
    pipe.expire(k("leaving"), LEAVING_TTL_S + CLOCK_SLACK_S)


def _queue_user_meta(
    pipe: Pipeline, k: Callable[..., str], newest: float | None, block: _UserBlock
) -> None:
    """Queue the user's turn version and counters, recurrence keys and heard phrases."""
    # The RPC's turn index re-syncs on a new tver; tall counts every turn ever written.
    pipe.hset(k("meta"), mapping={"tver": uuid.uuid4().hex, "newest": repr(newest)})
    if block.added:
        pipe.hincrby(k("meta"), "tall", block.added)
    if block.keys:
        pipe.hset(k("keys"), mapping={n: key_state_to_json(s) for n, s in block.keys.items()})
    if block.heard:
        pipe.sadd(k("heard"), *block.heard)


def _queue_clusters(
    pipe: Pipeline,
    k: Callable[..., str],
    state: ClusterState,
    base: tuple[str, int],
    block: _UserBlock,
) -> tuple[str, int]:
    """Queue the clusters changed and removed, the engine and the version step; (the
    generation, the index of the cver result in the pipeline)."""
    # Clusters written once, from the last state (each changed id's newest value).
    changed = [c for c in (state.cluster(i) for i in block.dirty) if c is not None]
    if changed:
        pipe.hset(k("clusters"), mapping={c.cluster_id: cluster_to_bytes(c) for c in changed})
    if block.removed:
        pipe.hdel(k("clusters"), *block.removed)
    generation = base[0] or uuid.uuid4().hex
    pipe.hset(k("meta"), mapping={"engine": engine_to_bytes(state), "cgen": generation})
    version_at = len(pipe.command_stack)
    pipe.hincrby(k("meta"), "cver", block.stepped)
    return generation, version_at


def _once_each(writes: Sequence[UserWrite]) -> None:
    """A user's updates come in one ``UserWrite``: its hot tier is read once per call."""
    users = [(w.tenant_id, w.user_id) for w in writes]
    if len(set(users)) != len(users):
        raise ValueError("apply_users: a user appears in more than one UserWrite")


def _creation_order(c: Cluster) -> tuple[int, float]:
    """The engine's order: clusters are numbered as they open (event times may not be)."""
    digits = c.cluster_id.lstrip("c")
    return (int(digits) if digits.isdigit() else -1, c.created_ts)
