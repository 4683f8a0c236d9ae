"""CLAG routing step: bands, exact weighted centroids, the fuzzy buffer, routing answers,
and the engine's invariants as hypothesis properties (byte forms: tests/unit/stores)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.memory.clustering import (
    MIN_WEIGHT,
    NEW,
    ClusterParams,
    ClusterState,
    MemoryIn,
    StepResult,
    classify,
    member_count,
    step,
    vectors_needed,
)
from memstream.memory.vectors import FloatArray, normalize

# CLAG's thresholds (round numbers for the geometry); buffer 8, maintenance every 20.
PARAMS = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
DIM = 8


def unit(*values: float) -> FloatArray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return normalize(v)


def at_cosine(base: FloatArray, other: FloatArray, cosine: float) -> FloatArray:
    """A unit vector with exactly ``cosine`` to unit ``base`` (``other`` orthogonal to it)."""
    return normalize(cosine * base + math.sqrt(1 - cosine**2) * other)


E0, E1, E2, E3 = unit(1), unit(0, 1), unit(0, 0, 1), unit(0, 0, 0, 1)


def run(
    vectors: list[FloatArray],
    params: ClusterParams = PARAMS,
    state: ClusterState | None = None,
    importance: float = 0.5,
    start: int = 0,
) -> StepResult:
    s = state or ClusterState.empty(params)
    result: StepResult | None = None
    for i, v in enumerate(vectors, start=start):
        result = step(s, MemoryIn(f"e{i}", v, importance), float(i), params)
        s = result.state
    assert result is not None
    return result


def test_first_memory_opens_a_cluster() -> None:
    r = run([E0])
    assert (r.band, r.cluster_id, r.buffered, r.changed, r.created) == (
        "create",
        "c0",
        False,
        ("c0",),
        1,
    )
    c = r.state.clusters[0]
    assert (c.member_ids, c.weight, c.coherence, c.created_ts) == (("e0",), 0.5, 1.0, 0.0)
    np.testing.assert_allclose(c.centroid, E0)


def test_similar_memory_joins_and_the_centroid_is_the_weighted_mean() -> None:
    v = at_cosine(E0, E1, 0.8)
    s = run([E0], importance=0.1).state
    r = step(s, MemoryIn("e1", v, 0.9), 5.0, PARAMS)
    assert (r.band, r.cluster_id, r.changed) == ("merge", "c0", ("c0",))
    c = r.state.clusters[0]
    np.testing.assert_allclose(c.centroid, normalize(0.1 * E0 + 0.9 * v), atol=1e-6)
    assert c.weight == pytest.approx(1.0)
    # coherence is the weighted mean cosine of the members to the centroid
    expected = (0.1 * float(c.centroid @ E0) + 0.9 * float(c.centroid @ v)) / 1.0
    assert c.coherence == pytest.approx(expected, abs=1e-5)
    assert (c.updated_ts, c.member_ids) == (5.0, ("e0", "e1"))


def test_zero_importance_still_counts_a_little() -> None:
    c = run([E0, at_cosine(E0, E1, 0.9)], importance=0.0).state.clusters[0]
    assert c.weight == pytest.approx(2 * MIN_WEIGHT)


def test_dissimilar_memory_opens_a_second_cluster() -> None:
    r = run([E0, at_cosine(E0, E1, 0.5)])
    assert (r.band, r.cluster_id) == ("create", "c1")
    assert [c.size for c in r.state.clusters] == [1, 1]


def test_fuzzy_memory_waits_in_the_buffer_with_a_provisional_cluster() -> None:
    r = run([E0, at_cosine(E0, E1, 0.7)])
    assert (r.band, r.buffered, r.cluster_id, r.changed) == ("fuzzy", True, "c0", ())
    assert [b.event_id for b in r.state.buffer] == ["e1"]
    assert r.state.clusters[0].member_ids == ("e0",)  # the centroid did not move
    assert member_count(r.state) == 2


def test_full_buffer_flushes_a_coherent_group_into_a_new_cluster() -> None:
    # Eight memories at cosine 0.7 to c0 that agree closely with each other: a new topic.
    topic = at_cosine(E0, E1, 0.7)
    fuzzy = [normalize(topic + 0.05 * (E2 if i % 2 else E3)) for i in range(8)]
    r = run([E0, *fuzzy])
    assert r.flushed == 8
    assert r.state.buffer == ()
    assert [c.size for c in r.state.clusters] == [1, 8]
    assert set(r.placed) == {f"e{i}" for i in range(1, 9)}
    assert set(r.placed.values()) == {"c1"}
    assert r.cluster_id == "c1"
    assert not r.buffered


def test_lone_fuzzy_memories_join_their_nearest_on_flush() -> None:
    # Fuzzy memories pointing different ways (pairwise cosine ~0.52 < create): no group
    # forms, and each alone joins c0, still above the create threshold.
    p = replace(PARAMS, buffer_size=3)
    r = run([E0, *(at_cosine(E0, o, 0.72) for o in (E1, E2, E3))], params=p)
    assert r.flushed == 3
    assert [c.size for c in r.state.clusters] == [4]


def test_old_buffer_flushes_on_the_next_memory() -> None:
    p = replace(PARAMS, buffer_max_age_s=100.0)
    s = run([E0, at_cosine(E0, E1, 0.7)], params=p).state
    early = step(s, MemoryIn("e2", E2, 0.5), 50.0, p)
    assert early.flushed == 0
    assert len(early.state.buffer) == 1
    late = step(s, MemoryIn("e2", E2, 0.5), 101.0, p)
    assert late.flushed == 1
    assert late.state.buffer == ()
    assert late.placed["e1"] == "c0"


def test_router_answers_place_a_fuzzy_memory() -> None:
    s = run([E0, E2]).state
    v = at_cosine(E0, E1, 0.7)
    band, options = classify(s, v, PARAMS)
    assert band == "fuzzy"
    assert [o.cluster_id for o in options] == ["c0", "c1"]
    joined = step(s, MemoryIn("x", v, 0.5, route="c1"), 9.0, PARAMS)
    assert (joined.band, joined.cluster_id, joined.buffered) == ("routed", "c1", False)
    opened = step(s, MemoryIn("x", v, 0.5, route=NEW), 9.0, PARAMS)
    assert (opened.band, opened.cluster_id) == ("routed", "c2")
    nonsense = step(s, MemoryIn("x", v, 0.5, route="c99"), 9.0, PARAMS)
    assert (nonsense.band, nonsense.buffered) == ("fuzzy", True)  # the buffer decides


def test_a_route_on_a_clear_memory_is_ignored() -> None:
    s = run([E0]).state
    r = step(s, MemoryIn("x", E0, 0.5, route=NEW), 1.0, PARAMS)
    assert (r.band, r.cluster_id) == ("merge", "c0")


def test_archived_clusters_take_no_routing() -> None:
    s = run([E0]).state
    archived = replace(s, clusters=(replace(s.clusters[0], archived=True),))
    r = step(archived, MemoryIn("x", E0, 0.5), 1.0, PARAMS)
    assert (r.band, r.cluster_id) == ("create", "c1")


def test_ties_go_to_the_older_cluster() -> None:
    p = replace(PARAMS, cluster_merge_threshold=1.0)
    s = run([E0, E1], params=p).state
    twin = replace(s.clusters[1], centroid=E0)
    s = replace(s, clusters=(s.clusters[0], twin))
    assert step(s, MemoryIn("x", E0, 0.5), 3.0, p).cluster_id == "c0"


def test_step_does_not_touch_its_input_state() -> None:
    s = run([E0, at_cosine(E0, E1, 0.7)]).state
    before = copy.deepcopy(s)
    for i in range(12):
        step(s, MemoryIn(f"n{i}", at_cosine(E0, E2, 0.7), 0.5), 10.0 + i, PARAMS)
    assert s == before  # every field, vectors bit for bit


@pytest.mark.parametrize(
    "vector",
    [np.zeros(DIM), np.full(DIM, np.nan), np.ones((2, DIM)), np.ones(DIM + 1)],
    ids=["zero", "nan", "2-d", "wrong-dim"],
)
def test_invalid_vectors_are_rejected(vector: FloatArray) -> None:
    s = run([E0]).state
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one contract
        step(s, MemoryIn("x", vector, 0.5), 1.0, PARAMS)


def test_params_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="create_threshold"):
        ClusterParams(merge_threshold=0.6, create_threshold=0.7)


def test_vectors_are_asked_for_only_when_a_split_may_happen() -> None:
    p = replace(PARAMS, split_min_size=3, split_dispersion=0.0, maintain_every=5)
    s = run([E0, at_cosine(E0, E1, 0.8), at_cosine(E0, E2, 0.8)], params=p).state
    assert vectors_needed(s, MemoryIn("x", E0), p) == []  # maintenance not due yet
    s = replace(s, since_maintenance=4)
    assert vectors_needed(s, MemoryIn("x", E0), p) == ["e0", "e1", "e2"]


# --- properties ----------------------------------------------------------------------------

raw_vectors = st.lists(
    st.lists(st.floats(-1.0, 1.0, allow_nan=False, width=32), min_size=4, max_size=4).filter(
        lambda v: sum(x * x for x in v) > 1e-2
    ),
    min_size=1,
    max_size=60,
)
SMALL = ClusterParams(
    buffer_size=3,
    maintain_every=5,
    split_min_size=4,
    split_dispersion=0.05,
    merge_threshold_max=0.9,
)


def replay(
    vectors: list[list[float]], times: list[float], params: ClusterParams
) -> list[StepResult]:
    s = ClusterState.empty(params)
    all_vectors = {f"e{i}": normalize(np.array(v, dtype=np.float32)) for i, v in enumerate(vectors)}
    out = []
    for i, (v, t) in enumerate(zip(vectors, times, strict=False)):
        r = step(s, MemoryIn(f"e{i}", v, 0.1 + (i % 4) / 4, (f"w{i % 3}",)), t, params, all_vectors)
        s = r.state
        out.append(r)
    return out


times = st.lists(st.floats(0.0, 1e7), min_size=60, max_size=60).map(sorted)


@settings(max_examples=60, deadline=None)
@given(raw_vectors, times)
def test_every_memory_is_in_exactly_one_cluster_or_the_buffer(
    vectors: list[list[float]], ts: list[float]
) -> None:
    for n, r in enumerate(replay(vectors, ts, SMALL), start=1):
        ids = [m for c in r.state.clusters for m in c.member_ids] + [
            b.event_id for b in r.state.buffer
        ]
        assert sorted(ids) == sorted(f"e{i}" for i in range(n))
        for c in r.state.clusters:
            assert float(np.linalg.norm(c.centroid)) == pytest.approx(1.0, abs=1e-5)
            assert 0.0 < c.coherence <= 1.0
        assert len({c.cluster_id for c in r.state.clusters}) == len(r.state.clusters)
        assert SMALL.create_threshold_min <= r.state.create_threshold <= r.state.merge_threshold
        assert r.state.merge_threshold <= SMALL.merge_threshold_max


@settings(max_examples=30, deadline=None)
@given(raw_vectors, times)
def test_same_input_same_order_gives_the_same_state(
    vectors: list[list[float]], ts: list[float]
) -> None:
    a, b = replay(vectors, ts, SMALL)[-1].state, replay(vectors, ts, SMALL)[-1].state
    assert a == b
