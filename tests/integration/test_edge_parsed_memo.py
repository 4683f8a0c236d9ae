"""Qdrant Edge: reads memoise parsed memories by their stored JSON, so a search never
parses the same memory twice and still returns what the shard holds now."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memstream.stores import qdrant_edge_store
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from tests.integration.test_longterm_contract import DIM, memory_factory, unit_vectors


async def test_reads_see_every_write_and_stay_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qdrant_edge_store, "PARSED_MEMORIES", 8)
    store = QdrantEdgeStore(tmp_path / "shard")
    await store.ensure_collection(DIM)
    try:
        vectors = unit_vectors(np.random.default_rng(7), 20)
        first = memory_factory("acme", "u1", "topic:0", keys=["entity:order:A-1"])
        # The same key and vectors for another tenant's user: bait for a memo keyed too loosely.
        bait = memory_factory("globex", "u1", "topic:0", keys=["entity:order:A-1"])
        await store.upsert([(first, vectors[0]), (bait, vectors[0])])
        hit = (await store.search("acme", "u1", vectors[0], 1))[0].memory
        assert hit == first
        assert (await store.search("acme", "u1", vectors[0], 1))[0].memory is hit  # memoised
        assert await store.find_by_keys("acme", "u1", ["entity:order:A-1"], 5) == [first]
        assert await store.find_by_keys("globex", "u1", ["entity:order:A-1"], 5) == [bait]
        renamed = first.model_copy(update={"title": "Renamed"})
        await store.rewrite([renamed])
        assert (await store.search("acme", "u1", vectors[0], 1))[0].memory == renamed
        assert await store.find_by_keys("acme", "u1", ["entity:order:A-1"], 5) == [renamed]
        newer = first.model_copy(update={"title": "Newer", "version": 2})
        await store.upsert([(newer, vectors[0])])
        assert (await store.search("acme", "u1", vectors[0], 1))[0].memory == newer
        await store.upsert(
            [(memory_factory("acme", "u1", f"topic:{i}"), vectors[i]) for i in range(1, 20)]
        )
        assert len(await store.search("acme", "u1", vectors[0], 20)) == 20
        assert len(store._parsed) == 8
        await store.delete_user("acme", "u1")
        assert await store.search("acme", "u1", vectors[0], 5) == []
    finally:
        await store.close()
