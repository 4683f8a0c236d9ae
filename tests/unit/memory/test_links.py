"""Links: shared entity keys or close vectors, same user only, stored both ways."""

from __future__ import annotations

from datetime import UTC, datetime

from memstream.memory.links import LinkParams, entity_keys, linked, related_ids
from memstream.schemas import ConsolidatedMemory

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
PARAMS = LinkParams(similarity=0.8, max_links=3)


def memory_factory(
    memory_id: str, keys: list[str] | None = None, user_id: str = "u1"
) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        title=memory_id,
        memory_id=memory_id,
        tenant_id="acme",
        user_id=user_id,
        key=f"topic:{memory_id}",
        keys=keys or [],
        created_at=T0,
        updated_at=T0,
    )


def test_only_entity_keys_count_as_shared() -> None:
    memory = memory_factory("m", ["order:A-1", "refund", "topic:c1", "entity:order:A-1"])
    assert entity_keys(memory) == ["order:A-1"]


def test_related_by_shared_entity_key_then_by_similarity_above_the_bound() -> None:
    memory = memory_factory("m", ["order:A-1", "refund"])
    sharing = [
        memory_factory("k", ["order:A-1"]),
        memory_factory("word", ["refund"]),  # a shared word is not a shared entity
        memory_factory("other-user", ["order:A-1"], user_id="u2"),
    ]
    nearest = [
        (memory, 1.0),  # itself, already stored
        (memory_factory("far"), 0.5),
        (memory_factory("near"), 0.9),
        (memory_factory("nearer"), 0.95),
    ]
    assert related_ids(memory, nearest, sharing, PARAMS) == ["k", "nearer", "near"]


def test_related_ids_are_bounded() -> None:
    memory = memory_factory("m")
    nearest = [(memory_factory(f"n{i}"), 0.9) for i in range(10)]
    assert len(related_ids(memory, nearest, [], PARAMS)) == PARAMS.max_links


def test_linked_adds_new_ids_once_and_keeps_the_newest() -> None:
    memory = memory_factory("m")
    once = linked(memory, ["a", "b", "m"], PARAMS)
    assert once.links == ["a", "b"]
    assert linked(once, ["a"], PARAMS) is once  # nothing new: the same object
    assert linked(once, ["c", "d"], PARAMS).links == ["b", "c", "d"]
