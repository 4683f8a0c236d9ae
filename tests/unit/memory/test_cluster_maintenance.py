"""CLAG maintenance: merge, split (k-means k=2), energy decay and archiving, pinned floor,
adaptive thresholds and extractive descriptions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.memory.cluster_describe import document_frequency, keywords, terms_of
from memstream.memory.cluster_maintenance import Joining, maintain, merge_pair, open_cluster, split
from memstream.memory.cluster_state import Cluster, ClusterParams, ClusterState, Member
from memstream.memory.clustering import MemoryIn, step
from memstream.memory.vectors import FloatArray, normalize

PARAMS = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
DAY = 86_400.0
DIM = 8


def unit(*values: float) -> FloatArray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return normalize(v)


E0, E1, E2 = unit(1), unit(0, 1), unit(0, 0, 1)


def cluster(
    cluster_id: str, vectors: list[FloatArray], now: float = 0.0, terms: tuple[str, ...] = ()
) -> Cluster:
    joining = [
        Joining(Member(f"{cluster_id}-{i}", 0.5, terms), normalize(v))
        for i, v in enumerate(vectors)
    ]
    return open_cluster(cluster_id, joining, now)


def state_of(*clusters: Cluster, **kwargs: object) -> ClusterState:
    return replace(ClusterState.empty(PARAMS), clusters=clusters, **kwargs)  # type: ignore[arg-type]


def two_topics(n: int, seed: int = 0) -> tuple[list[FloatArray], dict[str, FloatArray]]:
    rng = np.random.default_rng(seed)
    vectors = [normalize((E0 if i % 2 else E1) + 0.1 * rng.standard_normal(DIM)) for i in range(n)]
    return vectors, {f"c0-{i}": v for i, v in enumerate(vectors)}


# --- merge ---------------------------------------------------------------------------------


def test_merge_keeps_every_member_and_the_exact_mean() -> None:
    a = cluster("c0", [E0, normalize(E0 + 0.2 * E1)])
    b = cluster("c1", [normalize(E0 + 0.3 * E2)])
    m = merge_pair(a, b, 10.0, PARAMS)
    assert m.cluster_id == "c0"
    assert m.member_ids == a.member_ids + b.member_ids
    assert m.weight == pytest.approx(a.weight + b.weight)
    expected = normalize(a.resultant + b.resultant)
    np.testing.assert_allclose(m.centroid, expected, atol=1e-6)


def test_maintenance_merges_close_active_clusters_only() -> None:
    close = normalize(E0 + 0.1 * E1)  # cosine ~0.995 to E0
    s = state_of(
        cluster("c0", [E0]),
        cluster("c1", [close]),
        cluster("c2", [E1]),
        replace(cluster("c3", [E0]), archived=True),
    )
    new, report = maintain(s, 0.0, PARAMS, {})
    assert report.merges == 1
    assert [c.cluster_id for c in new.clusters] == ["c0", "c2", "c3"]
    assert new.clusters[0].member_ids == ("c0-0", "c1-0")
    assert new.clusters[2].archived  # an archived twin is not merged


# --- split ---------------------------------------------------------------------------------


def test_split_separates_two_topics_and_keeps_every_member() -> None:
    vectors, by_id = two_topics(60)
    c = cluster("c0", vectors)
    halves = split(c, by_id, "c9", 5.0, PARAMS)
    assert halves is not None
    a, b = halves
    assert (a.cluster_id, b.cluster_id) == ("c0", "c9")
    assert sorted(a.member_ids + b.member_ids) == sorted(c.member_ids)
    assert a.weight + b.weight == pytest.approx(c.weight)
    assert {round(float(a.centroid @ E0)), round(float(b.centroid @ E0))} == {0, 1}
    assert a.coherence > c.coherence
    assert b.coherence > c.coherence


def test_split_refuses_a_tight_cluster_and_tolerates_missing_vectors() -> None:
    tight = [normalize(E0 + 0.01 * (E1 if i % 2 else E2)) for i in range(10)]
    c = cluster("c0", tight)
    assert split(c, {f"c0-{i}": v for i, v in enumerate(tight)}, "c1", 0.0, PARAMS) is None
    vectors, by_id = two_topics(20)
    del by_id["c0-3"], by_id["c0-4"]  # expired turns: placed in the first half
    halves = split(cluster("c0", vectors), by_id, "c1", 0.0, PARAMS)
    assert halves is not None
    assert {"c0-3", "c0-4"} <= set(halves[0].member_ids)
    assert len(halves[0].member_ids) + len(halves[1].member_ids) == 20


def test_maintenance_splits_big_dispersed_clusters() -> None:
    vectors, by_id = two_topics(60)
    s = state_of(cluster("c0", vectors), next_number=1)
    assert 1.0 - s.clusters[0].coherence > PARAMS.split_dispersion
    new, report = maintain(s, 0.0, PARAMS, by_id)
    assert report.splits == 1
    assert [c.cluster_id for c in new.clusters] == ["c0", "c1"]
    assert new.next_number == 2
    assert sum(c.size for c in new.clusters) == 60
    small, _ = maintain(state_of(cluster("c0", vectors[:50])), 0.0, PARAMS, by_id)
    assert len(small.clusters) == 1  # not over split_min_size


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 80), st.integers(0, 1000), st.floats(0.0, 1.0))
def test_merge_and_split_preserve_the_member_count(n: int, seed: int, spread: float) -> None:
    rng = np.random.default_rng(seed)
    vectors = [normalize(E0 + spread * rng.standard_normal(DIM)) for _ in range(n)]
    c = cluster("c0", vectors)
    halves = split(c, {f"c0-{i}": v for i, v in enumerate(vectors)}, "c1", 0.0, PARAMS)
    if halves is not None:
        assert sorted(halves[0].member_ids + halves[1].member_ids) == sorted(c.member_ids)
        for h in halves:
            assert float(np.linalg.norm(h.centroid)) == pytest.approx(1.0, abs=1e-5)
        merged = merge_pair(halves[0], halves[1], 0.0, PARAMS)
        assert sorted(merged.member_ids) == sorted(c.member_ids)
        np.testing.assert_allclose(merged.centroid, c.centroid, atol=1e-4)


# --- energy --------------------------------------------------------------------------------


def test_energy_decays_and_idle_clusters_are_archived_unless_pinned() -> None:
    idle = cluster("c0", [E0])  # energy 1 at t=0, half-life 7 days
    busy = replace(cluster("c1", [E1]), energy_ts=30 * DAY)
    pinned = replace(cluster("c2", [E2]), pinned=True)
    assert idle.energy_at(7 * DAY, PARAMS) == pytest.approx(0.5)
    assert pinned.energy_at(365 * DAY, PARAMS) == PARAMS.pinned_energy_floor
    new, report = maintain(state_of(idle, busy, pinned), 30 * DAY, PARAMS, {})
    assert report.archived == 1
    assert [c.archived for c in new.clusters] == [True, False, False]


def test_a_new_member_tops_energy_up_to_the_cap() -> None:
    s = ClusterState.empty(PARAMS)
    for i in range(15):
        s = step(s, MemoryIn(f"e{i}", E0), float(i), PARAMS).state
    assert s.clusters[0].energy == PARAMS.energy_cap


def test_pinned_memory_pins_its_cluster() -> None:
    s = step(ClusterState.empty(PARAMS), MemoryIn("e0", E0), 0.0, PARAMS).state
    s = step(s, MemoryIn("e1", E0, pinned=True), 1.0, PARAMS).state
    assert s.clusters[0].pinned


# --- adaptive thresholds -------------------------------------------------------------------


def test_merge_threshold_rises_while_big_clusters_keep_growing() -> None:
    p = replace(PARAMS, growth_streak=2)
    big = cluster("c0", [E0] * 40)
    s = state_of(big, last_mean_size=30.0, growth_streak=1)
    new, _ = maintain(s, 0.0, p, {})
    assert new.merge_threshold == pytest.approx(PARAMS.merge_threshold + p.threshold_step)
    capped = replace(s, merge_threshold=p.merge_threshold_max)
    assert maintain(capped, 0.0, p, {})[0].merge_threshold == p.merge_threshold_max


def test_create_threshold_falls_when_the_cluster_count_explodes() -> None:
    rng = np.random.default_rng(3)  # 25 unrelated topics (64-d, so none merge)
    many = [cluster(f"c{i}", [normalize(rng.standard_normal(64))]) for i in range(25)]
    s = state_of(*many, since_maintenance=20, created_since_maintenance=15)
    new, _ = maintain(s, 0.0, PARAMS, {})
    assert new.create_threshold == pytest.approx(PARAMS.create_threshold - PARAMS.threshold_step)
    calm = replace(s, created_since_maintenance=5)
    assert maintain(calm, 0.0, PARAMS, {})[0].create_threshold == PARAMS.create_threshold
    floor = replace(s, create_threshold=PARAMS.create_threshold_min)
    assert maintain(floor, 0.0, PARAMS, {})[0].create_threshold == PARAMS.create_threshold_min


# --- descriptions --------------------------------------------------------------------------


def test_terms_skip_filler_and_keep_order() -> None:
    assert terms_of("Hi, thanks! My refund for the blue kettle, the refund please") == (
        "refund",
        "blue",
        "kettle",
    )


def test_keywords_are_what_sets_a_cluster_apart() -> None:
    a = cluster("c0", [E0] * 3, terms=("order", "refund", "kettle"))
    b = cluster("c1", [E1] * 3, terms=("order", "delivery", "courier"))
    df = document_frequency([a, b])
    assert keywords(a, df, 2, 2) == "kettle refund"
    assert "order" not in keywords(b, df, 2, 6).split()


def test_descriptions_regenerate_on_growth_or_age() -> None:
    a = cluster("c0", [E0] * 4, terms=("refund",))
    s, report = maintain(state_of(a), 0.0, PARAMS, {})
    c = s.clusters[0]
    assert (c.description, c.described_size, report.described) == ("refund", 4, ("c0",))
    assert len(c.description.split()) <= 10
    with_vector = replace(c, description_vector=E0)
    unchanged, again = maintain(state_of(with_vector), 10.0, PARAMS, {})
    assert again.described == ()
    assert unchanged.clusters[0].description_vector is not None
    grown = replace(with_vector, members=c.members * 2, updated_ts=5.0)
    regrown, _ = maintain(state_of(grown), 10.0, PARAMS, {})
    assert regrown.clusters[0].described_size == 8
    old = replace(with_vector, updated_ts=2 * DAY)
    assert maintain(state_of(old), 2 * DAY, PARAMS, {})[0].clusters[0].described_ts == 2 * DAY
