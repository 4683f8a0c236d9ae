"""Qdrant Edge: searches picked through the in-process vector cache (stores/vector_cache.py)
give exactly what Edge's own search gives, see every write at once, and never cross an owner.

Real Edge shards throughout; ``edge_only`` is a second store over the same memories with
the cache off, the reference every cached answer is compared with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from memstream.schemas import ConsolidatedMemory
from memstream.stores import qdrant_edge_store
from memstream.stores.longterm import ScoredMemory
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.vector_cache import UserVectors, VectorCache
from tests.integration.test_longterm_contract import DIM, memory_factory, unit_vectors

Pairs = list[tuple[ConsolidatedMemory, np.ndarray]]


def _memories(tenant: str, user: str, n: int, rng: np.random.Generator) -> Pairs:
    vectors = unit_vectors(rng, n)
    return [(memory_factory(tenant, user, f"topic:{i}"), vectors[i]) for i in range(n)]


async def _loaded(store: QdrantEdgeStore, tenant: str, user: str) -> None:
    """Search once (which starts the load) and wait until the user's vectors are cached."""
    await store.search(tenant, user, unit_vectors(np.random.default_rng(0), 1)[0], 1)
    for _ in range(500):
        if (tenant, user) in store._vectors:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{tenant}/{user} never got cached")


def _same(cached: list[ScoredMemory], edge: list[ScoredMemory]) -> None:
    assert [h.memory for h in cached] == [h.memory for h in edge]
    # numpy's float32 cosines against Edge's: the same up to rounding.
    assert [h.score for h in cached] == pytest.approx([h.score for h in edge], abs=1e-6)


@pytest.fixture(autouse=True)
def cache_small_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests cache users of a few memories (the default leaves them to Edge)."""
    monkeypatch.setattr(qdrant_edge_store, "CACHE_MIN_POINTS", 1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[QdrantEdgeStore]:
    s = QdrantEdgeStore(tmp_path / "shard")
    await s.ensure_collection(DIM)
    yield s
    await s.close()


async def test_cached_search_is_edges_search(store: QdrantEdgeStore, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    pairs = _memories("acme", "u1", 300, rng)
    # Exact ties (memories made from the same turns share a vector): both go by id.
    for i in range(0, 40, 4):
        pairs[i + 1] = (pairs[i + 1][0], pairs[i][1])
        pairs[i + 2] = (pairs[i + 2][0], pairs[i][1])
    await store.upsert(pairs + _memories("acme", "u2", 50, rng))
    await _loaded(store, "acme", "u1")
    queries = [*unit_vectors(rng, 20), *(p[1] for p in pairs[:40:4])]
    answers = [[await store.search("acme", "u1", q, k) for q in queries] for k in (1, 8, 400)]
    await store.close()  # the shard has one owner at a time: now the reference reads it
    edge_only = QdrantEdgeStore(tmp_path / "shard", vector_cache_bytes=0)
    try:
        for k, cached in zip((1, 8, 400), answers, strict=True):
            for q, hits in zip(queries, cached, strict=True):
                _same(hits, await edge_only.search("acme", "u1", q, k))
        assert len(answers[2][0]) == 300  # a limit past the user's count: all of them
    finally:
        await edge_only.close()


async def test_writes_are_seen_by_the_next_search(store: QdrantEdgeStore) -> None:
    rng = np.random.default_rng(2)
    pairs = _memories("acme", "u1", 40, rng)
    await store.upsert(pairs)
    await _loaded(store, "acme", "u1")
    query = unit_vectors(rng, 1)[0]
    # A new memory pointing at the query comes first, from the cache.
    new = memory_factory("acme", "u1", "topic:new", title="New")
    await store.upsert([(new, query)])
    assert ("acme", "u1") in store._vectors
    hits = await store.search("acme", "u1", query, 3)
    assert hits[0].memory == new
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    # An existing memory re-vectored (re-consolidated) moves with its new vector.
    moved = pairs[7][0].model_copy(update={"title": "Moved", "version": 2})
    await store.upsert([(moved, -query)])
    assert (await store.search("acme", "u1", -query, 1))[0].memory == moved
    assert moved.memory_id not in {
        h.memory.memory_id for h in await store.search("acme", "u1", query, 5)
    }
    # The bulk path too.
    bulk = memory_factory("acme", "u1", "topic:bulk", title="Bulk")
    other = unit_vectors(rng, 1)
    await store.upsert_bulk([bulk], other)
    assert (await store.search("acme", "u1", other[0], 1))[0].memory == bulk
    # A rewrite (payload only) is read back with the hit.
    renamed = bulk.model_copy(update={"title": "Renamed"})
    await store.rewrite([renamed])
    assert (await store.search("acme", "u1", other[0], 1))[0].memory.title == "Renamed"
    # A forget leaves nothing to find, and the next write is found again.
    assert await store.delete_user("acme", "u1") == 42
    assert ("acme", "u1") not in store._vectors
    assert await store.search("acme", "u1", query, 5) == []
    await store.upsert([(new, query)])
    await _loaded(store, "acme", "u1")
    assert [h.memory for h in await store.search("acme", "u1", query, 5)] == [new]


async def test_cached_key_lookup_is_edges_and_sees_every_write(
    store: QdrantEdgeStore, tmp_path: Path
) -> None:
    """``find_by_keys`` of a cached user answers from the cache's key index: the same
    memories in the same order as Edge's filtered scroll, through upserts and rewrites
    that change keys, and never another owner's memory with the same key."""
    rng = np.random.default_rng(8)
    pairs = [
        (memory_factory("acme", "u1", f"topic:{i}", keys=[f"order:{i % 7}", f"sku:{i % 3}"]), v)
        for i, v in enumerate(unit_vectors(rng, 60))
    ]
    rivals = [  # the same keys, other owners
        (memory_factory(t, u, f"topic:{i}", keys=[f"order:{i % 7}"]), v)
        for t, u in (("acme", "u2"), ("globex", "u1"))
        for i, v in enumerate(unit_vectors(rng, 20))
    ]
    await store.upsert(pairs + rivals)
    await _loaded(store, "acme", "u1")
    asked = [["order:3"], ["sku:1"], ["order:1", "sku:2"], ["order:404"], ["order:5", "order:5"]]
    # Keys change under the cache: a rewrite drops one, an upsert adds another.
    moved = pairs[3][0].model_copy(update={"keys": ["order:404"], "version": 2})
    await store.rewrite([moved])
    added = memory_factory("acme", "u1", "topic:new", keys=["order:3"])
    await store.upsert([(added, unit_vectors(rng, 1)[0])])
    assert ("acme", "u1") in store._vectors
    answers = [await store.find_by_keys("acme", "u1", keys, k) for keys in asked for k in (2, 50)]
    assert moved in answers[asked.index(["order:404"]) * 2]
    assert added in answers[0] + answers[1]
    for found in answers:
        assert {(m.tenant_id, m.user_id) for m in found} <= {("acme", "u1")}
    await store.close()
    edge_only = QdrantEdgeStore(tmp_path / "shard", vector_cache_bytes=0)
    try:
        expected = [
            await edge_only.find_by_keys("acme", "u1", keys, k) for keys in asked for k in (2, 50)
        ]
    finally:
        await edge_only.close()
    assert answers == expected


async def test_hits_read_again_come_from_memory_until_written(store: QdrantEdgeStore) -> None:
    rng = np.random.default_rng(4)
    pairs = _memories("acme", "u1", 30, rng) + _memories("acme", "u2", 30, rng)
    await store.upsert(pairs)
    await _loaded(store, "acme", "u1")
    query = pairs[3][1]
    first = await store.search("acme", "u1", query, 5)
    again = await store.search("acme", "u1", query, 5)
    assert [h.memory for h in again] == [h.memory for h in first]
    assert all(a.memory is f.memory for a, f in zip(again, first, strict=True))  # not re-read
    assert {o for o, _ in store._hits.values()} == {("acme", "u1")}
    # Each write forgets what it wrote: a rewrite, an upsert, a forget of the whole user.
    await store.rewrite([first[0].memory.model_copy(update={"title": "Rewritten"})])
    assert first[0].memory.memory_id not in store._hits
    await store.upsert([(first[1].memory.model_copy(update={"title": "Again"}), query)])
    assert first[1].memory.memory_id not in store._hits
    titles = {h.memory.title for h in await store.search("acme", "u1", query, 2)}
    assert titles == {"Rewritten", "Again"}
    await store.delete_user("acme", "u1")
    assert not store._hits


async def test_no_other_owners_memory_ever_comes_back(store: QdrantEdgeStore) -> None:
    """The same user id in two tenants, two users of one tenant, the same vectors in all."""
    rng = np.random.default_rng(3)
    vectors = unit_vectors(rng, 30)
    owners = [("acme", "u1"), ("globex", "u1"), ("acme", "u2")]
    for tenant, user in owners:
        await store.upsert(
            [(memory_factory(tenant, user, f"topic:{i}"), vectors[i]) for i in range(30)]
        )
    for owner in owners:
        await _loaded(store, *owner)
    for tenant, user in owners:
        for q in vectors[:5]:
            hits = await store.search(tenant, user, q, 30)
            assert len(hits) == 30
            assert {(h.memory.tenant_id, h.memory.user_id) for h in hits} == {(tenant, user)}
    # A point that changed hands (same id, written for another user) is not served stale.
    taken = memory_factory("acme", "u1", "topic:0").model_copy(update={"user_id": "u2"})
    await store.upsert([(taken, vectors[0])])
    hits = await store.search("acme", "u1", vectors[0], 30)
    assert all(h.memory.user_id == "u1" for h in hits)
    assert len(hits) == 29


async def test_a_load_that_saw_a_write_is_not_kept(
    store: QdrantEdgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qdrant_edge_store, "VECTOR_PAGE", 4)  # a load of many pages
    rng = np.random.default_rng(4)
    await store.upsert(_memories("acme", "u1", 40, rng))
    query = unit_vectors(rng, 1)[0]
    await store.search("acme", "u1", query, 1)  # starts the load
    await asyncio.sleep(0)  # one page read
    new = memory_factory("acme", "u1", "topic:late")
    await store.upsert([(new, query)])  # a write mid-load
    await asyncio.gather(*store._loading.values())
    assert ("acme", "u1") not in store._vectors  # refused: it may have missed the write
    await _loaded(store, "acme", "u1")
    assert (await store.search("acme", "u1", query, 1))[0].memory == new


async def test_the_cache_stays_within_its_budget(tmp_path: Path) -> None:
    entry = UserVectors(DIM)
    entry.put([f"p{i}" for i in range(10)], np.zeros((10, DIM), np.float32), [[]] * 10)
    entry.trim()
    budget = 2 * entry.nbytes + 1  # room for two 10-memory users
    store = QdrantEdgeStore(tmp_path / "shard", vector_cache_bytes=budget)
    await store.ensure_collection(DIM)
    try:
        rng = np.random.default_rng(5)
        for user in ("u1", "u2", "u3"):
            await store.upsert(_memories("acme", user, 10, rng))
            await _loaded(store, "acme", user)
        await store.upsert(_memories("acme", "big", 30, rng))
        await store.search("acme", "big", unit_vectors(rng, 1)[0], 1)
        await asyncio.gather(*store._loading.values())
        assert store._vectors.nbytes <= budget
        assert ("acme", "u1") not in store._vectors  # least recently searched: out first
        assert ("acme", "big") not in store._vectors  # over the whole budget: never kept
        hits = await store.search("acme", "big", unit_vectors(rng, 1)[0], 30)
        assert len(hits) == 30  # Edge answers it
        assert not store._loading  # and it is not read again on every search
    finally:
        await store.close()


def test_vector_cache_top_and_tokens() -> None:
    entry = UserVectors(2)
    vectors = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], np.float32)
    entry.put(["c", "b", "a", "d"], vectors, [[]] * 4)
    x = np.array([1, 0], np.float32)
    assert entry.top(x, 1) == [("a", 1.0)]  # a tie at the cut goes by id, not by row
    assert [i for i, _ in entry.top(x, 3)] == ["a", "c", "d"]
    assert [i for i, _ in entry.top(x, 9)] == ["a", "c", "d", "b"]  # past the count: all
    entry.put(["a"], np.array([[-1, 0]], np.float32), [[]])  # overwritten in place
    assert [i for i, _ in entry.top(x, 2)] == ["c", "d"]
    cache = VectorCache(1 << 20)
    token = cache.begin(("t", "u"))
    cache.touch(("t", "u"))
    assert not cache.store(("t", "u"), entry, token)  # a write came during the load
    token = cache.begin(("t", "u"))
    assert cache.store(("t", "u"), entry, token)
    assert ("t", "u") in cache
    cache.touch(("t", "other"))  # not loading: nothing is tracked for it
    assert not cache._loading


async def test_small_users_are_left_to_edge_until_they_grow(
    store: QdrantEdgeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qdrant_edge_store, "CACHE_MIN_POINTS", 20)
    rng = np.random.default_rng(6)
    await store.upsert(_memories("acme", "u1", 15, rng))
    query = unit_vectors(rng, 1)[0]
    await store.search("acme", "u1", query, 3)  # loads, finds 15 < 20: not kept
    await asyncio.gather(*store._loading.values())
    assert ("acme", "u1") not in store._vectors
    await store.search("acme", "u1", query, 3)
    assert not store._loading  # and not read again on every search
    more = [
        (memory_factory("acme", "u1", f"more:{i}"), v) for i, v in enumerate(unit_vectors(rng, 5))
    ]
    await store.upsert(more)  # 20 now: the next search loads it
    await _loaded(store, "acme", "u1")
    hits = await store.search("acme", "u1", more[0][1], 1)
    assert hits[0].memory == more[0][0]
