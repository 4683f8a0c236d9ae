"""qdrant-client backend of `LongTermStore`: a Qdrant server or cluster, or local mode.

This module owns the collection on the server: creating it (cosine vectors, payload
indexes, multitenant HNSW settings), checking an existing one, and mapping the contract's
calls onto `AsyncQdrantClient`. `url=":memory:"` runs qdrant-client's in-process local
mode (tests, quick experiments): same API, brute-force search, no payload indexes.
The turn archive is a second collection, `<collection>_turns`, made the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import datetime

import numpy as np
from qdrant_client import AsyncQdrantClient, models

from memstream.schemas.memories import ConsolidatedMemory
from memstream.stores.longterm import (
    DECAY_FIELD,
    DUE_FIELD,
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
    to_payload,
    turn_from_payload,
    turn_point_id,
    turns_name,
)

LOCAL = ":memory:"
_LOCAL_INDEX_WARNING = "Payload indexes have no effect in the local Qdrant"


def _owner_filter(tenant_id: str | None, user_id: str | None) -> list[models.Condition]:
    conditions: list[models.Condition] = []
    for field, value in (("tenant_id", tenant_id), ("user_id", user_id)):
        if value is not None:
            conditions.append(
                models.FieldCondition(key=field, match=models.MatchValue(value=value))
            )
    return conditions


class QdrantClientStore(LongTermStore):
    """`LongTermStore` on one collection reached through `AsyncQdrantClient`."""

    def __init__(
        self, url: str, collection: str, *, api_key: str | None = None, batch_size: int = 256
    ) -> None:
        if not url:
            raise ValueError('the qdrant client backend needs a url (or ":memory:")')
        self.collection = collection
        self.turns_collection = turns_name(collection)
        self.local = url == LOCAL
        self._client = (
            AsyncQdrantClient(location=LOCAL)
            if self.local
            else AsyncQdrantClient(url=url, api_key=api_key)
        )
        self._batch_size = batch_size
        self._dim: int | None = None
        self._exists = False  # cached once seen: collections are never dropped under us
        self._turns_exist = False

    # --- lifecycle -----------------------------------------------------------------

    async def ensure_collection(self, dim: int) -> None:
        for name in (self.collection, self.turns_collection):
            await self._create(name, dim)
        self._exists = self._turns_exist = True
        self._dim = dim
        await self._ensure_indexes(self.collection, PAYLOAD_INDEXES)
        await self._ensure_indexes(self.turns_collection, TURN_PAYLOAD_INDEXES)
        await self._index_derived()

    async def _create(self, name: str, dim: int) -> None:
        if not await self._client.collection_exists(name):
            try:
                await self._client.create_collection(
                    name,
                    vectors_config=models.VectorParams(size=dim, distance=models.Distance.COSINE),
                    # Qdrant's multitenancy setup: no global graph, one graph per tenant.
                    hnsw_config=models.HnswConfigDiff(m=0, payload_m=16),
                )
            except Exception:
                # Another process may have created it first; anything else re-raises.
                if not await self._client.collection_exists(name):
                    raise
        stored = await self._stored_dim(name)
        if stored != dim:
            raise ValueError(f"collection {name} holds vectors of {stored}, not {dim}")

    async def ping(self) -> bool:
        try:
            return await self._ready()
        except Exception:
            return False

    async def close(self) -> None:
        await self._client.close()

    # --- writes --------------------------------------------------------------------

    async def upsert(self, memories: Sequence[tuple[ConsolidatedMemory, np.ndarray]]) -> None:
        if not await self._ready():
            raise RuntimeError("call ensure_collection(dim) before writing to a new store")
        if self._dim is None:
            self._dim = await self._stored_dim(self.collection)
        points = prepare_points(memories, self._dim)
        for start in range(0, len(points), self._batch_size):
            batch = points[start : start + self._batch_size]
            await self._client.upsert(
                self.collection,
                [models.PointStruct(id=i, vector=v, payload=p) for i, v, p in batch],
                wait=True,
            )

    async def rewrite(self, memories: Sequence[ConsolidatedMemory]) -> int:
        latest = {m.memory_id: m for m in memories if canonical_id(m.memory_id) is not None}
        if not latest or not await self._ready():
            return 0
        records = await self._client.retrieve(
            self.collection, list(latest), with_payload=True, with_vectors=False
        )
        written = 0
        for record in records:
            memory = latest[str(record.id)]
            if owned_by(record.payload, memory.tenant_id, memory.user_id):
                await self._client.overwrite_payload(
                    self.collection, to_payload(memory), points=[memory.memory_id], wait=True
                )
                written += 1
        return written

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        if not await self._ready():
            return 0
        owner = models.Filter(must=_owner_filter(tenant_id, user_id))
        found = (await self._client.count(self.collection, count_filter=owner, exact=True)).count
        if found:
            await self._client.delete(
                self.collection, points_selector=models.FilterSelector(filter=owner), wait=True
            )
        return found

    # --- reads ---------------------------------------------------------------------

    async def get_many(
        self, tenant_id: str, user_id: str, memory_ids: Sequence[str]
    ) -> list[ConsolidatedMemory]:
        ids = list(dict.fromkeys(i for i in memory_ids if canonical_id(i) is not None))
        if not ids or not await self._ready():
            return []
        # The owner in the filter, not checked on a fetched payload: another tenant's id
        # costs what an id that does not exist costs (no payload is read for it).
        owner = [models.HasIdCondition(has_id=list(ids)), *_owner_filter(tenant_id, user_id)]
        records, _ = await self._client.scroll(
            self.collection,
            scroll_filter=models.Filter(must=owner),
            limit=len(ids),
            with_payload=True,
            with_vectors=False,
        )
        payloads = {str(r.id): r.payload for r in records}
        return [from_payload(payloads[i]) for i in ids if i in payloads]

    async def search(
        self, tenant_id: str, user_id: str, vector: np.ndarray, limit: int
    ) -> list[ScoredMemory]:
        query = as_vector(vector, self._dim)
        if limit <= 0 or not await self._ready():
            return []
        response = await self._client.query_points(
            self.collection,
            query=query,
            query_filter=models.Filter(must=_owner_filter(tenant_id, user_id)),
            limit=limit,
            with_payload=True,
            with_vectors=False,
        )
        return [ScoredMemory(from_payload(p.payload), float(p.score)) for p in response.points]

    async def find_by_keys(
        self, tenant_id: str, user_id: str, keys: Sequence[str], limit: int
    ) -> list[ConsolidatedMemory]:
        if not keys or limit <= 0 or not await self._ready():
            return []
        conditions = _owner_filter(tenant_id, user_id)
        conditions.append(
            models.FieldCondition(key="keys", match=models.MatchAny(any=list(dict.fromkeys(keys))))
        )
        records, _ = await self._client.scroll(
            self.collection,
            scroll_filter=models.Filter(must=conditions),
            limit=limit,
            with_payload=True,
            with_vectors=False,
        )
        return [from_payload(r.payload) for r in records]

    async def list_user(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "list_user")
        return await self._page(_owner_filter(tenant_id, user_id), limit, offset)

    async def _page(
        self, conditions: list[models.Condition], limit: int, offset: str | None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        """One page of the memories matching every condition, and the next page's offset."""
        if not await self._ready():
            return [], None
        records, next_id = await self._client.scroll(
            self.collection,
            scroll_filter=models.Filter(must=conditions),
            limit=limit,
            offset=offset,
            with_payload=True,
            with_vectors=False,
        )
        return [from_payload(r.payload) for r in records], None if next_id is None else str(next_id)

    async def scan(
        self, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "scan")
        return await self._page([], limit, offset)

    async def due_between(
        self, since: datetime, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "due_between")
        low, high = due_range(since, until)
        due = models.FieldCondition(key=DUE_FIELD, range=models.Range(gte=low, lte=high))
        return await self._page([due], limit, offset)

    async def decay_due(
        self, tenant_id: str, user_id: str, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        check_page(limit, offset, "decay_due")
        behind = models.FieldCondition(key=DECAY_FIELD, range=models.Range(lte=decay_until(until)))
        # Or stored before the field existed.
        unindexed = models.IsEmptyCondition(is_empty=models.PayloadField(key=DECAY_FIELD))
        either = models.Filter(should=[behind, unindexed])
        return await self._page([*_owner_filter(tenant_id, user_id), either], limit, offset)

    async def count(self, tenant_id: str | None = None, user_id: str | None = None) -> int:
        if not await self._ready():
            return 0
        conditions = _owner_filter(tenant_id, user_id)
        result = await self._client.count(
            self.collection,
            count_filter=models.Filter(must=conditions) if conditions else None,
            exact=True,
        )
        return result.count

    # --- the turn archive ----------------------------------------------------------

    async def upsert_turns(self, turns: Sequence[ArchivedTurn]) -> int:
        if not await self._turns_ready():
            raise RuntimeError("call ensure_collection(dim) before writing to a new store")
        if self._dim is None:
            self._dim = await self._stored_dim(self.turns_collection)
        points = prepare_turn_points(turns, self._dim)
        for start in range(0, len(points), self._batch_size):
            batch = points[start : start + self._batch_size]
            await self._client.upsert(
                self.turns_collection,
                [models.PointStruct(id=i, vector=v, payload=p) for i, v, p in batch],
                wait=True,
            )
        return len(points)

    async def list_turns(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ArchivedTurn], str | None]:
        check_page(limit, offset, "list_turns")
        if not await self._turns_ready():
            return [], None
        records, next_id = await self._client.scroll(
            self.turns_collection,
            scroll_filter=models.Filter(must=_owner_filter(tenant_id, user_id)),
            limit=limit,
            offset=offset,
            with_payload=True,
            with_vectors=False,
        )
        found = [turn_from_payload(r.payload) for r in records]
        return found, None if next_id is None else str(next_id)

    async def get_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[ArchivedTurn]:
        ids = list(dict.fromkeys(turn_point_id(tenant_id, user_id, e) for e in event_ids))
        if not ids or not await self._turns_ready():
            return []
        records = await self._client.retrieve(
            self.turns_collection, ids, with_payload=True, with_vectors=False
        )
        payloads = {str(r.id): r.payload for r in records}
        return [
            turn_from_payload(payloads[i])
            for i in ids
            if i in payloads and owned_by(payloads[i], tenant_id, user_id)
        ]

    async def count_turns(self, tenant_id: str | None = None, user_id: str | None = None) -> int:
        if not await self._turns_ready():
            return 0
        conditions = _owner_filter(tenant_id, user_id)
        result = await self._client.count(
            self.turns_collection,
            count_filter=models.Filter(must=conditions) if conditions else None,
            exact=True,
        )
        return result.count

    async def delete_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str] | None = None
    ) -> int:
        if not await self._turns_ready():
            return 0
        if event_ids is not None:
            ids = list(dict.fromkeys(turn_point_id(tenant_id, user_id, e) for e in event_ids))
            records = (
                await self._client.retrieve(
                    self.turns_collection, ids, with_payload=True, with_vectors=False
                )
                if ids
                else []
            )
            owned: list[models.ExtendedPointId] = [
                r.id for r in records if owned_by(r.payload, tenant_id, user_id)
            ]
            if owned:
                await self._client.delete(
                    self.turns_collection,
                    points_selector=models.PointIdsList(points=owned),
                    wait=True,
                )
            return len(owned)
        owner = models.Filter(must=_owner_filter(tenant_id, user_id))
        found = (
            await self._client.count(self.turns_collection, count_filter=owner, exact=True)
        ).count
        if found:
            await self._client.delete(
                self.turns_collection,
                points_selector=models.FilterSelector(filter=owner),
                wait=True,
            )
        return found

    # --- internals -----------------------------------------------------------------

    async def _ready(self) -> bool:
        if not self._exists:
            self._exists = await self._client.collection_exists(self.collection)
        return self._exists

    async def _turns_ready(self) -> bool:
        if not self._turns_exist:
            self._turns_exist = await self._client.collection_exists(self.turns_collection)
        return self._turns_exist

    async def _stored_dim(self, name: str) -> int:
        info = await self._client.get_collection(name)
        vectors = info.config.params.vectors
        if not isinstance(vectors, models.VectorParams):
            raise ValueError(f"collection {name} does not have one unnamed dense vector")
        return vectors.size

    async def _index_derived(self) -> None:
        """Index `DUE_FIELD`, filling it in first on memories stored before it existed, and
        `DECAY_FIELD` (not filled in: see `decay_due`).

        The due index is created after its backfill, so it marks a finished one (a crash
        midway backfills again next time). Local mode records no indexes, so there it runs on
        every call: a scan of a test-sized collection."""
        info = await self._client.get_collection(self.collection)
        new = [f for f in (DUE_FIELD, DECAY_FIELD) if f not in info.payload_schema]
        offset: models.ExtendedPointId | None = None
        while DUE_FIELD in new:
            records, offset = await self._client.scroll(
                self.collection, limit=1024, offset=offset, with_payload=True, with_vectors=False
            )
            fills = [
                models.SetPayloadOperation(
                    set_payload=models.SetPayload(payload={DUE_FIELD: times}, points=[r.id])
                )
                for r in records
                if (times := missing_due(r.payload))
            ]
            if fills:
                await self._client.batch_update_points(self.collection, fills, wait=True)
            if offset is None:
                break
        with warnings.catch_warnings():
            if self.local:
                warnings.filterwarnings(
                    "ignore", message=_LOCAL_INDEX_WARNING, category=UserWarning
                )
            for name in new:
                await self._client.create_payload_index(
                    self.collection, name, models.PayloadSchemaType.FLOAT, wait=True
                )

    async def _ensure_indexes(self, name: str, indexes: tuple[tuple[str, bool], ...]) -> None:
        info = await self._client.get_collection(name)
        for field, is_tenant in indexes:
            if field in info.payload_schema:
                continue
            schema = models.KeywordIndexParams(
                type=models.KeywordIndexType.KEYWORD,
                is_tenant=is_tenant,
                # Graphs per value only pay off for the tenant field; keys are exact lookups.
                enable_hnsw=is_tenant,
            )
            with warnings.catch_warnings():
                # Local mode warns that indexes are no-ops there; that is expected, not news.
                if self.local:
                    warnings.filterwarnings(
                        "ignore", message=_LOCAL_INDEX_WARNING, category=UserWarning
                    )
                await self._client.create_payload_index(name, field, schema, wait=True)
