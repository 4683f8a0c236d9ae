"""Qdrant Edge: the bulk path and the compact payload keep the store's contract.

- `upsert_bulk` leaves the store as `upsert` of the same pairs would (last occurrence of an
  id wins) and rejects what `upsert` rejects.
- Points are stored compact (indexed fields + one JSON string), and a shard written with
  the older structured payloads still reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from qdrant_edge import Point, UpdateOperation

from memstream.stores.longterm import DECAY_FIELD, MEMORY_JSON_FIELD, to_payload
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from tests.integration.test_longterm_contract import DIM, memory_factory, unit_vectors


async def test_bulk_matches_upsert(tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    memories = [memory_factory("acme", f"u{i % 3}", f"topic:{i}") for i in range(40)]
    memories.append(memory_factory("acme", "u0", "topic:0", title="replaced", version=2))
    vectors = unit_vectors(rng, len(memories))
    bulk, plain = QdrantEdgeStore(tmp_path / "bulk"), QdrantEdgeStore(tmp_path / "plain")
    try:
        for store in (bulk, plain):
            await store.ensure_collection(DIM)
        assert await bulk.upsert_bulk(memories, vectors, batch_size=7) == 40
        await plain.upsert(list(zip(memories, vectors, strict=True)))
        assert await bulk.count() == await plain.count() == 40
        for user in ("u0", "u1", "u2"):
            assert await bulk.list_user("acme", user, 50) == await plain.list_user("acme", user, 50)
            for query in unit_vectors(rng, 3):
                a, b = (
                    await bulk.search("acme", user, query, 5),
                    await plain.search("acme", user, query, 5),
                )
                assert [h.memory for h in a] == [h.memory for h in b]
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-6)
        assert (await bulk.get("acme", "u0", memories[0].memory_id)).title == "replaced"
        hits = await bulk.search("acme", "u0", vectors[-1], 1)
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)  # the last vector won too
    finally:
        await bulk.close()
        await plain.close()


async def test_bulk_rejects_bad_input(tmp_path: Path) -> None:
    store = QdrantEdgeStore(tmp_path / "shard")
    with pytest.raises(RuntimeError, match="ensure_collection"):
        await store.upsert_bulk([memory_factory()], unit_vectors(np.random.default_rng(1), 1))
    await store.ensure_collection(DIM)
    try:
        good = unit_vectors(np.random.default_rng(2), 2)
        with pytest.raises(ValueError, match="shape"):
            await store.upsert_bulk([memory_factory()], good)
        with pytest.raises(ValueError, match="shape"):
            await store.upsert_bulk([memory_factory()], good[:1, :-1])
        with pytest.raises(ValueError, match="non-finite"):
            await store.upsert_bulk([memory_factory()], np.full((1, DIM), np.inf))
        bad_id = memory_factory().model_copy(update={"memory_id": "k1"})
        with pytest.raises(ValueError, match="UUID"):
            await store.upsert_bulk([bad_id], good[:1])
        assert await store.count() == 0
    finally:
        await store.close()


async def test_payload_is_compact_and_structured_shards_still_read(tmp_path: Path) -> None:
    store = QdrantEdgeStore(tmp_path / "shard")
    await store.ensure_collection(DIM)
    new, old = memory_factory("acme", "u1", "topic:new"), memory_factory("acme", "u1", "topic:old")
    vectors = unit_vectors(np.random.default_rng(3), 2)
    try:
        await store.upsert([(new, vectors[0])])
        shard = store._shard
        assert shard is not None
        # A point as the store wrote it before payloads were compact.
        shard.update(
            UpdateOperation.upsert_points(
                [Point(old.memory_id, vectors[1].tolist(), to_payload(old))]
            )
        )
        (record,) = shard.retrieve([new.memory_id], with_payload=True, with_vector=False)
        # The indexed fields, the derived ones (no action is due: no due times), the JSON.
        compact = {"tenant_id", "user_id", "key", "keys", DECAY_FIELD, MEMORY_JSON_FIELD}
        assert set(record.payload) == compact
        assert await store.get("acme", "u1", old.memory_id) == old
        assert await store.get("acme", "u2", old.memory_id) is None
        hits = await store.search("acme", "u1", vectors[1], 2)
        assert [h.memory for h in hits] == [old, new]
        assert await store.find_by_keys("acme", "u1", ["topic:old", "topic:new"], 5) in (
            [old, new],
            [new, old],
        )
    finally:
        await store.close()
