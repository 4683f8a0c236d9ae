"""Qdrant Edge backend of `LongTermStore`: one in-process EdgeShard in a directory.

This module owns the shard's life: creating it (or loading what is on disk), its payload
indexes, and the housekeeping a server would do in the background but Edge leaves to its
caller — `flush()` (segments to disk, so the WAL stays short) and `optimize()` (merge and
vacuum segments). Both run inline, every `flush_every` / `optimize_every` changed points,
and on `close()`. An optimize that has work to do stalls the event loop for ~1-3 s (2-core
box); with segments capped it never re-merges the whole shard.

Payloads are compact (`stores.longterm.to_compact_payload`): the indexed fields plus the
whole memory as one JSON string. The bindings convert payload dicts value by value, so a
structured memory (nested facts, timeline, history) cost ~0.6 ms per point on every write
and every read; one string costs next to nothing. Shards written with structured payloads
still read (`from_payload` takes both forms) and turn compact as memories are rewritten.

Edge calls are synchronous and hold the GIL (a thread pool would not free the event
loop), so they are called directly: a user-filtered top-10 over a few hundred points
takes ~0.3 ms; bulk writes are cut into batches with a yield between them.
`upsert_bulk` is the fast path for loading many memories at once (rebuilds, benchmarks).

`search` and `find_by_keys` memoise parsed memories by their stored JSON (the same few
memories come back query after query). `search` ranks a cached user's vectors in numpy
(`stores.vector_cache`; loaded in the background on a user's first search) and reads only
the top-k payloads it has not read since their last write (`_hits`, by point id);
`find_by_keys` of a cached user takes its matches from the same cache's key index. Every
write that adds, re-vectors, re-keys or deletes memory points updates both caches
(`_wrote`, `_vectors.rekey`, `_vectors.drop`, `_forget_hits`): a new writer of points
must too.

One process at a time may open a shard directory (Edge locks its WAL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    FloatIndexParams,
    HasIdCondition,
    HnswIndexConfig,
    IsEmptyCondition,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Memory,
    Point,
    Query,
    QueryRequest,
    RangeFloat,
    ScrollRequest,
    UpdateOperation,
)

from memstream.schemas.memories import ConsolidatedMemory
from memstream.stores.longterm import (
    DECAY_FIELD,
    DUE_FIELD,
    MEMORY_JSON_FIELD,
    PAYLOAD_INDEXES,
    TURN_PAYLOAD_INDEXES,
    ArchivedTurn,
    LongTermStore,
    ScoredMemory,
    as_vector,
    canonical_id,
    check_page,
    decay_until,
    due_range,
    from_payload,
    missing_due,
    owned_by,
    prepare_points,
    prepare_turn_points,
    to_compact_payload,
    turn_from_payload,
    turn_point_id,
    turns_name,
)
from memstream.stores.vector_cache import Owner, UserVectors, VectorCache, point_bytes

if TYPE_CHECKING:
    from qdrant_edge import ConditionType, PointId

CONFIG_FILE = "edge_config.json"  # written by Edge itself at create time
MAX_SEGMENT_KB = 32_000
# Edge lays out a segment's points grouped by its tenant field when it optimizes. Every
# read here is one user's, so the user is that field: a user's vectors sit together and
# a 10k-memory user's filtered search runs ~2x faster than grouped by tenant. (Shards
# created before keep their indexes as they were: correct, just slower.)
TENANT_FIELD = "user_id"
# Memories kept parsed, keyed by their stored JSON (~5 KB each: ~20 MB). 1024 was fewer
# than one user's queries touch: 200 queries of a 10k-memory user bring ~1,600 distinct
# memories, and an LRU cycled through more than it holds misses every time.
PARSED_MEMORIES = 4096
# The search cache's budget: ~2 users of 10k memories, ~20 of 1k (float32 vectors).
VECTOR_CACHE_BYTES = 32 << 20
VECTOR_PAGE = 256  # points per scroll page while a user's vectors load (one loop slice)
TOO_BIG_KEPT = 1024  # users remembered as over the cache's budget (not loaded again)
# Users with fewer memories are left to Edge: reading k payloads by id costs about what
# Edge's whole filtered search does for them (1k memories in a 1M store: numpy + retrieve
# 1.0 ms, Edge 0.8 ms; at 10k: 1.6 against 2.2).
CACHE_MIN_POINTS = 4096
log = logging.getLogger("memstream.stores")


def turns_path(path: Path) -> Path:
    """The turn archive's shard directory beside the memories' one."""
    return path.parent / turns_name(path.name)


def _config(dim: int) -> EdgeConfig:
    return EdgeConfig(
        # Cold: vectors (and payloads) are mmapped and paged in as searches touch them,
        # not read into memory when the shard opens (Cached, the vectors' default). At 100k
        # memories: RSS after opening 304 -> 165 MiB, the resources benchmark's peak 815 ->
        # 635 MiB, a 10k-memory user's search p50/p99 unchanged (~1.7-2.1 / 2.4-2.7 ms)
        # while the files sit in the page cache. Fixed when a shard is created: shards made
        # before load with this config and keep their placement.
        vectors=EdgeVectorParams(size=dim, distance=Distance.Cosine, memory=Memory.Cold),
        payload_memory=Memory.Cold,  # Edge's default today; pinned so it cannot drift
        # m=0: no global HNSW graph. Every search is filtered to one user, whose few
        # points the payload index finds and scores exactly; a graph would cost minutes
        # of GIL-holding optimize() per 100k points and never be used.
        hnsw_config=HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000),
        # Per-user queries touch a handful of points: parallelism only adds overhead.
        max_search_threads=1,
        # Capped segments keep each optimize() proportional to what changed since the
        # last one (~1 s per 5k points here) instead of re-merging the whole shard.
        optimizers=EdgeOptimizersConfig(max_segment_size=MAX_SEGMENT_KB),
    )


def _owner_page(
    shard: EdgeShard | None, tenant_id: str, user_id: str, limit: int, offset: str | None
) -> tuple[list[Any], str | None]:
    """One page of a user's points (payloads, no vectors) and the next page's offset."""
    return _page(shard, _owner_filter(tenant_id, user_id), limit, offset)


def _page(
    shard: EdgeShard | None, conditions: list[ConditionType], limit: int, offset: str | None
) -> tuple[list[Any], str | None]:
    """One page of the points matching every condition (payloads, no vectors) and the next
    page's offset."""
    if shard is None:
        return [], None
    records, next_id = shard.scroll(
        ScrollRequest(
            offset=offset,
            limit=limit,
            filter=Filter(must=conditions),
            with_payload=True,
            with_vector=False,
        )
    )
    return list(records), None if next_id is None else str(next_id)


def _best(hits: list[ScoredMemory], limit: int) -> list[ScoredMemory]:
    """The top ``limit``, best first, ties by memory id: one order whichever points Edge
    scored (its own order among equal scores follows its storage, not the query)."""
    return sorted(hits, key=lambda h: (-h.score, h.memory.memory_id))[:limit]


def _keys(records: Sequence[Any]) -> list[list[str]]:
    """Each record's lookup keys (its payload's ``keys``)."""
    return [list((r.payload or {}).get("keys") or ()) for r in records]


def _owner_filter(tenant_id: str | None, user_id: str | None) -> list[ConditionType]:
    conditions: list[ConditionType] = []
    if tenant_id is not None:
        conditions.append(FieldCondition("tenant_id", match=MatchValue(tenant_id)))
    if user_id is not None:
        conditions.append(FieldCondition("user_id", match=MatchValue(user_id)))
    return conditions


class _Shard:
    """One EdgeShard directory: opened lazily, flushed and optimized every so many changes."""

    def __init__(
        self,
        path: Path,
        indexes: Sequence[str],
        *,
        flush_every: int,
        optimize_every: int,
    ) -> None:
        self.path = path
        self.indexes = tuple(indexes)
        self.flush_every = flush_every
        self.optimize_every = optimize_every
        self.shard: EdgeShard | None = None
        self.dim: int | None = None
        self.unflushed = 0
        self.unoptimized = 0

    def ensure(self, dim: int) -> EdgeShard:
        if self.shard is None:
            persisted = self.persisted_dim()
            if persisted is not None and persisted != dim:
                raise ValueError(f"shard at {self.path} holds vectors of {persisted}, not {dim}")
            if persisted is None:
                self.path.mkdir(parents=True, exist_ok=True)
                self.shard = EdgeShard.create(str(self.path), _config(dim))
            else:
                # Passing the config re-checks compatibility and applies our tuning.
                self.shard = self.load(_config(dim))
            self.dim = dim
        elif self.dim != dim:
            raise ValueError(f"shard at {self.path} holds vectors of {self.dim}, not {dim}")
        indexed = self.shard.info().payload_schema
        for name in self.indexes:
            if name not in indexed:
                # Cold: the index is read through mmap, not built in RAM when the shard
                # opens. At 100k memories: anonymous RSS after opening 87 -> 49 MiB, RSS
                # after 400 user-filtered searches 305 -> 274 MiB, search p50 unchanged
                # (~0.5 ms). Fixed when an index is created: older shards keep theirs.
                schema = KeywordIndexParams(is_tenant=name == TENANT_FIELD, memory=Memory.Cold)
                self.shard.update(UpdateOperation.create_field_index(name, schema))
        return self.shard

    def close(self) -> None:
        shard, self.shard = self.shard, None
        if shard is None:
            return
        try:
            if self.unoptimized:
                shard.optimize()
            shard.flush()
        finally:
            shard.close()
            self.unflushed = self.unoptimized = 0

    def persisted_dim(self) -> int | None:
        """The vector size of the shard on disk, or None when there is no shard yet."""
        try:
            config: dict[str, Any] = json.loads((self.path / CONFIG_FILE).read_text())
        except FileNotFoundError:
            return None
        return int(config["vectors"][""]["size"])

    def load(self, config: EdgeConfig | None) -> EdgeShard:
        try:
            return EdgeShard.load(str(self.path), config)
        except Exception as error:  # Edge raises bare Exception; say what usually went wrong
            raise RuntimeError(
                f"cannot open the Qdrant Edge shard at {self.path} "
                f"(is another process holding it?): {error}"
            ) from error

    def open_existing(self) -> EdgeShard | None:
        """The open shard, loading one already on disk (a reader need not know `dim`)."""
        if self.shard is None:
            self.dim = self.persisted_dim()
            if self.dim is None:
                return None
            self.shard = self.load(None)
        return self.shard

    def writable(self) -> EdgeShard:
        shard = self.open_existing()
        if shard is None:
            raise RuntimeError("call ensure_collection(dim) before writing to a new store")
        return shard

    def changed(self, shard: EdgeShard, points: int, *, force: bool = False) -> None:
        self.unflushed += points
        self.unoptimized += points
        if self.unoptimized and (force or self.unoptimized >= self.optimize_every):
            shard.optimize()
            self.unoptimized = 0
        if self.unflushed and (force or self.unflushed >= self.flush_every):
            shard.flush()
            self.unflushed = 0


class QdrantEdgeStore(LongTermStore):
    """`LongTermStore` on one EdgeShard stored under `path`, its turn archive beside it
    (`<path>_turns`, see `turns_path`)."""

    def __init__(
        self,
        path: Path,
        *,
        batch_size: int = 512,
        flush_every: int = 10_000,
        optimize_every: int = 5_000,
        vector_cache_bytes: int = VECTOR_CACHE_BYTES,
    ) -> None:
        self.path = Path(path)
        self._batch_size = batch_size
        self._parsed: OrderedDict[str, ConsolidatedMemory] = OrderedDict()
        # The cached search's hits by point id, with their owner: a hit read again needs no
        # payload read from the shard. Exact like the vector cache: every write of a memory
        # point forgets its id here (``_forget_hits``).
        self._hits: OrderedDict[str, tuple[Owner, ConsolidatedMemory]] = OrderedDict()
        # Users' vectors for numpy top-k (stores/vector_cache.py). Every write that adds,
        # re-vectors or deletes memory points must tell it (``_wrote`` / ``drop``).
        self._vectors = VectorCache(vector_cache_bytes)
        self._loading: dict[Owner, asyncio.Task[None]] = {}
        self._too_big: OrderedDict[Owner, None] = OrderedDict()
        # Users found under CACHE_MIN_POINTS, with their count then plus points written
        # since: loaded again once that reaches CACHE_MIN_POINTS.
        self._small: OrderedDict[Owner, int] = OrderedDict()
        self._memories = _Shard(
            self.path,
            [name for name, _ in PAYLOAD_INDEXES],
            flush_every=flush_every,
            optimize_every=optimize_every,
        )
        self._archive = _Shard(
            turns_path(self.path),
            [name for name, _ in TURN_PAYLOAD_INDEXES],
            flush_every=flush_every,
            optimize_every=optimize_every,
        )

    @property
    def _shard(self) -> EdgeShard | None:
        return self._memories.shard

    @property
    def _dim(self) -> int | None:
        return self._memories.dim

    # --- lifecycle -----------------------------------------------------------------

    async def ensure_collection(self, dim: int) -> None:
        shard = self._memories.ensure(dim)
        await self._index_due(shard)
        if DECAY_FIELD not in shard.info().payload_schema:  # not filled in: see `decay_due`
            self._index_float(shard, DECAY_FIELD)
        self._archive.ensure(dim)

    async def _index_due(self, shard: EdgeShard) -> None:
        """Index `DUE_FIELD`, filling it in first on memories stored before it existed.

        The index is created last, so it marks a finished backfill: a crash midway
        backfills again on the next open (the writes are idempotent). One pass over the
        shard, once per store (~the cost of one old-style reminders scan)."""
        if DUE_FIELD in shard.info().payload_schema:
            return
        filled = 0
        offset: PointId | None = None
        while True:
            records, offset = shard.scroll(
                ScrollRequest(offset=offset, limit=1024, with_payload=True, with_vector=False)
            )
            for record in records:
                times = missing_due(record.payload)
                if times:
                    shard.update(UpdateOperation.set_payload([record.id], {DUE_FIELD: times}))
                    filled += 1
            if offset is None:
                break
            await asyncio.sleep(0)
        self._index_float(shard, DUE_FIELD)
        self._changed(shard, filled)

    @staticmethod
    def _index_float(shard: EdgeShard, name: str) -> None:
        # Cold like the keyword indexes: read through mmap, not held in RAM.
        cold = FloatIndexParams(memory=Memory.Cold)
        shard.update(UpdateOperation.create_field_index(name, cold))

    async def ping(self) -> bool:
        try:
            shard = self._open_existing()
            if shard is None:
                return False
            shard.info()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        loads = list(self._loading.values())
        for task in loads:
            task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.gather(*loads, return_exceptions=True)
        self._vectors.clear()
        self._hits.clear()
        try:
            self._memories.close()
        finally:
            self._archive.close()

    # --- writes --------------------------------------------------------------------

    async def upsert(self, memories: Sequence[tuple[ConsolidatedMemory, np.ndarray]]) -> None:
        shard = self._writable()
        points = prepare_points(memories, self._dim, to_compact_payload)
        for start in range(0, len(points), self._batch_size):
            if start:
                await asyncio.sleep(0)  # let the loop breathe during a bulk load
            batch = points[start : start + self._batch_size]
            shard.update(UpdateOperation.upsert_points([Point(*p) for p in batch]))
        self._wrote(shard, [(m.tenant_id, m.user_id, m.memory_id) for m, _ in memories])
        self._changed(shard, len(points))

    async def upsert_bulk(
        self, memories: Sequence[ConsolidatedMemory], vectors: np.ndarray, *, batch_size: int = 2048
    ) -> int:
        """Load many memories at once; the same result as `upsert(zip(memories, vectors))`.

        For rebuilds and benchmarks: vectors come as one (n, dim) array (checked once, not
        per row), points are built batch by batch, and the housekeeping (`optimize`,
        `flush`) runs once at the end instead of every `optimize_every` points. Returns
        the number of distinct memories written.
        """
        shard = self._writable()
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape != (len(memories), self._dim):
            raise ValueError(
                f"expected vectors of shape ({len(memories)}, {self._dim}), got {matrix.shape}"
            )
        if not np.all(np.isfinite(matrix)):
            raise ValueError("vectors have non-finite values")
        last: dict[str, int] = {}
        for row, memory in enumerate(memories):
            if canonical_id(memory.memory_id) is None:
                raise ValueError(f"memory_id must be a canonical UUID string: {memory.memory_id!r}")
            last.pop(memory.memory_id, None)  # re-insert: "last wins", in last-write order
            last[memory.memory_id] = row
        rows = list(last.values())
        for start in range(0, len(rows), batch_size):
            if start:
                await asyncio.sleep(0)
            chunk = rows[start : start + batch_size]
            batch = [
                Point(memories[r].memory_id, values, to_compact_payload(memories[r]))
                for r, values in zip(chunk, matrix[chunk].tolist(), strict=True)
            ]
            shard.update(UpdateOperation.upsert_points(batch))
        self._wrote(shard, [(m.tenant_id, m.user_id, m.memory_id) for m in memories])
        self._memories.changed(shard, len(rows), force=True)
        return len(rows)

    async def rewrite(self, memories: Sequence[ConsolidatedMemory]) -> int:
        shard = self._open_existing()
        latest = {m.memory_id: m for m in memories if canonical_id(m.memory_id) is not None}
        if shard is None or not latest:
            return 0
        self._forget_hits(list(latest))
        records = shard.retrieve(list(latest), with_payload=True, with_vector=False)
        written = 0
        for record in records:
            memory = latest[str(record.id)]
            if owned_by(record.payload, memory.tenant_id, memory.user_id):
                payload = to_compact_payload(memory)
                shard.update(UpdateOperation.overwrite_payload([memory.memory_id], payload))
                self._vectors.rekey(
                    (memory.tenant_id, memory.user_id), memory.memory_id, payload["keys"]
                )
                written += 1
        self._changed(shard, written)
        return written

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        shard = self._open_existing()
        if shard is None:
            return 0
        owner = Filter(must=_owner_filter(tenant_id, user_id))
        found = shard.count(CountRequest(exact=True, filter=owner))
        self._vectors.drop((tenant_id, user_id))
        self._forget_hits(owner=(tenant_id, user_id))
        self._too_big.pop((tenant_id, user_id), None)
        self._small.pop((tenant_id, user_id), None)
        if found:
            shard.update(UpdateOperation.delete_points_by_filter(owner))
            self._changed(shard, found)
        return found

    # --- reads ---------------------------------------------------------------------

    async def get_many(
        self, tenant_id: str, user_id: str, memory_ids: Sequence[str]
    ) -> list[ConsolidatedMemory]:
        shard = self._open_existing()
        ids = list(dict.fromkeys(i for i in memory_ids if canonical_id(i) is not None))
        if shard is None or not ids:
            return []
        # The owner in the filter, not checked on a fetched payload: another tenant's id
        # costs what an id that does not exist costs (no payload is read for it).
        owner = [HasIdCondition(set(ids)), *_owner_filter(tenant_id, user_id)]
        records, _ = _page(shard, owner, len(ids), None)
        payloads = {str(r.id): r.payload for r in records}
        return [from_payload(payloads[i]) for i in ids if i in payloads]

    async def search(
        self, tenant_id: str, user_id: str, vector: np.ndarray, limit: int
    ) -> list[ScoredMemory]:
        shard = self._open_existing()
        query = as_vector(vector, self._dim)
        if shard is None or limit <= 0:
            return []
        owner = (tenant_id, user_id)
        conditions = _owner_filter(tenant_id, user_id)
        cached = self._vectors.get(owner)
        if cached is not None:
            found = self._search_cached(shard, owner, cached, query, limit)
            if found is not None:
                return found
        else:
            self._load_vectors(owner)  # for the next searches; this one is Edge's alone
        asked = limit + 1
        hits = self._query(shard, query, asked, conditions)
        # Ties at the cut: read on until the tie ends, so ``_best`` sees every tied point.
        while len(hits) == asked and hits[-1].score == hits[limit - 1].score:
            asked *= 2
            hits = self._query(shard, query, asked, conditions)
        return _best(hits, limit)

    def _query(
        self, shard: EdgeShard, query: list[float], limit: int, conditions: list[ConditionType]
    ) -> list[ScoredMemory]:
        hits = shard.query(
            QueryRequest(
                limit=limit,
                query=Query.Nearest(query),
                filter=Filter(must=conditions),
                with_payload=True,
                with_vector=False,
            )
        )
        # Cosine: Edge normalises stored vectors, so the score is already the similarity.
        return [ScoredMemory(self._memory(h.payload), float(h.score)) for h in hits]

    def _search_cached(
        self,
        shard: EdgeShard,
        owner: Owner,
        cached: UserVectors,
        query: list[float],
        limit: int,
    ) -> list[ScoredMemory] | None:
        """The top ``limit`` by numpy over the cached vectors, payloads read from the shard;
        None (and the entry dropped) if the shard disagrees, so Edge answers instead."""
        q = np.asarray(query, dtype=np.float32)
        norm = np.float32(np.linalg.norm(q))
        if not norm > 0:
            return None
        top = cached.top(q / norm, limit)  # stored vectors are unit: the dot is the cosine
        if not top:
            return []
        found = self._cached_memories(shard, owner, [i for i, _ in top])
        if found is None:
            return None
        return [ScoredMemory(found[i], score) for i, score in top]

    def _cached_memories(
        self, shard: EdgeShard, owner: Owner, point_ids: Sequence[str]
    ) -> dict[str, ConsolidatedMemory] | None:
        """The owner's memories of ``point_ids``, from the kept hits, else read from the
        shard and kept; None (and the owner's caches dropped) if one is not the owner's
        there: the caches missed a write (never expected)."""
        known = {i: self._known_hit(owner, i) for i in point_ids}
        missing: list[PointId] = [i for i, memory in known.items() if memory is None]
        records = shard.retrieve(missing, with_payload=True, with_vector=False) if missing else []
        payloads = {str(r.id): r.payload for r in records}
        found: dict[str, ConsolidatedMemory] = {}
        for point_id, memory in known.items():
            if memory is None:
                payload = payloads.get(point_id)
                if payload is None or not owned_by(payload, *owner):
                    # The hits are kept exact by the same writes as the vectors: both go.
                    log.warning("search cache of %s/%s was stale; dropped", *owner)
                    self._vectors.drop(owner)
                    self._forget_hits(owner=owner)
                    return None
                memory = self._memory(payload)
                self._remember_hit(owner, point_id, memory)
            found[point_id] = memory
        return found

    def _known_hit(self, owner: Owner, point_id: str) -> ConsolidatedMemory | None:
        hit = self._hits.get(point_id)
        if hit is None or hit[0] != owner:
            return None
        self._hits.move_to_end(point_id)
        return hit[1]

    def _remember_hit(self, owner: Owner, point_id: str, memory: ConsolidatedMemory) -> None:
        self._hits[point_id] = (owner, memory)
        if len(self._hits) > PARSED_MEMORIES:
            self._hits.popitem(last=False)

    def _forget_hits(self, point_ids: Sequence[str] = (), owner: Owner | None = None) -> None:
        """Points were written (``point_ids``) or all of ``owner``'s deleted."""
        for point_id in point_ids:
            self._hits.pop(point_id, None)
        if owner is not None:
            for point_id in [i for i, (o, _) in self._hits.items() if o == owner]:
                del self._hits[point_id]

    def _load_vectors(self, owner: Owner) -> None:
        """Start reading ``owner``'s vectors into the cache in the background (if room)."""
        if self._vectors.max_bytes <= 0 or owner in self._loading or owner in self._too_big:
            return
        if owner in self._small:
            return
        task = asyncio.get_running_loop().create_task(self._read_vectors(owner))
        self._loading[owner] = task
        task.add_done_callback(lambda _: self._loading.pop(owner, None))

    async def _read_vectors(self, owner: Owner) -> None:
        """Page through the user's points, yielding between pages (a scroll holds the GIL:
        ~10 ms a page); kept unless a write to the user came meanwhile."""
        shard = self._open_existing()
        if shard is None or self._dim is None:
            return
        where = Filter(must=_owner_filter(*owner))
        # Counted first, from the payload index: a scroll would read every vector and
        # payload of a user that then proves too small or too big to keep (file pages a
        # process keeps mapped, for nothing).
        points = shard.count(CountRequest(exact=True, filter=where))
        if points < CACHE_MIN_POINTS:
            self._note_small(owner, points)
            return
        if points * point_bytes(self._dim) > self._vectors.max_bytes:
            self._note_too_big(owner)
            return
        token = self._vectors.begin(owner)
        entry = UserVectors(self._dim)
        offset: PointId | None = None
        try:
            while True:
                records, offset = shard.scroll(
                    ScrollRequest(
                        offset=offset,
                        limit=VECTOR_PAGE,
                        filter=where,
                        with_payload=["keys"],
                        with_vector=True,
                    )
                )
                if records:
                    vectors = np.asarray([r.vector for r in records], dtype=np.float32)
                    entry.put([str(r.id) for r in records], vectors, _keys(records))
                if entry.trimmed_nbytes > self._vectors.max_bytes:  # grown since counted
                    self._note_too_big(owner)
                    return
                if offset is None:
                    break
                await asyncio.sleep(0)
                if self._shard is not shard:
                    return  # closed meanwhile
        except Exception:  # a failed load only means Edge keeps answering alone
            log.exception("loading the search cache of %s/%s failed", *owner)
        else:
            if len(entry.ids) < CACHE_MIN_POINTS:  # deleted from since counted
                self._note_small(owner, len(entry.ids))
            else:
                self._vectors.store(owner, entry, token)
        finally:
            self._vectors.abandon(owner)

    def _note_small(self, owner: Owner, points: int) -> None:
        """Left to Edge until ``CACHE_MIN_POINTS`` (``_wrote`` counts on from ``points``)."""
        self._small[owner] = points
        if len(self._small) > TOO_BIG_KEPT:
            self._small.popitem(last=False)

    def _note_too_big(self, owner: Owner) -> None:
        self._too_big[owner] = None
        if len(self._too_big) > TOO_BIG_KEPT:
            self._too_big.popitem(last=False)

    def _wrote(self, shard: EdgeShard, written: Sequence[tuple[str, str, str]]) -> None:
        """Points (tenant, user, id) were upserted: their users' cached vectors become what
        the shard now holds (read back: Edge's normalised floats exactly)."""
        self._forget_hits([point_id for _, _, point_id in written])
        by_owner: dict[Owner, list[str]] = {}
        for tenant_id, user_id, point_id in written:
            by_owner.setdefault((tenant_id, user_id), []).append(point_id)
        for owner, ids in by_owner.items():
            if owner in self._small:
                self._small[owner] += len(ids)
                if self._small[owner] >= CACHE_MIN_POINTS:
                    del self._small[owner]  # grown: the next search loads it
            if owner not in self._vectors:
                self._vectors.touch(owner)
                continue
            point_ids: list[PointId] = list(dict.fromkeys(ids))
            records = shard.retrieve(point_ids, with_payload=True, with_vector=True)
            mine = [r for r in records if owned_by(r.payload, *owner)]
            vectors = np.asarray([r.vector for r in mine], dtype=np.float32)
            self._vectors.put(owner, [str(r.id) for r in mine], vectors, _keys(mine))

    def _memory(self, payload: dict[str, Any] | None) -> ConsolidatedMemory:
        """``from_payload``, memoised by the stored JSON (the same few memories come back
        query after query, and parsing one costs ~25 us; the models are frozen)."""
        dumped = payload.get(MEMORY_JSON_FIELD) if payload is not None else None
        if not isinstance(dumped, str):
            return from_payload(payload)
        memory = self._parsed.get(dumped)
        if memory is None:
            memory = from_payload(payload)
            self._parsed[dumped] = memory
            if len(self._parsed) > PARSED_MEMORIES:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(dumped)
        return memory

    async def find_by_keys(
        self, tenant_id: str, user_id: str, keys: Sequence[str], limit: int
    ) -> list[ConsolidatedMemory]:
        shard = self._open_existing()
        if shard is None or not keys or limit <= 0:
            return []
        owner = (tenant_id, user_id)
        cached = self._vectors.get(owner)
        if cached is not None:
            matched = cached.with_keys(keys)[:limit]  # in Edge's scroll order
            found = self._cached_memories(shard, owner, matched)
            if found is not None:
                return [found[i] for i in matched]
        conditions = _owner_filter(tenant_id, user_id)
        conditions.append(FieldCondition("keys", match=MatchAny(list(dict.fromkeys(keys)))))
        records, _ = shard.scroll(
            ScrollRequest(
                limit=limit, filter=Filter(must=conditions), with_payload=True, with_vector=False
            )
        )
        return [self._memory(r.payload) for r in records]

    async def list_user(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "list_user")
        records, next_offset = _owner_page(self._open_existing(), tenant_id, user_id, limit, offset)
        return [from_payload(r.payload) for r in records], next_offset

    async def scan(
        self, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "scan")
        records, next_offset = _page(self._open_existing(), [], limit, offset)
        return [from_payload(r.payload) for r in records], next_offset

    async def due_between(
        self, since: datetime, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "due_between")
        low, high = due_range(since, until)
        due = FieldCondition(DUE_FIELD, range=RangeFloat(gte=low, lte=high))
        records, next_offset = _page(self._open_existing(), [due], limit, offset)
        return [from_payload(r.payload) for r in records], next_offset

    async def decay_due(
        self, tenant_id: str, user_id: str, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "decay_due")
        behind = FieldCondition(DECAY_FIELD, range=RangeFloat(lte=decay_until(until)))
        unindexed = IsEmptyCondition(DECAY_FIELD)  # stored before the field existed
        conditions = [*_owner_filter(tenant_id, user_id), Filter(should=[behind, unindexed])]
        records, next_offset = _page(self._open_existing(), conditions, limit, offset)
        return [from_payload(r.payload) for r in records], next_offset

    async def count(self, tenant_id: str | None = None, user_id: str | None = None) -> int:
        shard = self._open_existing()
        if shard is None:
            return 0
        conditions = _owner_filter(tenant_id, user_id)
        owner = Filter(must=conditions) if conditions else None
        return shard.count(CountRequest(exact=True, filter=owner))

    # --- the turn archive ----------------------------------------------------------

    async def upsert_turns(self, turns: Sequence[ArchivedTurn]) -> int:
        shard = self._archive.writable()
        points = prepare_turn_points(turns, self._archive.dim)
        for start in range(0, len(points), self._batch_size):
            if start:
                await asyncio.sleep(0)
            batch = points[start : start + self._batch_size]
            shard.update(UpdateOperation.upsert_points([Point(*p) for p in batch]))
        self._archive.changed(shard, len(points))
        return len(points)

    async def list_turns(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ArchivedTurn], str | None]:
        check_page(limit, offset, "list_turns")
        shard = self._archive.open_existing()
        records, next_offset = _owner_page(shard, tenant_id, user_id, limit, offset)
        return [turn_from_payload(r.payload) for r in records], next_offset

    async def get_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[ArchivedTurn]:
        shard = self._archive.open_existing()
        ids: list[PointId] = list(
            dict.fromkeys(turn_point_id(tenant_id, user_id, e) for e in event_ids)
        )
        if shard is None or not ids:
            return []
        records = shard.retrieve(ids, with_payload=True, with_vector=False)
        payloads = {str(r.id): r.payload for r in records}
        return [
            turn_from_payload(payloads[str(i)])
            for i in ids
            if str(i) in payloads and owned_by(payloads[str(i)], tenant_id, user_id)
        ]

    async def count_turns(self, tenant_id: str | None = None, user_id: str | None = None) -> int:
        shard = self._archive.open_existing()
        if shard is None:
            return 0
        conditions = _owner_filter(tenant_id, user_id)
        owner = Filter(must=conditions) if conditions else None
        return shard.count(CountRequest(exact=True, filter=owner))

    async def delete_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str] | None = None
    ) -> int:
        shard = self._archive.open_existing()
        if shard is None:
            return 0
        if event_ids is not None:
            ids: list[PointId] = list(
                dict.fromkeys(turn_point_id(tenant_id, user_id, e) for e in event_ids)
            )
            records = shard.retrieve(ids, with_payload=True, with_vector=False) if ids else []
            owned: list[PointId] = [
                r.id for r in records if owned_by(r.payload, tenant_id, user_id)
            ]
            if owned:
                shard.update(UpdateOperation.delete_points(owned))
                self._archive.changed(shard, len(owned))
            return len(owned)
        owner = Filter(must=_owner_filter(tenant_id, user_id))
        found = shard.count(CountRequest(exact=True, filter=owner))
        if found:
            shard.update(UpdateOperation.delete_points_by_filter(owner))
            self._archive.changed(shard, found)
        return found

    # --- internals ---------------------------------------------------------------

    def _open_existing(self) -> EdgeShard | None:
        return self._memories.open_existing()

    def _writable(self) -> EdgeShard:
        return self._memories.writable()

    def _changed(self, shard: EdgeShard, points: int) -> None:
        self._memories.changed(shard, points)
