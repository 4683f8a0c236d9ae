"""Cluster arithmetic and periodic maintenance (CLAG's reorganisation), pure.

Primitives: open a cluster, grow one with new members, merge two, split one in two by
k-means (k = 2). Maintenance runs every ``maintain_every`` new memories of a user, in this
order: split clusters over ``split_min_size`` members whose dispersion (``1 - coherence``)
exceeds ``split_dispersion``; merge active pairs whose centroids exceed
``cluster_merge_threshold``; archive clusters whose decayed energy fell under
``archive_energy`` unless pinned; adapt the thresholds within their bounds; regenerate stale
descriptions. Splitting first means only clusters already known to be too big and too
spread need their member vectors (the caller reads them; see ``clustering.vectors_needed``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from memstream.memory.cluster_describe import keywords
from memstream.memory.cluster_state import Cluster, ClusterParams, ClusterState, Member
from memstream.memory.vectors import FloatArray, normalize

KMEANS_ITERATIONS = 20
DESCRIBE_AGAINST = 20  # a description contrasts a cluster with its nearest neighbours
_TINY = 1e-9


@dataclass(frozen=True)
class Joining:
    """A memory entering a cluster: who it is, its unit vector, whether it is pinned."""

    member: Member
    vector: FloatArray
    pinned: bool = False


def _from_resultant(
    resultant: np.ndarray, weight: float, fallback: FloatArray
) -> tuple[FloatArray, float]:
    norm = float(np.linalg.norm(resultant))
    if norm < _TINY:  # opposite members cancelled out: keep the old direction
        return fallback, _TINY
    centroid = (resultant / norm).astype(np.float32)
    return centroid, min(1.0, norm / weight)


def open_cluster(cluster_id: str, joining: Sequence[Joining], now: float) -> Cluster:
    resultant = np.sum([j.vector.astype(np.float64) * j.member.weight for j in joining], axis=0)
    weight = sum(j.member.weight for j in joining)
    centroid, coherence = _from_resultant(resultant, weight, joining[0].vector)
    return Cluster(
        cluster_id=cluster_id,
        centroid=centroid,
        weight=weight,
        coherence=coherence,
        members=tuple(j.member for j in joining),
        created_ts=now,
        updated_ts=now,
        energy=float(len(joining)),
        energy_ts=now,
        pinned=any(j.pinned for j in joining),
    )


def grow(c: Cluster, joining: Sequence[Joining], now: float, params: ClusterParams) -> Cluster:
    """``c`` with new members: exact weighted running mean, energy topped up (capped)."""
    resultant = c.resultant.astype(np.float64) + np.sum(
        [j.vector.astype(np.float64) * j.member.weight for j in joining], axis=0
    )
    weight = c.weight + sum(j.member.weight for j in joining)
    centroid, coherence = _from_resultant(resultant, weight, c.centroid)
    return replace(
        c,
        centroid=centroid,
        weight=weight,
        coherence=coherence,
        members=c.members + tuple(j.member for j in joining),
        updated_ts=now,
        energy=min(params.energy_cap, c.energy_at(now, params) + len(joining)),
        energy_ts=now,
        pinned=c.pinned or any(j.pinned for j in joining),
    )


def merge_pair(a: Cluster, b: Cluster, now: float, params: ClusterParams) -> Cluster:
    """One cluster from two; it keeps ``a``'s id. Its description is stale (regenerated)."""
    weight = a.weight + b.weight
    resultant = a.resultant.astype(np.float64) + b.resultant.astype(np.float64)
    centroid, coherence = _from_resultant(resultant, weight, a.centroid)
    return replace(
        a,
        centroid=centroid,
        weight=weight,
        coherence=coherence,
        members=a.members + b.members,
        created_ts=min(a.created_ts, b.created_ts),
        updated_ts=max(a.updated_ts, b.updated_ts),
        energy=min(params.energy_cap, a.energy_at(now, params) + b.energy_at(now, params)),
        energy_ts=now,
        pinned=a.pinned or b.pinned,
        described_size=0,
    )


def split(
    c: Cluster,
    vectors: Mapping[str, FloatArray],
    new_id: str,
    now: float,
    params: ClusterParams,
) -> tuple[Cluster, Cluster] | None:
    """Two halves by weighted k-means (k = 2, deterministic seeds), or None when it cannot.

    Members whose vector the caller could not supply (an expired turn) stay in the first
    half, counted at the old centroid: they cannot be placed better, and none is lost.
    A split whose halves would be merged straight back (centroids above the merge bound) is
    refused, so split and merge never oscillate.
    """
    dim = c.centroid.shape[0]
    known = [i for i, m in enumerate(c.members) if m.event_id in vectors]
    known = [i for i in known if np.asarray(vectors[c.members[i].event_id]).shape == (dim,)]
    if len(known) < 2:
        return None
    x = normalize(np.stack([np.asarray(vectors[c.members[i].event_id]) for i in known]))
    w = np.array([c.members[i].weight for i in known], dtype=np.float64)
    # Seeds: the member least like the centroid, then the member least like that one.
    s1 = int(np.argmin(x @ c.centroid))
    s2 = int(np.argmin(x @ x[s1]))
    if s1 == s2:
        return None
    centres = np.stack([x[s1], x[s2]]).astype(np.float64)
    labels = np.zeros(len(known), dtype=np.int64)
    for _ in range(KMEANS_ITERATIONS):
        sims = x.astype(np.float64) @ centres.T
        new_labels = (sims[:, 1] > sims[:, 0]).astype(np.int64)  # ties stay in half 0
        if not new_labels.any() or new_labels.all():
            return None
        for k in (0, 1):
            centres[k] = normalize((x[new_labels == k] * w[new_labels == k, None]).sum(axis=0))
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
    if float(centres[0] @ centres[1]) > params.cluster_merge_threshold:
        return None
    half_of = {c.members[i].event_id: int(labels[j]) for j, i in enumerate(known)}
    halves: list[Cluster] = []
    energy = c.energy_at(now, params)
    for k, cluster_id in ((0, c.cluster_id), (1, new_id)):
        members = tuple(m for m in c.members if half_of.get(m.event_id, 0) == k)
        resultant = np.zeros(dim, dtype=np.float64)
        for m in members:
            v = vectors.get(m.event_id)
            unit = normalize(np.asarray(v)) if m.event_id in half_of and v is not None else None
            resultant += (c.centroid if unit is None else unit).astype(np.float64) * m.weight
        weight = sum(m.weight for m in members)
        centroid, coherence = _from_resultant(resultant, weight, c.centroid)
        halves.append(
            replace(
                c,
                cluster_id=cluster_id,
                centroid=centroid,
                weight=weight,
                coherence=coherence,
                members=members,
                created_ts=c.created_ts if k == 0 else now,
                updated_ts=now,
                energy=energy,
                energy_ts=now,
                description="" if k else c.description,
                description_vector=None,
                described_size=0,
            )
        )
    return halves[0], halves[1]


def split_candidates(
    state: ClusterState, params: ClusterParams, *, changed_only: bool = True
) -> list[Cluster]:
    """Active clusters over the size bound whose dispersion exceeds its bound; by default
    only those changed since the last maintenance (the others were judged then)."""
    since = state.maintained_ts if changed_only else -math.inf
    return [
        c
        for c in state.clusters
        if c.updated_ts > since
        and not c.archived
        and len(c.members) > params.split_min_size
        and 1.0 - c.coherence > params.split_dispersion
    ]


@dataclass(frozen=True)
class MaintenanceReport:
    splits: int = 0
    merges: int = 0
    archived: int = 0
    described: tuple[str, ...] = ()  # clusters whose description text changed


def maintain(
    state: ClusterState,
    now: float,
    params: ClusterParams,
    vectors: Mapping[str, FloatArray],
) -> tuple[ClusterState, MaintenanceReport]:
    # The five steps of the module docstring, in that order; each works on ``clusters``.
    clusters = list(state.clusters)
    next_number, splits = _split_step(state, clusters, now, params, vectors)
    clusters, merges = _merge_step(state, clusters, splits > 0, now, params)
    active_sizes, stale, archived = _archive_step(clusters, now, params)
    merge_t, create_t, streak, mean_size = _adapted_thresholds(state, params, active_sizes, splits)
    same = splits == 0 and merges == 0 and archived == 0
    described = _describe_step(state, clusters, stale, same, now, params)
    new_state = replace(
        state,
        clusters=tuple(clusters),
        merge_threshold=merge_t,
        create_threshold=create_t,
        next_number=next_number,
        since_maintenance=0,
        created_since_maintenance=0,
        last_mean_size=mean_size,
        growth_streak=streak,
        maintained_ts=now,
    )
    return new_state, MaintenanceReport(splits, merges, archived, tuple(described))


def _split_step(
    state: ClusterState,
    clusters: list[Cluster],
    now: float,
    params: ClusterParams,
    vectors: Mapping[str, FloatArray],
) -> tuple[int, int]:
    """1. Split each candidate in place (its second half appended); (the next cluster
    number, the splits made)."""
    next_number = state.next_number
    splits = 0
    for c in split_candidates(state, params):
        halves = split(c, vectors, f"c{next_number}", now, params)
        if halves is None:
            continue
        next_number += 1
        splits += 1
        position = next(i for i, x in enumerate(clusters) if x.cluster_id == c.cluster_id)
        clusters[position] = halves[0]
        clusters.append(halves[1])
    return next_number, splits


def _merge_step(
    state: ClusterState, clusters: list[Cluster], split_any: bool, now: float, params: ClusterParams
) -> tuple[list[Cluster], int]:
    """2. Merge active pairs above the bound, most similar first, each cluster once per pass;
    (the clusters left, the merges made)."""
    active = [i for i, c in enumerate(clusters) if not c.archived]
    # Only a cluster changed since the last maintenance can have come close to another:
    # compare those rows with all (20 x 500 instead of 500 x 500 similarities).
    since = state.maintained_ts
    fresh = [r for r, i in enumerate(active) if clusters[i].updated_ts > since]
    if len(active) <= 1 or not fresh:
        return clusters, 0
    # Without a split the clusters are the state's: reuse its centroid matrix.
    m = np.stack([clusters[i].centroid for i in active]) if split_any else state.active_centroids
    merges = 0
    gone: set[int] = set()
    used: set[int] = set()
    for r, col in _merge_pairs(m, fresh, params.cluster_merge_threshold):
        if r in used or col in used:
            continue
        used.update((r, col))
        a, b = active[r], active[col]
        clusters[a] = merge_pair(clusters[a], clusters[b], now, params)
        gone.add(b)
        merges += 1
    return [c for i, c in enumerate(clusters) if i not in gone], merges


def _merge_pairs(m: FloatArray, fresh: list[int], threshold: float) -> list[tuple[int, int]]:
    """The pairs of rows of ``m`` (one of them in ``fresh``) whose similarity exceeds
    ``threshold``, most similar first (ties by row)."""
    # One matrix-vector product per fresh row, not one matrix product: a multithreaded
    # BLAS GEMM waits for every core (measured 50 ms median on a busy 2-core machine,
    # against 0.6 ms for these 20 products).
    sims = np.stack([m @ m[r] for r in fresh])
    found: dict[tuple[int, int], float] = {}
    for f, col in zip(*np.nonzero(sims > threshold), strict=True):
        r, other = fresh[int(f)], int(col)
        if r != other:
            found[(min(r, other), max(r, other))] = float(sims[f, col])
    return sorted(found, key=lambda p: (-found[p], p))


def _archive_step(
    clusters: list[Cluster], now: float, params: ClusterParams
) -> tuple[list[int], list[int], int]:
    """3. Decay and archive in place; in the same pass, the sizes of the clusters still
    active and the positions of the stale descriptions; (sizes, stale, archived)."""
    active_sizes: list[int] = []
    stale: list[int] = []
    archived = 0
    for i, c in enumerate(clusters):
        if c.archived:
            continue
        if not c.pinned and c.energy_at(now, params) < params.archive_energy:
            clusters[i] = replace(c, archived=True, energy=c.energy_at(now, params), energy_ts=now)
            archived += 1
            continue
        active_sizes.append(len(c.members))
        if _needs_description(c, now, params):
            stale.append(i)
    return active_sizes, stale, archived


def _adapted_thresholds(
    state: ClusterState, params: ClusterParams, active_sizes: list[int], splits: int
) -> tuple[float, float, int, float]:
    """4. The thresholds adapted within their bounds; (merge, create, growth streak, mean
    active size)."""
    merge_t, create_t, streak = state.merge_threshold, state.create_threshold, state.growth_streak
    mean_size = sum(active_sizes) / len(active_sizes) if active_sizes else 0.0
    streak = streak + 1 if mean_size > state.last_mean_size else 0
    if streak >= params.growth_streak and mean_size > params.split_min_size / 2:
        merge_t, streak = min(params.merge_threshold_max, merge_t + params.threshold_step), 0
    opened = state.created_since_maintenance + splits
    if (
        state.since_maintenance > 0
        and len(active_sizes) >= params.maintain_every
        and opened / state.since_maintenance > params.explode_ratio
    ):
        create_t = max(params.create_threshold_min, create_t - params.threshold_step)
    create_t = min(create_t, merge_t)
    return merge_t, create_t, streak, mean_size


def _describe_step(
    state: ClusterState,
    clusters: list[Cluster],
    stale: list[int],
    same: bool,
    now: float,
    params: ClusterParams,
) -> list[str]:
    """5. Describe the stale clusters in place, each against its nearest active neighbours:
    what must tell it apart from the topics it could be mistaken for (and O(neighbours), not
    O(clusters)); the ids whose text changed. ``same``: the clusters are still the state's
    (its centroid matrix is reused)."""
    described: list[str] = []
    if not stale:
        return described
    active = [i for i, c in enumerate(clusters) if not c.archived]
    m = state.active_centroids if same else np.stack([clusters[i].centroid for i in active])
    for i in stale:
        c = clusters[i]
        near = np.argsort(-(m @ c.centroid), kind="stable")[: DESCRIBE_AGAINST + 1]
        df: Counter[str] = Counter()
        for j in near:
            df.update(clusters[active[int(j)]].term_counts.keys())
        text = keywords(c, df, len(near), params.description_keywords)
        if text != c.description:
            described.append(c.cluster_id)
        clusters[i] = replace(
            c,
            description=text,
            description_vector=c.description_vector if text == c.description else None,
            described_size=c.size,
            described_ts=now,
        )
    return described


def _needs_description(c: Cluster, now: float, params: ClusterParams) -> bool:
    if c.described_size == 0:
        return True
    if c.size >= c.described_size * (1.0 + params.describe_growth):
        return True
    return now - c.described_ts >= params.describe_age_s and c.updated_ts > c.described_ts
