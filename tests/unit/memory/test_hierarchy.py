"""Hierarchical retrieval: the query's best clusters first, then the best members inside."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from memstream.memory.cluster_maintenance import Joining, open_cluster
from memstream.memory.cluster_state import Cluster, Member
from memstream.memory.hierarchy import (
    HierarchyHit,
    expand_in_clusters,
    hierarchical_search,
    rank_clusters,
)
from memstream.memory.vectors import FloatArray, normalize

DIM = 6


def unit(*values: float) -> FloatArray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return normalize(v)


E = [unit(*([0.0] * i), 1.0) for i in range(DIM)]


def cluster(cluster_id: str, members: dict[str, FloatArray]) -> Cluster:
    return open_cluster(cluster_id, [Joining(Member(i, 0.5), v) for i, v in members.items()], 0.0)


def test_clusters_rank_by_centroid_or_description_whichever_is_closer() -> None:
    a = cluster("a", {"a1": E[0]})
    b = replace(cluster("b", {"b1": E[1]}), description_vector=E[2])
    c = cluster("c", {"c1": normalize(E[2] + E[3])})
    ranked = rank_clusters(E[2], [a, b, c], top_k=2)
    assert [r.cluster_id for r in ranked] == ["b", "c"]  # b's description names the query
    assert ranked[0].similarity == pytest.approx(1.0)
    assert rank_clusters(E[2], [], 3) == []


def test_search_takes_top_m_members_of_top_k_clusters() -> None:
    near = {f"n{i}": normalize(E[0] + 0.1 * i * E[4]) for i in range(4)}
    far = {"f1": normalize(E[1] + 0.2 * E[0]), "f2": E[1]}
    other = {"o1": E[3]}
    clusters = [cluster("far", far), cluster("near", near), cluster("other", other)]
    ids = [*near, *far, *other, "stray"]
    vectors = np.stack([*near.values(), *far.values(), *other.values(), E[0]])
    hits = hierarchical_search(E[0], clusters, ids, vectors, top_k=2, top_m=2)
    assert [h.event_id for h in hits] == ["n0", "n1", "f1", "f2"]
    assert all(isinstance(h, HierarchyHit) for h in hits)
    assert hits[0].cluster_id == "near"
    assert hits[2].cluster_id == "far"
    assert hits[0].similarity == pytest.approx(1.0)
    # "stray" is in no cluster: hierarchical search cannot find it, however close it is
    assert "stray" not in {h.event_id for h in hits}


def test_members_without_a_vector_are_skipped() -> None:
    c = cluster("a", {"a1": E[0], "gone": E[0]})
    hits = hierarchical_search(E[0], [c], ["a1"], E[0][None, :])
    assert [h.event_id for h in hits] == ["a1"]


def test_mismatched_ids_and_vectors_are_rejected() -> None:
    with pytest.raises(ValueError, match="ids against"):
        hierarchical_search(E[0], [cluster("a", {"a1": E[0]})], ["a1", "a2"], E[0][None, :])


def test_expansion_lifts_the_best_hits_cluster_mates_never_lowers() -> None:
    relevance = [0.9, 0.2, 0.1, 0.3, 0.05]
    clusters = ["a", "a", "a", "b", None]
    out = expand_in_clusters(relevance, clusters, seeds=1, per_seed=1, share=0.5)
    # The seed (row 0) lifts its best mate (row 1) to half its relevance; row 2 is not lifted.
    assert out.tolist() == pytest.approx([0.9, 0.45, 0.1, 0.3, 0.05])
    assert relevance == [0.9, 0.2, 0.1, 0.3, 0.05]  # a new array
    assert (expand_in_clusters(relevance, clusters, seeds=5, per_seed=5) >= relevance).all()
    with pytest.raises(ValueError, match="clusters"):
        expand_in_clusters(relevance, clusters[:2])
