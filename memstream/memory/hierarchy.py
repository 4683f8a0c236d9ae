"""Hierarchical retrieval (CLAG's "shelf, then book"): pick a user's few relevant clusters by
their description / centroid similarity to the query, then the best members inside each.

Stable interface (the RPC calls it from ``rpc/retrieval.py``)::

    hits = hierarchical_search(query, clusters, turn_ids, turn_vectors, top_k=3, top_m=5)

- ``query``: the query embedding (any norm; it is normalised here).
- ``clusters``: anything shaped like ``ClusterLike`` -- ``memory.clustering.Cluster`` is one,
  and ``stores.redis_state.RedisState.clusters(tenant, user)`` returns them. Archived
  clusters are searchable (they only leave routing), so pass them too.
- ``turn_ids`` / ``turn_vectors``: the candidate turns and their unit embeddings, row for row
  (e.g. the RPC's per-user turn index, ``stores/turn_index.py``). A cluster member
  with no row here (expired, or outside the window read) is skipped.

It returns at most ``top_k * top_m`` hits: clusters in rank order, members by similarity
inside each; a turn belongs to one cluster, so no turn appears twice. Pure and deterministic:
ties go to the cluster / turn listed first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.memory.vectors import FloatArray, cosine_to_rows, normalize

TOP_K_CLUSTERS = 3
TOP_M_MEMBERS = 5


class ClusterLike(Protocol):
    """What the helper reads of a cluster (``memory.clustering.Cluster`` has all of it)."""

    @property
    def cluster_id(self) -> str: ...

    @property
    def centroid(self) -> FloatArray: ...  # unit norm

    @property
    def description_vector(self) -> FloatArray | None: ...  # unit norm, when described

    @property
    def member_ids(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class ClusterScore:
    cluster_id: str
    similarity: float  # max(cos to centroid, cos to description embedding)


@dataclass(frozen=True)
class HierarchyHit:
    event_id: str
    cluster_id: str
    similarity: float  # query to the turn
    cluster_similarity: float  # query to its cluster (the shelf score)


def rank_clusters(
    query: npt.ArrayLike, clusters: Sequence[ClusterLike], top_k: int = TOP_K_CLUSTERS
) -> list[ClusterScore]:
    """The ``top_k`` clusters most similar to the query, best first.

    A cluster scores the better of its centroid and its description embedding: the centroid
    knows what was said, the description what the topic is called, and a query may match
    either (the description embedding is optional; clusters without one use the centroid).
    """
    if top_k <= 0 or not clusters:
        return []
    q = normalize(np.asarray(query, dtype=np.float32))
    scores = cosine_to_rows(q, np.stack([c.centroid for c in clusters]))
    for i, c in enumerate(clusters):
        d = c.description_vector
        if d is not None and d.shape == q.shape:
            scores[i] = max(float(scores[i]), float(np.clip(d @ q, -1.0, 1.0)))
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [ClusterScore(clusters[int(i)].cluster_id, float(scores[int(i)])) for i in order]


def hierarchical_search(
    query: npt.ArrayLike,
    clusters: Sequence[ClusterLike],
    turn_ids: Sequence[str],
    turn_vectors: npt.ArrayLike,
    *,
    top_k: int = TOP_K_CLUSTERS,
    top_m: int = TOP_M_MEMBERS,
) -> list[HierarchyHit]:
    """Top ``top_m`` members (by cosine to the query) of each of the ``top_k`` best clusters.

    A selected cluster with no member among ``turn_ids`` contributes nothing; the next cluster
    is not promoted in its place, so the shelf stays the shelf the query chose.
    """
    if top_m <= 0 or not turn_ids:
        return []
    vectors = np.asarray(turn_vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(turn_ids):
        raise ValueError(f"{len(turn_ids)} ids against vectors of shape {vectors.shape}")
    q = normalize(np.asarray(query, dtype=np.float32))
    row_of = {event_id: i for i, event_id in enumerate(turn_ids)}
    by_id = {c.cluster_id: c for c in clusters}
    hits: list[HierarchyHit] = []
    for shelf in rank_clusters(q, clusters, top_k):
        rows = [row_of[m] for m in by_id[shelf.cluster_id].member_ids if m in row_of]
        if not rows:
            continue
        sims = cosine_to_rows(q, vectors[rows])
        for j in np.argsort(-sims, kind="stable")[:top_m]:
            row = rows[int(j)]
            hits.append(
                HierarchyHit(turn_ids[row], shelf.cluster_id, float(sims[int(j)]), shelf.similarity)
            )
    return hits


def expand_in_clusters(
    relevance: npt.ArrayLike,
    cluster_of: Sequence[str | None],
    *,
    seeds: int = 3,
    per_seed: int = 2,
    share: float = 0.9,
) -> npt.NDArray[np.float64]:
    """Cluster expansion for multi-hop questions: lift the cluster-mates of the best hits.

    The ``seeds`` most relevant rows each lift their ``per_seed`` most relevant mates (rows
    of the same cluster; ``cluster_of[i]`` is row i's cluster, None for none) to at least
    ``share`` of the seed's relevance, so the second half of an answer that shares a topic
    but not the question's words can follow its first half. Never lowers a relevance;
    ties go to the row listed first. Returns a new array.
    """
    rel = np.asarray(relevance, dtype=np.float64)
    if rel.shape != (len(cluster_of),):
        raise ValueError(f"{rel.shape[0]} relevances against {len(cluster_of)} clusters")
    out = rel.copy()
    order = np.argsort(-rel, kind="stable")
    members: dict[str, list[int]] = {}
    for row in order:  # best first inside each cluster
        c = cluster_of[int(row)]
        if c is not None:
            members.setdefault(c, []).append(int(row))
    for seed in order[: max(seeds, 0)]:
        c = cluster_of[int(seed)]
        if c is None:
            continue
        mates = [r for r in members[c] if r != int(seed)][: max(per_seed, 0)]
        lifted = share * float(rel[int(seed)])
        for r in mates:
            out[r] = max(out[r], lifted)
    return out
