"""CLAG clustering of one user's memories: a pure step function over an explicit state.

``step(state, memory, now, params, vectors) -> StepResult`` routes one memory and returns the
user's next ``ClusterState`` plus what changed. The same memories in the same order with the
same times give the same state; time is an argument, never read from a clock.

Routing compares the memory with the centroids of the *active* (not archived) clusters and
uses the state's current (adaptive) thresholds:

- ``merge``  (best similarity >= merge threshold): join that cluster; its centroid is the
  exact importance-weighted mean of its members (see ``cluster_state``).
- ``create`` (best < create threshold, or no active cluster): open a new cluster.
- ``fuzzy``  (in between): park the memory in the user's fuzzy buffer. When the buffer holds
  ``buffer_size`` memories, or its oldest is ``buffer_max_age_s`` old when the user's next
  memory arrives, a small agglomerative pass groups the buffer and each group joins the
  nearest cluster (at >= merge threshold) or, when the group is two or more memories that
  agree with each other, opens a new one; a lone memory joins its nearest cluster when that
  is still above the create threshold.
- ``routed``: a fuzzy memory placed by a routing answer (``MemoryIn.route``: a cluster id or
  ``"new"``), CLAG's SLM routing. No stage asks an LLM for it today: an answer that arrives
  after later events were clustered would make clusters depend on timing (README, "LLM
  path"). An unknown answer falls back to the buffer.

Every ``maintain_every`` memories, ``cluster_maintenance.maintain`` reorganises the clusters.
Splitting needs member vectors, which live with the turns in Redis: ask ``vectors_needed``
first and pass what it names as ``vectors`` (missing ones are tolerated).

Every memory is, at every step, in exactly one cluster or in the buffer. Event ids must be
unique per user: the caller deduplicates redelivered events (``memorize`` does, by its
processed-event marker) before calling ``step``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from memstream.memory.cluster_maintenance import (
    Joining,
    MaintenanceReport,
    grow,
    maintain,
    open_cluster,
    split_candidates,
)
from memstream.memory.cluster_state import (
    Buffered,
    Cluster,
    ClusterParams,
    ClusterState,
    Member,
)
from memstream.memory.vectors import FloatArray, cosine_to_rows, normalize

__all__ = [
    "MIN_WEIGHT",
    "NEW",
    "Band",
    "Buffered",
    "Cluster",
    "ClusterParams",
    "ClusterState",
    "Member",
    "MemoryIn",
    "RouteOption",
    "StepResult",
    "classify",
    "step",
    "vectors_needed",
    "with_descriptions",
]

Band = Literal["merge", "fuzzy", "create", "routed"]
NEW = "new"  # the router's answer for "none of these"

# A memory marked importance 0 still counts a little: otherwise it would join a cluster with
# no say at all in its centroid, and a cluster made only of such memories would weigh 0.
MIN_WEIGHT = 0.05


@dataclass(frozen=True, eq=False)
class MemoryIn:
    """One memory to route. ``terms``: its content words (``cluster_describe.terms_of``)."""

    event_id: str
    vector: npt.ArrayLike
    importance: float = 0.5
    terms: tuple[str, ...] = ()
    pinned: bool = False
    route: str | None = None  # the LLM router's answer for a fuzzy memory, if one was asked


@dataclass(frozen=True)
class RouteOption:
    cluster_id: str
    description: str
    similarity: float


@dataclass(frozen=True)
class StepResult:
    state: ClusterState
    band: Band
    cluster_id: str  # where the memory is; for a buffered one its nearest (provisional) cluster
    buffered: bool  # the memory waits in the fuzzy buffer
    similarity: float  # to the nearest active cluster before the step (1.0 when none)
    placed: dict[str, str] = field(default_factory=dict)  # event id -> cluster, this step
    changed: tuple[str, ...] = ()  # clusters created or modified
    removed: tuple[str, ...] = ()  # clusters merged away
    flushed: int = 0  # buffered memories placed by a flush
    created: int = 0  # clusters opened (routing, flush, split)
    maintenance: MaintenanceReport | None = None


def _unit(vector: npt.ArrayLike) -> FloatArray:
    v = np.asarray(vector, dtype=np.float32)
    if v.ndim != 1 or v.size == 0:
        raise ValueError("vector must be a non-empty, finite 1-d array")
    norm = math.sqrt(float(np.dot(v, v)))  # one pass checks finiteness and zero at once
    if not math.isfinite(norm):
        raise ValueError("vector must be a non-empty, finite 1-d array")
    if norm == 0.0:
        raise ValueError("a zero vector has no direction to cluster by")
    return (v / np.float32(norm)).astype(np.float32)


def _weight(importance: float) -> float:
    if not math.isfinite(importance):
        raise ValueError(f"importance must be finite, got {importance}")
    return max(importance, MIN_WEIGHT)


def _nearest(state: ClusterState, unit: FloatArray) -> tuple[FloatArray, int, float]:
    """Similarities to the active clusters, the best's position in ``state.clusters``, and it."""
    if not state.active:
        return np.zeros(0, dtype=np.float32), -1, -1.0
    centroids = state.active_centroids
    if centroids.shape[1] != unit.shape[0]:
        raise ValueError(f"vector has {unit.shape[0]} dims, clusters have {centroids.shape[1]}")
    sims = cosine_to_rows(unit, centroids)
    best = int(np.argmax(sims))  # first maximum: ties resolve by creation order
    return sims, state.active[best], float(sims[best])


def _band(similarity: float, position: int, state: ClusterState) -> Band:
    if position < 0 or similarity < state.create_threshold:
        return "create"
    return "merge" if similarity >= state.merge_threshold else "fuzzy"


def classify(
    state: ClusterState, vector: npt.ArrayLike, params: ClusterParams
) -> tuple[Band, list[RouteOption]]:
    """The band a memory would fall in, and the ``route_candidates`` nearest active clusters
    (best first): what the LLM router is shown for a fuzzy memory."""
    unit = _unit(vector)
    sims, position, similarity = _nearest(state, unit)
    order = np.argsort(-sims, kind="stable")[: params.route_candidates]
    options = [
        RouteOption(
            state.clusters[state.active[int(j)]].cluster_id,
            state.clusters[state.active[int(j)]].description,
            float(sims[int(j)]),
        )
        for j in order
    ]
    return _band(similarity, position, state), options


def vectors_needed(state: ClusterState, memory: MemoryIn, params: ClusterParams) -> list[str]:
    """Member ids whose vectors ``step`` will want for this memory: the members of clusters
    due for a split when this memory brings maintenance round (usually none)."""
    if state.since_maintenance + 1 < params.maintain_every:
        return []
    # A cluster one member short may cross the size bound with this very memory.
    # Any cluster may change in this step (a buffer flush), so ask for every candidate's.
    loose = replace(params, split_min_size=max(0, params.split_min_size - 1))
    return [
        m.event_id for c in split_candidates(state, loose, changed_only=False) for m in c.members
    ]


class _Work:
    """The mutable scratch of one step: clusters by position, the active centroids as one
    matrix kept in step with them, and what changed.

    The matrix is carried from state to state (copied once per step, rows replaced or
    appended), because re-stacking 500 centroids per event would cost more than routing.
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.clusters = list(state.clusters)
        self.touched: set[int] = set()
        self.next_number = state.next_number
        self.created = 0
        self.positions = list(state.active)  # increasing: rows found by bisection
        # Shared with ``state`` until a row changes (copy on write); a new row is a new array.
        self.matrix: FloatArray | None = state.active_centroids if self.positions else None
        self.owned = False

    def _track(self, position: int) -> None:
        self.touched.add(position)
        centroid = self.clusters[position].centroid
        row = bisect.bisect_left(self.positions, position)
        if row < len(self.positions) and self.positions[row] == position:
            assert self.matrix is not None
            if not self.owned:
                self.matrix, self.owned = self.matrix.copy(), True
            self.matrix[row] = centroid
            return
        self.positions.append(position)  # a new cluster: the last position
        stacked = centroid[None, :] if self.matrix is None else np.vstack([self.matrix, centroid])
        self.matrix, self.owned = stacked.astype(np.float32, copy=False), True

    def open(self, joining: Sequence[Joining], now: float) -> str:
        cluster_id = f"c{self.next_number}"
        self.next_number += 1
        self.created += 1
        self.clusters.append(open_cluster(cluster_id, joining, now))
        self._track(len(self.clusters) - 1)
        return cluster_id

    def grow(self, position: int, joining: Sequence[Joining], now: float, p: ClusterParams) -> str:
        self.clusters[position] = grow(self.clusters[position], joining, now, p)
        self._track(position)
        return self.clusters[position].cluster_id

    def nearest(self, unit: FloatArray) -> tuple[int, float]:
        """The active cluster nearest ``unit`` now (position, similarity); (-1, -1) if none."""
        if self.matrix is None:
            return -1, -1.0
        sims = cosine_to_rows(unit, self.matrix)
        best = int(np.argmax(sims))
        return self.positions[best], float(sims[best])

    def changed(self) -> tuple[str, ...]:
        return tuple(self.clusters[p].cluster_id for p in sorted(self.touched))

    def snapshot(self, buffer: tuple[Buffered, ...]) -> ClusterState:
        old = self.state
        new = replace(
            old,
            clusters=tuple(self.clusters),
            buffer=buffer,
            next_number=self.next_number,
            created_since_maintenance=old.created_since_maintenance + self.created,
            since_maintenance=old.since_maintenance + 1,
        )
        index = old.index
        if len(self.clusters) > len(old.clusters):
            index = dict(index)
            for position in range(len(old.clusters), len(self.clusters)):
                index[self.clusters[position].cluster_id] = position
        new.__dict__["index"] = index
        new.__dict__["active"] = tuple(self.positions)
        matrix = self.matrix if self.matrix is not None else np.zeros((0, 0), dtype=np.float32)
        matrix.flags.writeable = False  # shared by the states that follow until a row changes
        new.__dict__["active_centroids"] = matrix
        return new


def step(
    state: ClusterState,
    memory: MemoryIn,
    now: float,
    params: ClusterParams,
    vectors: Mapping[str, FloatArray] | None = None,
) -> StepResult:
    """Route one memory; flush the buffer and maintain when due. ``state`` is not modified.

    Raises ``ValueError`` for a zero, non-finite or wrong-dimension vector (before any change).
    """
    unit = _unit(memory.vector)
    member = Member(memory.event_id, _weight(memory.importance), tuple(memory.terms))
    joining = Joining(member, unit, memory.pinned)
    _, position, similarity = _nearest(state, unit)
    band = _band(similarity, position, state)
    work = _Work(state)
    buffer = state.buffer
    placed: dict[str, str] = {}

    if band == "fuzzy" and memory.route is not None:
        target = state.index.get(memory.route, -1)
        if memory.route == NEW:
            band, placed[memory.event_id] = "routed", work.open([joining], now)
        elif target >= 0 and not state.clusters[target].archived:
            band, placed[memory.event_id] = "routed", work.grow(target, [joining], now, params)
    if band == "merge":
        placed[memory.event_id] = work.grow(position, [joining], now, params)
    elif band == "create":
        placed[memory.event_id] = work.open([joining], now)
    elif band == "fuzzy":
        nearest = state.clusters[position].cluster_id
        buffer = (
            *buffer,
            Buffered(
                member.event_id, unit, member.weight, now, member.terms, memory.pinned, nearest
            ),
        )

    flushed = 0
    if buffer and (
        len(buffer) >= params.buffer_size or now - buffer[0].ts >= params.buffer_max_age_s
    ):
        placed.update(_flush(work, buffer, now, params))
        flushed, buffer = len(buffer), ()

    new_state = work.snapshot(buffer)
    report: MaintenanceReport | None = None
    if new_state.since_maintenance >= params.maintain_every:
        # The step's own memories are not stored anywhere yet: their vectors come from here.
        known = dict(vectors or {})
        known[memory.event_id] = unit
        known.update((b.event_id, b.vector) for b in state.buffer)
        new_state, report = maintain(new_state, now, params, known)

    changed: tuple[str, ...]
    removed: tuple[str, ...]
    if report is None:
        changed, removed = work.changed(), ()
    else:
        changed, removed = _diff(state, new_state)
    if report is not None or flushed:
        # Merges and splits move members: report where this step's memories ended up.
        # They all sit in clusters this step changed: look only there.
        where = {
            m.event_id: c.cluster_id
            for c in (new_state.clusters[new_state.index[i]] for i in changed)
            for m in c.members
            if m.event_id in placed
        }
        placed = {event_id: where[event_id] for event_id in placed}
    buffered = memory.event_id not in placed
    cluster_id = placed.get(memory.event_id, "")
    if buffered:
        cluster_id = next(b.nearest for b in new_state.buffer if b.event_id == memory.event_id)
    return StepResult(
        state=new_state,
        band=band,
        cluster_id=cluster_id,
        buffered=buffered,
        similarity=similarity if position >= 0 else 1.0,
        placed=placed,
        changed=changed,
        removed=removed,
        flushed=flushed,
        created=work.created + (report.splits if report else 0),
        maintenance=report,
    )


def _flush(
    work: _Work, buffer: Sequence[Buffered], now: float, params: ClusterParams
) -> dict[str, str]:
    """Agglomerate the buffer (centroid linkage at the create threshold), then place groups."""
    state = work.state
    groups: list[list[Buffered]] = [[b] for b in buffer]
    while len(groups) > 1:
        centres = normalize(np.stack([_resultant(g) for g in groups]))
        sims = centres @ centres.T
        np.fill_diagonal(sims, -np.inf)
        i, j = np.unravel_index(int(np.argmax(sims)), sims.shape)  # first maximum
        if sims[i, j] < state.create_threshold:
            break
        a, b = min(int(i), int(j)), max(int(i), int(j))
        groups[a] = groups[a] + groups[b]
        del groups[b]
    placed: dict[str, str] = {}
    for group in groups:
        joining = [
            Joining(Member(b.event_id, b.weight, b.terms), b.vector, b.pinned) for b in group
        ]
        best, similarity = work.nearest(normalize(_resultant(group)))
        if best >= 0 and (
            similarity >= state.merge_threshold
            or (len(group) == 1 and similarity >= state.create_threshold)
        ):
            cluster_id = work.grow(best, joining, now, params)
        else:
            cluster_id = work.open(joining, now)
        placed.update({b.event_id: cluster_id for b in group})
    return placed


def _resultant(group: Sequence[Buffered]) -> FloatArray:
    total = np.sum([b.vector.astype(np.float64) * b.weight for b in group], axis=0)
    return np.asarray(total, dtype=np.float32)


def _diff(old: ClusterState, new: ClusterState) -> tuple[tuple[str, ...], tuple[str, ...]]:
    before = {c.cluster_id: c for c in old.clusters}
    changed = tuple(c.cluster_id for c in new.clusters if before.get(c.cluster_id) is not c)
    kept = {c.cluster_id for c in new.clusters}
    removed = tuple(cluster_id for cluster_id in before if cluster_id not in kept)
    return changed, removed


def with_descriptions(
    state: ClusterState, descriptions: Mapping[str, tuple[str | None, npt.ArrayLike | None]]
) -> ClusterState:
    """Set descriptions from outside the engine: the LLM's text and/or the encoder's
    embedding of it, by cluster id (``None`` keeps the current text). Unknown ids are ignored."""
    clusters = list(state.clusters)
    for cluster_id, (text, vector) in descriptions.items():
        position = state.index.get(cluster_id)
        if position is None:
            continue
        c = clusters[position]
        unit = None if vector is None else _unit(vector)
        clusters[position] = replace(
            c, description=c.description if text is None else text, description_vector=unit
        )
    return replace(state, clusters=tuple(clusters))


def member_count(state: ClusterState) -> int:
    return sum(c.size for c in state.clusters) + len(state.buffer)


def cluster_ids(clusters: Sequence[Cluster]) -> list[str]:
    return [c.cluster_id for c in clusters]
