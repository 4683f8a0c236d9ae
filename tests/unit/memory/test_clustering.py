"""Two-threshold incremental clustering: bands, centroids, weights, serialisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.clustering import (
    MIN_WEIGHT,
    Assignment,
    Cluster,
    ClusterParams,
    assign,
    cluster_from_bytes,
    cluster_to_bytes,
)
from memory.vectors import FloatArray, cosine_to_rows, normalize

PARAMS = ClusterParams()  # merge 0.75, create 0.65
DIM = 8


def unit(*values: float) -> FloatArray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return normalize(v)


def at_cosine(base: FloatArray, other: FloatArray, cosine: float) -> FloatArray:
    """A unit vector with exactly ``cosine`` to unit ``base`` (``other`` orthogonal to it)."""
    return normalize(cosine * base + math.sqrt(1 - cosine**2) * other)


E0, E1, E2 = unit(1), unit(0, 1), unit(0, 0, 1)


def first(vector: FloatArray, importance: float = 0.5, now: float = 100.0) -> Cluster:
    return assign([], vector, importance, now, "c0", PARAMS).cluster


def test_first_vector_creates_a_cluster() -> None:
    a = assign([], E0, 0.5, 100.0, "c0", PARAMS)
    assert a == Assignment(a.cluster, created=True, similarity=1.0, band="create")
    c = a.cluster
    assert (c.cluster_id, c.size, c.weight, c.created_ts, c.updated_ts) == ("c0", 1, 0.5, 100, 100)
    np.testing.assert_allclose(c.centroid, E0)


def test_similar_vector_merges_and_moves_the_centroid() -> None:
    c0 = first(E0)
    v = at_cosine(E0, E1, 0.9)
    a = assign([c0], v, 0.5, 200.0, "c1", PARAMS)
    assert (a.created, a.band) == (False, "merge")
    assert a.similarity == pytest.approx(0.9, abs=1e-6)
    c = a.cluster
    assert (c.cluster_id, c.size, c.created_ts, c.updated_ts) == ("c0", 2, 100.0, 200.0)
    assert c.weight == pytest.approx(1.0)
    np.testing.assert_allclose(c.centroid, normalize(E0 + v), atol=1e-6)  # equal weights


def test_merge_centroid_is_importance_weighted() -> None:
    c0 = first(E0, importance=0.1)
    v = at_cosine(E0, E1, 0.8)
    c = assign([c0], v, 0.9, 200.0, "c1", PARAMS).cluster
    np.testing.assert_allclose(c.centroid, normalize(0.1 * E0 + 0.9 * v), atol=1e-6)
    assert c.weight == pytest.approx(1.0)
    # The heavier newcomer pulls the centroid closer to itself than to the old one.
    assert float(c.centroid @ v) > float(c.centroid @ E0)


def test_zero_importance_still_counts_a_little() -> None:
    c0 = first(E0, importance=0.0)
    assert c0.weight == MIN_WEIGHT
    c = assign([c0], at_cosine(E0, E1, 0.9), 0.0, 1.0, "c1", PARAMS).cluster
    assert c.weight == pytest.approx(2 * MIN_WEIGHT)


def test_dissimilar_vector_creates_a_new_cluster() -> None:
    c0 = first(E0)
    a = assign([c0], at_cosine(E0, E1, 0.5), 0.5, 200.0, "c1", PARAMS)
    assert (a.created, a.band, a.similarity, a.cluster.cluster_id) == (True, "create", 1.0, "c1")


def test_fuzzy_band_joins_nearest_without_moving_its_centroid() -> None:
    c0 = first(E0)
    a = assign([c0], at_cosine(E0, E1, 0.7), 0.5, 300.0, "c1", PARAMS)
    assert (a.created, a.band) == (False, "fuzzy")
    assert a.similarity == pytest.approx(0.7, abs=1e-6)
    c = a.cluster
    assert (c.cluster_id, c.size, c.updated_ts, c.weight) == ("c0", 2, 300.0, c0.weight)
    np.testing.assert_array_equal(c.centroid, c0.centroid)


def test_band_edges_merge_and_fuzzy_are_inclusive() -> None:
    c0 = first(E0)
    v = at_cosine(E0, E1, 0.7)
    sim = float(cosine_to_rows(v, c0.centroid[None, :])[0])  # the exact float32 similarity

    def band(merge: float, create: float) -> str:
        return assign([c0], v, 0.5, 1.0, "c1", ClusterParams(merge, create)).band

    assert band(sim, sim - 0.1) == "merge"  # exactly at merge_threshold joins
    assert band(sim + 1e-6, sim) == "fuzzy"  # exactly at create_threshold does not create
    assert band(sim + 0.2, sim + 1e-6) == "create"


def test_best_of_several_clusters_is_chosen() -> None:
    clusters = [first(E0), assign([], E1, 0.5, 1.0, "c1", PARAMS).cluster]
    a = assign(clusters, at_cosine(E1, E2, 0.95), 0.5, 2.0, "c2", PARAMS)
    assert (a.band, a.cluster.cluster_id) == ("merge", "c1")


def test_ties_go_to_the_first_cluster_listed() -> None:
    twin_a = assign([], E0, 0.5, 1.0, "a", PARAMS).cluster
    twin_b = assign([], E0, 0.5, 1.0, "b", PARAMS).cluster
    assert assign([twin_a, twin_b], E0, 0.5, 2.0, "c", PARAMS).cluster.cluster_id == "a"
    assert assign([twin_b, twin_a], E0, 0.5, 2.0, "c", PARAMS).cluster.cluster_id == "b"


def test_assign_is_deterministic_and_does_not_touch_its_inputs() -> None:
    c0 = first(E0)
    snapshot = cluster_to_bytes(c0)
    v = at_cosine(E0, E1, 0.8)
    results = [assign([c0], v.copy(), 0.5, 2.0, "c1", PARAMS) for _ in range(3)]
    assert all(r == results[0] for r in results)
    assert cluster_to_bytes(c0) == snapshot
    with pytest.raises(ValueError, match="read-only"):
        c0.centroid[0] = 0.0


def test_unnormalised_input_is_normalised() -> None:
    c = first(E0 * 7.0)
    assert float(np.linalg.norm(c.centroid)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "vector",
    [np.zeros(DIM), np.full(DIM, np.nan), np.ones((2, DIM)), np.ones(DIM + 1)],
    ids=["zero", "nan", "2-d", "wrong-dim"],
)
def test_invalid_vectors_are_rejected(vector: FloatArray) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one contract
        assign([first(E0)], vector, 0.5, 1.0, "c1", PARAMS)


def test_params_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="create_threshold"):
        ClusterParams(merge_threshold=0.6, create_threshold=0.7)


# --- serialisation -------------------------------------------------------------------------


def test_cluster_bytes_round_trip() -> None:
    c = assign([first(E0)], at_cosine(E0, E1, 0.9), 0.3, 123.5, "c1", PARAMS).cluster
    blob = cluster_to_bytes(c)
    assert cluster_from_bytes(blob) == c
    assert len(blob) < 200 + DIM * 4  # compact: header plus raw float32


def test_round_trip_of_a_realistic_384_dim_cluster() -> None:
    rng = np.random.default_rng(7)
    c = first(normalize(rng.standard_normal(384)))
    back = cluster_from_bytes(cluster_to_bytes(c))
    assert back == c
    assert back.centroid.dtype == np.float32


@pytest.mark.parametrize(
    "blob", [b"", b"nope", b"MSC1\x05\x00\x00\x00{bad}", b"MSC1\x02\x00\x00\x00{}"]
)
def test_corrupt_bytes_are_rejected(blob: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one contract
        cluster_from_bytes(blob)


def test_truncated_centroid_is_rejected() -> None:
    with pytest.raises(ValueError, match="float32"):
        cluster_from_bytes(cluster_to_bytes(first(E0))[:-2])


# --- properties ----------------------------------------------------------------------------

vectors = st.lists(
    st.lists(st.floats(-1.0, 1.0, allow_nan=False, width=32), min_size=4, max_size=4).filter(
        lambda v: sum(x * x for x in v) > 1e-3
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(vectors, st.lists(st.floats(0.0, 1.0), min_size=30, max_size=30))
def test_every_vector_lands_in_exactly_one_cluster(
    raw_vectors: list[list[float]], importances: list[float]
) -> None:
    clusters: dict[str, Cluster] = {}
    for i, (raw, importance) in enumerate(zip(raw_vectors, importances, strict=False)):
        a = assign(list(clusters.values()), np.array(raw), importance, float(i), f"c{i}", PARAMS)
        assert a.created == (a.cluster.cluster_id not in clusters)
        clusters[a.cluster.cluster_id] = a.cluster
        for c in clusters.values():
            assert float(np.linalg.norm(c.centroid)) == pytest.approx(1.0, abs=1e-5)
    # Each assignment adds exactly one member to exactly one cluster.
    assert sum(c.size for c in clusters.values()) == len(raw_vectors)
