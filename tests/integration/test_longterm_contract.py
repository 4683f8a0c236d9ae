"""The `LongTermStore` contract, run against both backends, and the two compared.

Every test taking `store` runs once on Qdrant Edge (in a tmp dir) and once on qdrant-client
in `:memory:` local mode. `test_backends_agree` loads the same data into both and checks
they answer alike, so neither engine drifts from the other unnoticed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from qdrant_client import models
from qdrant_edge import Point, UpdateOperation

from memstream.schemas.memories import (
    ConsolidatedMemory,
    Fact,
    HistoryEntry,
    OpenAction,
    StoredTurn,
    TimelineEntry,
)
from memstream.settings import QdrantSettings
from memstream.stores.longterm import (
    DERIVED_FIELDS,
    ArchivedTurn,
    LongTermStore,
    as_float16,
    memory_point_id,
    to_payload,
    turn_point_id,
)
from memstream.stores.qdrant_client_store import QdrantClientStore
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.wiring import open_longterm

DIM = 16
BACKENDS = ["edge", "client"]
TENANTS = ["acme", "globex", "initech"]
USERS = ["u1", "u2", "u3"]
PER_USER = 7
SHARED_KEY = "entity:order:A-10293"  # every user has a memory with it: isolation bait
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

Seeded = dict[tuple[str, str], list[tuple[ConsolidatedMemory, np.ndarray]]]


def memory_factory(
    tenant_id: str = "acme",
    user_id: str = "u1",
    key: str = "topic:shipping",
    *,
    title: str = "Shipping",
    keys: list[str] | None = None,
    version: int = 1,
) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        memory_id=memory_point_id(tenant_id, user_id, key),
        tenant_id=tenant_id,
        user_id=user_id,
        key=key,
        title=title,
        facts=[Fact(text=f"{title} fact", attribute="status", source_event_ids=["e1"], ts=T0)],
        status="open",
        timeline=[TimelineEntry(ts=T0, text="asked", event_id="e1")],
        keys=keys if keys is not None else [key],
        summary=f"{title} summary v{version}",
        created_at=T0,
        updated_at=T0 + timedelta(minutes=version),
        source_event_ids=["e1"],
        history=[HistoryEntry(attribute="status", value="new", superseded_at=T0)],
        version=version,
    )


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    normed: np.ndarray = x / np.linalg.norm(x, axis=1, keepdims=True)
    return normed


def open_backend(backend: str, data_dir: Path) -> LongTermStore:
    settings = (
        QdrantSettings(backend="edge")
        if backend == "edge"
        else QdrantSettings(backend="client", url=":memory:")
    )
    return open_longterm(settings, data_dir)


@pytest.fixture
async def store_factory(tmp_path: Path) -> AsyncIterator[Callable[[str], LongTermStore]]:
    """Opens stores (each in its own directory) and closes every one after the test."""
    made: list[LongTermStore] = []

    def make(backend: str) -> LongTermStore:
        opened = open_backend(backend, tmp_path / f"{backend}-{len(made)}")
        made.append(opened)
        return opened

    yield make
    for opened in made:
        await opened.close()


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, store_factory: Callable[[str], LongTermStore]
) -> LongTermStore:
    opened = store_factory(request.param)
    await opened.ensure_collection(DIM)
    return opened


async def seed(store: LongTermStore, rng_seed: int = 7) -> Seeded:
    """3 tenants x 3 users x PER_USER memories, the same ones for the same seed."""
    rng = np.random.default_rng(rng_seed)
    seeded: Seeded = {}
    for tenant in TENANTS:
        for user in USERS:
            vectors = unit_vectors(rng, PER_USER)
            seeded[(tenant, user)] = [
                (
                    memory_factory(
                        tenant,
                        user,
                        f"topic:{i}",
                        title=f"{tenant}/{user} #{i}",
                        keys=[f"topic:{i}", SHARED_KEY] if i == 0 else [f"topic:{i}"],
                    ),
                    vectors[i],
                )
                for i in range(PER_USER)
            ]
    await store.upsert([pair for pairs in seeded.values() for pair in pairs])
    return seeded


def test_memory_point_id_is_deterministic_uuid5() -> None:
    a = memory_point_id("acme", "u1", "topic:x")
    assert a == memory_point_id("acme", "u1", "topic:x")
    assert uuid.UUID(a).version == 5
    assert str(uuid.UUID(a)) == a
    others = {
        memory_point_id("acme", "u2", "topic:x"),
        memory_point_id("globex", "u1", "topic:x"),
        memory_point_id("acme", "u1", "topic:y"),
    }
    assert a not in others
    assert len(others) == 3


async def test_store_satisfies_protocol(store: LongTermStore) -> None:
    assert isinstance(store, LongTermStore)
    assert await store.ping()


async def test_upsert_then_get_round_trips(store: LongTermStore) -> None:
    memory = memory_factory()
    await store.upsert([(memory, unit_vectors(np.random.default_rng(1), 1)[0])])
    assert await store.get("acme", "u1", memory.memory_id) == memory
    assert await store.get("acme", "u1", memory_point_id("acme", "u1", "nope")) is None
    assert await store.get("acme", "u1", "not-a-uuid") is None


async def test_get_never_crosses_owners(store: LongTermStore) -> None:
    memory = memory_factory("acme", "u1")
    await store.upsert([(memory, unit_vectors(np.random.default_rng(1), 1)[0])])
    assert await store.get("acme", "u2", memory.memory_id) is None
    assert await store.get("globex", "u1", memory.memory_id) is None
    assert await store.get_many("acme", "u2", [memory.memory_id]) == []


async def test_upsert_same_id_replaces(store: LongTermStore) -> None:
    vectors = unit_vectors(np.random.default_rng(2), 2)
    first, second = memory_factory(version=1), memory_factory(title="Shipping v2", version=2)
    await store.upsert([(first, vectors[0])])
    await store.upsert([(second, vectors[1])])
    assert await store.count() == 1
    assert await store.get("acme", "u1", first.memory_id) == second
    hits = await store.search("acme", "u1", vectors[1], 5)
    assert [h.memory for h in hits] == [second]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)  # the second vector won too


async def test_upsert_repeated_id_in_one_batch_last_wins(store: LongTermStore) -> None:
    vectors = unit_vectors(np.random.default_rng(3), 2)
    first, second = memory_factory(version=1), memory_factory(version=2)
    await store.upsert([(first, vectors[0]), (second, vectors[1])])
    assert await store.count() == 1
    assert await store.get("acme", "u1", first.memory_id) == second


async def test_upsert_rejects_bad_input(store: LongTermStore) -> None:
    vector = unit_vectors(np.random.default_rng(4), 1)[0]
    with pytest.raises(ValueError, match="shape"):
        await store.upsert([(memory_factory(), vector[:-1])])
    with pytest.raises(ValueError, match="UUID"):
        await store.upsert([(memory_factory().model_copy(update={"memory_id": "k1"}), vector)])
    with pytest.raises(ValueError, match="non-finite"):
        await store.upsert([(memory_factory(), np.full(DIM, np.nan, dtype=np.float32))])
    with pytest.raises(ValueError, match="shape"):
        await store.search("acme", "u1", vector[:-1], 3)
    await store.upsert([])
    assert await store.count() == 0


async def test_get_many_keeps_order_and_skips_missing(store: LongTermStore) -> None:
    seeded = await seed(store)
    mine = [m for m, _ in seeded[("acme", "u2")]]
    ids = [
        mine[3].memory_id,
        memory_point_id("acme", "u2", "gone"),
        mine[0].memory_id,
        seeded[("acme", "u1")][0][0].memory_id,
        "junk",
        mine[3].memory_id,
    ]
    assert await store.get_many("acme", "u2", ids) == [mine[3], mine[0]]
    assert await store.get_many("acme", "u2", []) == []


async def test_search_is_isolated_by_tenant_and_user(store: LongTermStore) -> None:
    seeded = await seed(store)
    for (tenant, user), pairs in seeded.items():
        own_ids = {m.memory_id for m, _ in pairs}
        for other, other_pairs in seeded.items():
            # Even another owner's exact vector only ever finds our own memories.
            hits = await store.search(tenant, user, other_pairs[0][1], PER_USER + 5)
            assert len(hits) == PER_USER
            assert {h.memory.memory_id for h in hits} == own_ids
            assert all((h.memory.tenant_id, h.memory.user_id) == (tenant, user) for h in hits)
            if other == (tenant, user):
                assert hits[0].memory == pairs[0][0]
                assert hits[0].score == pytest.approx(1.0, abs=1e-5)


async def test_search_scores_are_cosine_similarity(store: LongTermStore) -> None:
    seeded = await seed(store)
    pairs = seeded[("globex", "u3")]
    query = unit_vectors(np.random.default_rng(99), 1)[0]
    hits = await store.search("globex", "u3", query, 3)
    expected = sorted(((float(v @ query), m.memory_id) for m, v in pairs), reverse=True)[:3]
    assert [h.memory.memory_id for h in hits] == [i for _, i in expected]
    assert [h.score for h in hits] == pytest.approx([s for s, _ in expected], abs=1e-5)
    # The scale is the similarity itself, not a distance: a non-unit query scores the same.
    scaled = await store.search("globex", "u3", query * 3.0, 3)
    assert [h.score for h in scaled] == pytest.approx([h.score for h in hits], abs=1e-5)
    assert await store.search("globex", "u3", query, 0) == []
    assert await store.search("globex", "nobody", query, 3) == []


async def test_find_by_keys_is_exact_and_isolated(store: LongTermStore) -> None:
    seeded = await seed(store)
    mine = {m.key: m for m, _ in seeded[("initech", "u1")]}
    found = await store.find_by_keys("initech", "u1", [SHARED_KEY], 10)
    assert found == [mine["topic:0"]]
    found = await store.find_by_keys("initech", "u1", ["topic:2", "topic:5", "topic:404"], 10)
    assert sorted(m.key for m in found) == ["topic:2", "topic:5"]
    assert await store.find_by_keys("initech", "u1", ["topic", "TOPIC:2", "entity:order"], 10) == []
    assert await store.find_by_keys("initech", "u1", [], 10) == []
    assert len(await store.find_by_keys("initech", "u1", [f"topic:{i}" for i in range(7)], 3)) == 3


async def test_list_user_pages_cover_all_without_repeats(store: LongTermStore) -> None:
    seeded = await seed(store)
    seen: list[str] = []
    offset: str | None = None
    pages = 0
    while True:
        page, offset = await store.list_user("globex", "u2", limit=3, offset=offset)
        pages += 1
        assert all((m.tenant_id, m.user_id) == ("globex", "u2") for m in page)
        seen += [m.memory_id for m in page]
        if offset is None:
            break
    assert pages == 3  # 7 memories in pages of 3
    assert len(seen) == len(set(seen)) == PER_USER
    assert set(seen) == {m.memory_id for m, _ in seeded[("globex", "u2")]}
    everything, last = await store.list_user("globex", "u2", limit=100)
    assert [m.memory_id for m in everything] == seen
    assert last is None
    assert await store.list_user("globex", "nobody", limit=3) == ([], None)
    with pytest.raises(ValueError, match="offset"):
        await store.list_user("globex", "u2", limit=3, offset="page-2")


async def test_count_filters(store: LongTermStore) -> None:
    await seed(store)
    assert await store.count() == len(TENANTS) * len(USERS) * PER_USER
    assert await store.count("acme") == len(USERS) * PER_USER
    assert await store.count("acme", "u1") == PER_USER
    assert await store.count("acme", "nobody") == 0
    assert await store.count(user_id="u1") == len(TENANTS) * PER_USER


async def test_scan_pages_cover_every_owner_without_repeats(store: LongTermStore) -> None:
    seeded = await seed(store)
    seen: list[str] = []
    offset: str | None = None
    while True:
        page, offset = await store.scan(limit=10, offset=offset)
        seen += [m.memory_id for m in page]
        if offset is None:
            break
    everything = {m.memory_id for memories in seeded.values() for m, _ in memories}
    assert len(seen) == len(set(seen)) == len(everything)
    assert set(seen) == everything
    assert seen == sorted(seen, key=uuid.UUID)  # point-id order, like list_user
    with pytest.raises(ValueError, match="offset"):
        await store.scan(limit=3, offset="page-2")


async def test_rewrite_keeps_vector_and_refuses_strangers(store: LongTermStore) -> None:
    seeded = await seed(store)
    memory, vector = seeded[("acme", "u1")][2]
    changed = memory.model_copy(update={"strength": 3.5, "links": ["x"], "feedback_ids": ["f"]})
    # A memory that claims another user's id, and one that was never stored.
    foreign = seeded[("globex", "u1")][2][0].model_copy(update={"user_id": "u9"})
    missing = memory_factory("acme", "u1", "topic:never-stored")
    assert await store.rewrite([changed, foreign, missing]) == 1
    assert await store.get("acme", "u1", memory.memory_id) == changed
    assert await store.get("acme", "u1", missing.memory_id) is None
    assert await store.get("globex", "u1", foreign.memory_id) == seeded[("globex", "u1")][2][0]
    hits = await store.search("acme", "u1", vector, limit=1)
    assert hits[0].memory == changed
    assert hits[0].score == pytest.approx(1.0, abs=1e-3)  # the vector was kept
    assert await store.count() == len(TENANTS) * len(USERS) * PER_USER


async def test_delete_user_removes_only_that_user(store: LongTermStore) -> None:
    seeded = await seed(store)
    total = await store.count()
    assert await store.delete_user("acme", "u2") == PER_USER
    assert await store.count("acme", "u2") == 0
    assert await store.count() == total - PER_USER
    assert await store.list_user("acme", "u2", limit=10) == ([], None)
    for owner in [("acme", "u1"), ("acme", "u3"), ("globex", "u2"), ("initech", "u2")]:
        assert await store.count(*owner) == PER_USER
        kept = seeded[owner][0][0]
        assert await store.get(*owner, kept.memory_id) == kept
    assert await store.delete_user("acme", "u2") == 0


# --- due times: the reminders worker's index ----------------------------------------


def with_actions(memory: ConsolidatedMemory, *dues: datetime | None) -> ConsolidatedMemory:
    actions = [OpenAction(text=f"action {i}", due=due) for i, due in enumerate(dues)]
    return memory.model_copy(update={"open_actions": actions})


Item = TypeVar("Item")


async def every_page(
    fetch: Callable[[str | None], Awaitable[tuple[list[Item], str | None]]],
) -> list[Item]:
    """Every item of a paged read, following its offsets to the last page."""
    found: list[Item] = []
    offset: str | None = None
    while True:
        batch, offset = await fetch(offset)
        found.extend(batch)
        if offset is None:
            return found


async def all_due(
    store: LongTermStore, since: datetime, until: datetime, page: int = 2
) -> list[ConsolidatedMemory]:
    return await every_page(lambda offset: store.due_between(since, until, page, offset))


async def seed_due(store: LongTermStore) -> dict[str, ConsolidatedMemory]:
    """Memories of several owners with actions due around T0 (hours from T0)."""
    h = timedelta(hours=1)
    seeded = {
        "now": with_actions(memory_factory("acme", "u1", "k:now"), T0),
        "undated": with_actions(memory_factory("acme", "u1", "k:undated"), None),
        "none": memory_factory("acme", "u2", "k:none"),
        "later": with_actions(memory_factory("globex", "u1", "k:later"), T0 + 5 * h),
        # The first action is long past, the second one due now: it is still found.
        "old_then_now": with_actions(
            memory_factory("initech", "u3", "k:old"), T0 - 100 * h, T0 - h, None
        ),
        "edge_low": with_actions(memory_factory("globex", "u2", "k:low"), T0 - 2 * h),
        "past": with_actions(memory_factory("acme", "u3", "k:past"), T0 - 50 * h),
    }
    rng = np.random.default_rng(17)
    await store.upsert([(m, v) for m, v in zip(seeded.values(), unit_vectors(rng, 7), strict=True)])
    return seeded


async def test_due_between_finds_only_memories_with_an_action_in_the_window(
    store: LongTermStore,
) -> None:
    seeded = await seed_due(store)
    h = timedelta(hours=1)
    found = await all_due(store, T0 - 2 * h, T0)
    assert sorted(m.memory_id for m in found) == sorted(
        seeded[k].memory_id for k in ("now", "old_then_now", "edge_low")
    )
    assert [m.memory_id for m in found] == sorted((m.memory_id for m in found), key=uuid.UUID)
    assert seeded["now"] in found  # the whole memory, as stored
    assert [m.key for m in await all_due(store, T0 + 4 * h, T0 + 6 * h)] == ["k:later"]
    assert await all_due(store, T0 + 6 * h, T0 + 90 * h) == []
    dated = {seeded[k].memory_id for k in ("now", "later", "old_then_now", "edge_low", "past")}
    assert {m.memory_id for m in await all_due(store, T0 - 200 * h, T0 + 10 * h, 100)} == dated
    first, offset = await store.due_between(T0 - 200 * h, T0 + 10 * h, 4)
    assert len(first) == 4
    assert offset is not None
    with pytest.raises(ValueError, match="offset"):
        await store.due_between(T0 - h, T0, 3, "page-2")
    with pytest.raises(ValueError, match="since"):
        await store.due_between(T0, T0 - h, 3)


async def test_due_between_follows_every_write(store: LongTermStore) -> None:
    seeded = await seed_due(store)
    h = timedelta(hours=1)
    vector = unit_vectors(np.random.default_rng(18), 1)[0]
    # Re-dated: the action moves from now to tomorrow; done: the action is no longer open.
    redated = with_actions(seeded["now"], T0 + 24 * h)
    done = with_actions(seeded["old_then_now"], T0 - 100 * h)
    await store.upsert([(redated, vector), (done, vector)])
    assert [m.key for m in await all_due(store, T0 - h, T0)] == []
    assert await all_due(store, T0 + 23 * h, T0 + 25 * h) == [redated]
    # A new action on a memory that had none, and a rewrite (strength) keeps the index.
    dated = with_actions(seeded["none"], T0 + 30 * h)
    await store.upsert([(dated, vector)])
    stronger = dated.model_copy(update={"strength": 2.5})
    assert await store.rewrite([stronger]) == 1
    assert await all_due(store, T0 + 29 * h, T0 + 31 * h) == [stronger]
    await store.delete_user("acme", "u2")
    assert await all_due(store, T0 + 29 * h, T0 + 31 * h) == []


async def write_without_derived(store: LongTermStore, memory: ConsolidatedMemory) -> None:
    """A point as the store wrote it before the `DERIVED_FIELDS` existed, indexes gone too."""
    vector = unit_vectors(np.random.default_rng(19), 1)[0].tolist()
    payload = {k: v for k, v in to_payload(memory).items() if k not in DERIVED_FIELDS}
    if isinstance(store, QdrantEdgeStore):
        shard = store._shard
        assert shard is not None
        for name in DERIVED_FIELDS:
            shard.update(UpdateOperation.delete_field_index(name))
        shard.update(UpdateOperation.upsert_points([Point(memory.memory_id, vector, payload)]))
    else:
        assert isinstance(store, QdrantClientStore)
        point = models.PointStruct(id=memory.memory_id, vector=vector, payload=payload)
        await store._client.upsert(store.collection, [point], wait=True)


async def test_ensure_collection_fills_in_due_times_of_older_memories(
    store: LongTermStore,
) -> None:
    seeded = await seed_due(store)
    h = timedelta(hours=1)
    legacy = with_actions(memory_factory("acme", "u9", "k:legacy"), T0 - h)
    await write_without_derived(store, legacy)
    assert legacy not in await all_due(store, T0 - 2 * h, T0)
    await store.ensure_collection(DIM)
    found = await all_due(store, T0 - 2 * h, T0)
    assert sorted(m.key for m in found) == ["k:legacy", "k:low", "k:now", "k:old"]
    assert await store.get("acme", "u9", legacy.memory_id) == legacy
    assert seeded["later"] in await all_due(store, T0 + 4 * h, T0 + 6 * h)


async def test_decay_due_reads_older_memories_until_a_rewrite_indexes_them(
    store: LongTermStore,
) -> None:
    """`DECAY_FIELD` is not filled in on open (a write per memory): a memory stored before
    it existed matches `decay_due` whatever its age, until a rewrite stores the field."""
    legacy = memory_factory("acme", "u9", "k:legacy")  # created at T0
    await write_without_derived(store, legacy)
    await store.ensure_collection(DIM)
    assert await all_behind(store, "acme", "u9", T0 - timedelta(days=30)) == [legacy]
    assert await store.rewrite([legacy]) == 1
    assert await all_behind(store, "acme", "u9", T0 - timedelta(days=30)) == []
    assert await all_behind(store, "acme", "u9", T0) == [legacy]


async def all_behind(
    store: LongTermStore, tenant: str, user: str, until: datetime, page: int = 2
) -> list[ConsolidatedMemory]:
    return await every_page(lambda offset: store.decay_due(tenant, user, until, page, offset))


def aged(
    memory: ConsolidatedMemory, created: datetime, decayed_to: datetime | None = None
) -> ConsolidatedMemory:
    return memory.model_copy(update={"created_at": created, "decayed_to": decayed_to})


async def test_decay_due_reads_only_the_users_memories_behind(store: LongTermStore) -> None:
    day = timedelta(days=1)
    rows = {
        "old": aged(memory_factory("acme", "u1", "k:old"), T0 - 5 * day),
        # Created long ago but decayed up to yesterday: its decay time is what counts.
        "decayed": aged(memory_factory("acme", "u1", "k:decayed"), T0 - 9 * day, T0 - day),
        "new": aged(memory_factory("acme", "u1", "k:new"), T0),
        "edge": aged(memory_factory("acme", "u1", "k:edge"), T0 - 2 * day),
        # The same age for other owners: isolation bait.
        "other_user": aged(memory_factory("acme", "u2", "k:old"), T0 - 5 * day),
        "other_tenant": aged(memory_factory("globex", "u1", "k:old"), T0 - 5 * day),
    }
    vectors = unit_vectors(np.random.default_rng(23), len(rows))
    await store.upsert(list(zip(rows.values(), vectors, strict=True)))
    found = await all_behind(store, "acme", "u1", T0 - 2 * day)
    assert sorted(m.key for m in found) == ["k:edge", "k:old"]
    assert [m.memory_id for m in found] == sorted((m.memory_id for m in found), key=uuid.UUID)
    assert rows["old"] in found  # the whole memory, as stored
    behind_now = await all_behind(store, "acme", "u1", T0, page=1)
    assert sorted(m.key for m in behind_now) == ["k:decayed", "k:edge", "k:new", "k:old"]
    assert await all_behind(store, "acme", "u1", T0 - 6 * day) == []
    assert await all_behind(store, "acme", "u9", T0) == []
    with pytest.raises(ValueError, match="offset"):
        await store.decay_due("acme", "u1", T0, 3, "page-2")
    # A rewrite that decays a memory moves it in the index; a delete takes it out.
    caught_up = rows["old"].model_copy(update={"decayed_to": T0, "strength": 0.5})
    assert await store.rewrite([caught_up]) == 1
    assert [m.key for m in await all_behind(store, "acme", "u1", T0 - 2 * day)] == ["k:edge"]
    await store.delete_user("acme", "u1")
    assert await all_behind(store, "acme", "u1", T0) == []
    assert [m.key for m in await all_behind(store, "acme", "u2", T0)] == ["k:old"]


# --- the turn archive ----------------------------------------------------------------


def archived_turns(tenant: str, user: str, n: int, rng_seed: int = 3) -> list[ArchivedTurn]:
    vectors = unit_vectors(np.random.default_rng(rng_seed), n)
    return [
        ArchivedTurn(
            tenant,
            user,
            StoredTurn(
                event_id=f"{tenant}-{user}-t{i}",
                session_id="s1",
                role="user",
                text=f"turn {i} of {tenant}/{user}",
                ts=T0 + timedelta(minutes=i),
                speaker="Ana" if i % 2 else None,
                entities=[SHARED_KEY] if i == 0 else [],
            ),
            vectors[i],
        )
        for i in range(n)
    ]


def by_event(turns: list[ArchivedTurn]) -> dict[str, tuple[StoredTurn, bytes]]:
    return {t.turn.event_id: (t.turn, t.vector.tobytes()) for t in turns}


async def all_turns(store: LongTermStore, tenant: str, user: str, page: int) -> list[ArchivedTurn]:
    return await every_page(lambda offset: store.list_turns(tenant, user, page, offset))


def test_turn_point_id_is_per_owner_and_apart_from_memories() -> None:
    a = turn_point_id("acme", "u1", "e1")
    assert a == turn_point_id("acme", "u1", "e1")
    assert uuid.UUID(a).version == 5
    assert a not in {turn_point_id("acme", "u2", "e1"), turn_point_id("globex", "u1", "e1")}
    assert a != memory_point_id("acme", "u1", "e1")


async def test_archive_round_trips_float16_exactly_and_pages(store: LongTermStore) -> None:
    mine = archived_turns("acme", "u1", 9)
    theirs = archived_turns("acme", "u2", 4) + archived_turns("globex", "u1", 4)
    assert await store.upsert_turns(mine + theirs) == 17
    found = await all_turns(store, "acme", "u1", page=4)
    assert len(found) == 9
    assert [t.turn.event_id for t in found] == sorted(
        (t.turn.event_id for t in found), key=lambda e: turn_point_id("acme", "u1", e)
    )
    # What comes back is the hot tier's float16 rounding, bit for bit, with every field.
    expected = {t.turn.event_id: (t.turn, as_float16(t.vector).tobytes()) for t in mine}
    assert by_event(found) == expected
    assert all((t.tenant_id, t.user_id) == ("acme", "u1") for t in found)
    assert await store.count_turns() == 17
    assert await store.count_turns("acme") == 13
    assert await store.count_turns("acme", "u1") == 9
    assert await store.count() == 0  # the archive is not memories
    asked = ["acme-u1-t4", "acme-u2-t0", "nope", "acme-u1-t1", "acme-u1-t4"]
    got = await store.get_turns("acme", "u1", asked)  # u2's id is not u1's: skipped
    assert [t.turn.event_id for t in got] == ["acme-u1-t4", "acme-u1-t1"]
    assert by_event(got) == {e: expected[e] for e in ("acme-u1-t4", "acme-u1-t1")}


async def test_archive_upsert_is_idempotent_and_last_wins(store: LongTermStore) -> None:
    first = archived_turns("acme", "u1", 3)
    await store.upsert_turns(first)
    edited = ArchivedTurn(
        "acme", "u1", first[1].turn.model_copy(update={"text": "edited"}), first[2].vector
    )
    assert await store.upsert_turns([first[1], edited, *first]) == 3
    assert await store.count_turns("acme", "u1") == 3
    await store.upsert_turns([edited])
    found = by_event(await all_turns(store, "acme", "u1", page=10))
    assert found[edited.turn.event_id][0].text == "edited"
    with pytest.raises(ValueError, match="shape"):
        await store.upsert_turns([ArchivedTurn("acme", "u1", first[0].turn, np.ones(DIM + 1))])
    with pytest.raises(ValueError, match="offset"):
        await store.list_turns("acme", "u1", 5, "not-an-offset")


async def test_delete_turns_removes_only_that_user(store: LongTermStore) -> None:
    await seed(store)
    await store.upsert_turns(archived_turns("acme", "u1", 5) + archived_turns("acme", "u2", 5))
    assert await store.delete_turns("acme", "u1") == 5
    assert await store.delete_turns("acme", "u1") == 0
    assert await store.count_turns("acme", "u1") == 0
    assert await store.count_turns("acme", "u2") == 5
    assert await store.list_turns("acme", "u1", 5) == ([], None)
    assert await store.count("acme", "u1") == PER_USER  # memories are delete_user's
    # Only some turns (the archive worker's undo after a racing forget); never another's.
    asked = ["acme-u2-t0", "acme-u2-t1", "acme-u1-t2", "acme-u2-nope", "acme-u2-t0"]
    assert await store.delete_turns("acme", "u2", asked) == 2
    assert await store.delete_turns("globex", "u2", ["acme-u2-t3"]) == 0
    left = await all_turns(store, "acme", "u2", page=10)
    assert sorted(t.turn.event_id for t in left) == [f"acme-u2-t{i}" for i in (2, 3, 4)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_new_store_has_an_empty_archive_and_refuses_turn_writes(
    backend: str, store_factory: Callable[[str], LongTermStore]
) -> None:
    fresh = store_factory(backend)
    assert await fresh.count_turns() == 0
    assert await fresh.list_turns("acme", "u1", 3) == ([], None)
    assert await fresh.delete_turns("acme", "u1") == 0
    assert await fresh.get_turns("acme", "u1", ["e1"]) == []
    with pytest.raises(RuntimeError, match="ensure_collection"):
        await fresh.upsert_turns(archived_turns("acme", "u1", 1))


async def test_backends_archive_alike(store_factory: Callable[[str], LongTermStore]) -> None:
    edge, client = store_factory("edge"), store_factory("client")
    turns = archived_turns("acme", "u1", 12) + archived_turns("initech", "u3", 5)
    for opened in (edge, client):
        await opened.ensure_collection(DIM)
        await opened.upsert_turns(turns)
    for tenant, user in (("acme", "u1"), ("initech", "u3"), ("acme", "u3")):
        a, a_next = await edge.list_turns(tenant, user, 5)
        b, b_next = await client.list_turns(tenant, user, 5)
        assert (by_event(a), a_next) == (by_event(b), b_next)
        assert by_event(await all_turns(edge, tenant, user, 5)) == by_event(
            await all_turns(client, tenant, user, 5)
        )
    assert await edge.delete_turns("acme", "u1") == await client.delete_turns("acme", "u1")


async def test_ensure_collection_is_idempotent_and_checks_dim(store: LongTermStore) -> None:
    await seed(store)
    await store.ensure_collection(DIM)
    assert await store.count() == len(TENANTS) * len(USERS) * PER_USER
    with pytest.raises(ValueError, match="vectors"):
        await store.ensure_collection(DIM + 1)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_new_store_reads_empty_and_refuses_writes(
    backend: str, store_factory: Callable[[str], LongTermStore]
) -> None:
    fresh = store_factory(backend)
    vector = unit_vectors(np.random.default_rng(5), 1)[0]
    assert not await fresh.ping()
    assert await fresh.count() == 0
    assert await fresh.get("acme", "u1", memory_point_id("acme", "u1", "k")) is None
    assert await fresh.search("acme", "u1", vector, 3) == []
    assert await fresh.list_user("acme", "u1", limit=3) == ([], None)
    assert await fresh.delete_user("acme", "u1") == 0
    with pytest.raises(RuntimeError, match="ensure_collection"):
        await fresh.upsert([(memory_factory(), vector)])
    await fresh.ensure_collection(DIM)
    assert await fresh.ping()


async def test_backends_agree(store_factory: Callable[[str], LongTermStore]) -> None:
    edge, client = store_factory("edge"), store_factory("client")
    for opened in (edge, client):
        await opened.ensure_collection(DIM)
        await seed(opened)
    queries = unit_vectors(np.random.default_rng(11), 5)
    for tenant in TENANTS:
        for user in USERS:
            for query in queries:
                a = await edge.search(tenant, user, query, 4)
                b = await client.search(tenant, user, query, 4)
                assert [h.memory for h in a] == [h.memory for h in b]
                assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
            assert await edge.list_user(tenant, user, 4) == await client.list_user(tenant, user, 4)
            keys = [SHARED_KEY, "topic:3"]
            assert await edge.find_by_keys(tenant, user, keys, 10) == await client.find_by_keys(
                tenant, user, keys, 10
            )
        assert await edge.count(tenant) == await client.count(tenant)
    for opened in (edge, client):
        await seed_due(opened)
    window = (T0 - timedelta(hours=3), T0 + timedelta(hours=6), 3)
    assert await edge.due_between(*window) == await client.due_between(*window)
    behind = ("acme", "u1", T0 + timedelta(days=2), 3)
    assert await edge.decay_due(*behind) == await client.decay_due(*behind)
    assert await edge.delete_user("globex", "u1") == await client.delete_user("globex", "u1")
    assert await edge.count() == await client.count()


# --- Edge only: what lives on disk -------------------------------------------------


async def test_edge_persists_across_close_and_reopen(tmp_path: Path) -> None:
    first = QdrantEdgeStore(tmp_path / "shard")
    await first.ensure_collection(DIM)
    seeded = await seed(first)
    replaced = memory_factory("acme", "u1", "topic:1", title="replaced", version=2)
    await first.upsert([(replaced, seeded[("acme", "u1")][1][1])])
    await first.delete_user("initech", "u3")
    query = unit_vectors(np.random.default_rng(12), 1)[0]
    before = await first.search("globex", "u2", query, 5)
    await first.close()
    await first.close()  # idempotent

    # A reader that never calls ensure_collection (e.g. a CLI) loads the shard lazily.
    reader = QdrantEdgeStore(tmp_path / "shard")
    try:
        assert await reader.ping()
        assert await reader.count() == (len(TENANTS) * len(USERS) - 1) * PER_USER
        assert await reader.get("acme", "u1", replaced.memory_id) == replaced
        assert await reader.search("globex", "u2", query, 5) == before
        assert await reader.find_by_keys("acme", "u3", [SHARED_KEY], 5) == [
            seeded[("acme", "u3")][0][0]
        ]
        await reader.ensure_collection(DIM)  # and a writer reopening it keeps everything
        await reader.upsert([(memory_factory("acme", "u9"), query)])
        assert await reader.count("acme", "u9") == 1
        with pytest.raises(ValueError, match="vectors"):
            await QdrantEdgeStore(tmp_path / "shard").ensure_collection(DIM * 2)
    finally:
        await reader.close()


async def test_edge_shard_is_held_by_one_store_at_a_time(tmp_path: Path) -> None:
    owner = QdrantEdgeStore(tmp_path / "shard")
    await owner.ensure_collection(DIM)
    try:
        with pytest.raises(RuntimeError, match="another process"):
            await QdrantEdgeStore(tmp_path / "shard").count()
    finally:
        await owner.close()


async def test_edge_housekeeping_keeps_data(tmp_path: Path) -> None:
    # Tiny thresholds so batching, flush() and optimize() all run inside upsert/delete.
    edge = QdrantEdgeStore(tmp_path / "shard", batch_size=5, flush_every=7, optimize_every=20)
    await edge.ensure_collection(DIM)
    try:
        seeded = await seed(edge)
        await edge.delete_user("acme", "u1")
        await seed(edge)  # the same ids again: replaced, not added
        assert await edge.count() == len(TENANTS) * len(USERS) * PER_USER
        for (tenant, user), pairs in seeded.items():
            hits = await edge.search(tenant, user, pairs[2][1], 1)
            assert hits[0].memory == pairs[2][0]
    finally:
        await edge.close()
