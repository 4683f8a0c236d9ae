"""The values of CLAG clustering: parameters, one cluster, one user's whole clustering state.
(Their byte forms in Redis are ``stores.codecs``'.)

Everything here is an immutable value; the rules that turn one state into the next live in
``memory.clustering`` (routing, the fuzzy buffer) and ``memory.cluster_maintenance``.

A cluster keeps the *resultant* of its members, not only its direction: ``centroid`` is the
unit direction of ``sum(w_i * v_i)`` and ``coherence`` is ``|sum(w_i * v_i)| / sum(w_i)``,
which is also the weighted mean cosine of the members to the centroid. That makes the
centroid an exact importance-weighted running mean, lets two clusters merge exactly, and
gives each cluster its dispersion (``1 - coherence``) without reading a single member vector.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from memstream.memory.vectors import FloatArray

_DAY_S = 86_400.0


@dataclass(frozen=True)
class ClusterParams:
    """Every knob of the engine (defaults from DESIGN.md § Cluster; all are settings)."""

    # Starting values (they adapt). CLAG's write-up uses 0.75 / 0.65; with all-MiniLM-L6-v2
    # those split a topic's paraphrases into ~7 clusters (ARI 0.29 against 0.78 here on the
    # labelled synthetic stream; hierarchical LoCoMo-dev R@10 0.19 against 0.27): see
    # bench/clustering.py. Thresholds belong to an encoder; calibrate them with it.
    merge_threshold: float = 0.55  # join the nearest cluster at >= this
    create_threshold: float = 0.45  # open a new cluster below this
    buffer_size: int = 8  # flush the fuzzy buffer when it holds this many
    buffer_max_age_s: float = 3_600.0  # ... or when its oldest memory is this old
    maintain_every: int = 20  # maintenance after this many new memories of a user
    cluster_merge_threshold: float = 0.85  # merge two active clusters above this
    split_min_size: int = 50  # split only clusters with more members than this ...
    split_dispersion: float = 0.25  # ... whose 1 - coherence exceeds this
    energy_half_life_days: float = 7.0
    energy_cap: float = 10.0  # so a once-busy topic still archives after weeks of silence
    archive_energy: float = 0.1  # archive below this unless pinned
    pinned_energy_floor: float = 0.5  # a pinned cluster's energy never decays below this
    merge_threshold_max: float = 0.85  # adaptive bounds
    create_threshold_min: float = 0.35
    threshold_step: float = 0.01
    growth_streak: int = 3  # maintenances of growing mean size before merge is raised
    explode_ratio: float = 0.5  # share of new memories opening clusters that lowers create
    description_keywords: int = 6  # <= 10 words
    describe_growth: float = 0.5  # regenerate after the cluster grew by this share ...
    describe_age_s: float = _DAY_S  # ... or when the description is this old (and stale)
    route_candidates: int = 5  # clusters offered to the LLM router

    def __post_init__(self) -> None:
        if not -1.0 <= self.create_threshold <= self.merge_threshold <= 1.0:
            raise ValueError(
                "need -1 <= create_threshold <= merge_threshold <= 1, got "
                f"{self.create_threshold} and {self.merge_threshold}"
            )
        if not self.create_threshold_min <= self.create_threshold:
            raise ValueError("create_threshold must be >= create_threshold_min")
        if not self.merge_threshold <= self.merge_threshold_max <= 1.0:
            raise ValueError("merge_threshold must be <= merge_threshold_max <= 1")
        if min(self.buffer_size, self.maintain_every, self.split_min_size) < 1:
            raise ValueError("buffer_size, maintain_every and split_min_size must be >= 1")
        if not 1 <= self.description_keywords <= 10:
            raise ValueError("description_keywords must lie in [1, 10]")
        if self.energy_half_life_days <= 0.0:
            raise ValueError("energy_half_life_days must be positive")


@dataclass(frozen=True)
class Member:
    event_id: str
    weight: float  # importance weight (>= MIN_WEIGHT)
    terms: tuple[str, ...] = ()  # content words, for extractive descriptions


@dataclass(frozen=True, eq=False)
class Cluster:
    """One topic cluster. Centroid and description vector are stored read-only."""

    cluster_id: str
    centroid: FloatArray = field(repr=False)
    weight: float  # sum of member weights
    coherence: float  # |sum(w_i v_i)| / weight, in (0, 1]
    members: tuple[Member, ...]
    created_ts: float
    updated_ts: float
    energy: float = 1.0  # as of energy_ts; decays exponentially, +1 per new member
    energy_ts: float = 0.0
    pinned: bool = False
    archived: bool = False
    description: str = ""
    description_vector: FloatArray | None = field(default=None, repr=False)
    described_size: int = 0
    described_ts: float = 0.0

    def __post_init__(self) -> None:
        centroid = np.array(self.centroid, dtype=np.float32)  # a private copy
        if centroid.ndim != 1 or centroid.size == 0:
            raise ValueError(f"centroid must be a non-empty 1-d vector, got {centroid.shape}")
        centroid.flags.writeable = False
        object.__setattr__(self, "centroid", centroid)
        if self.description_vector is not None:
            d = np.array(self.description_vector, dtype=np.float32)
            d.flags.writeable = False
            object.__setattr__(self, "description_vector", d)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def member_ids(self) -> tuple[str, ...]:
        return tuple(m.event_id for m in self.members)

    @property
    def resultant(self) -> FloatArray:
        """``sum(w_i * v_i)`` of the members (float64 for exact-ish accumulation)."""
        return (self.centroid.astype(np.float64) * (self.coherence * self.weight)).astype(
            np.float32
        )

    @cached_property
    def term_counts(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for m in self.members:
            counts.update(m.terms)
        return counts

    def energy_at(self, now: float, params: ClusterParams) -> float:
        elapsed = max(0.0, now - self.energy_ts)
        e: float = self.energy * 0.5 ** (elapsed / (params.energy_half_life_days * _DAY_S))
        return max(e, params.pinned_energy_floor) if self.pinned else e

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return _value_of(self) == _value_of(other)

    __hash__ = None  # type: ignore[assignment]  # compared by value, not hashable


@dataclass(frozen=True, eq=False)
class Buffered:
    """A fuzzy memory waiting in the user's buffer."""

    event_id: str
    vector: FloatArray = field(repr=False)  # unit norm
    weight: float
    ts: float
    terms: tuple[str, ...] = ()
    pinned: bool = False
    nearest: str = ""  # the nearest cluster when it was buffered (its provisional cluster)


@dataclass(frozen=True, eq=False)
class ClusterState:
    """One user's clustering: clusters in creation order, the fuzzy buffer, adaptive
    thresholds and the counters maintenance needs. ``ClusterState.empty(params)`` starts one."""

    clusters: tuple[Cluster, ...]
    buffer: tuple[Buffered, ...]
    merge_threshold: float
    create_threshold: float
    next_number: int = 0
    since_maintenance: int = 0
    created_since_maintenance: int = 0
    last_mean_size: float = 0.0
    growth_streak: int = 0
    maintained_ts: float = -math.inf  # clusters updated since then are checked for merges

    @staticmethod
    def empty(params: ClusterParams) -> ClusterState:
        return ClusterState((), (), params.merge_threshold, params.create_threshold)

    @cached_property
    def index(self) -> dict[str, int]:
        return {c.cluster_id: i for i, c in enumerate(self.clusters)}

    @cached_property
    def active(self) -> tuple[int, ...]:
        """Positions of the clusters that take routing (not archived)."""
        return tuple(i for i, c in enumerate(self.clusters) if not c.archived)

    @cached_property
    def active_centroids(self) -> FloatArray:
        if not self.active:
            return np.zeros((0, 0), dtype=np.float32)
        matrix = np.stack([self.clusters[i].centroid for i in self.active])
        matrix.flags.writeable = False  # shared with the states that follow (copy on write)
        return matrix

    def cluster(self, cluster_id: str) -> Cluster | None:
        i = self.index.get(cluster_id)
        return None if i is None else self.clusters[i]

    def where(self) -> dict[str, str]:
        """event id -> cluster id of every clustered memory ("" for a buffered one)."""
        out = {m.event_id: c.cluster_id for c in self.clusters for m in c.members}
        out.update({b.event_id: "" for b in self.buffer})
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterState):
            return NotImplemented
        return _value_of(self) == _value_of(other)

    __hash__ = None  # type: ignore[assignment]


def _value_of(value: Cluster | ClusterState | Buffered) -> tuple[object, ...]:
    """Every field of ``value``, what equality compares: vectors as their float32 bytes
    (equal means bit-identical; an array has no truth value), buffered memories (which
    compare by identity) by their own fields, clusters by theirs (``Cluster.__eq__``)."""
    out: list[object] = []
    for f in fields(value):
        v = getattr(value, f.name)
        if isinstance(v, np.ndarray):
            v = np.asarray(v, dtype=np.float32).tobytes()
        elif f.name == "buffer":
            v = tuple(_value_of(b) for b in v)
        out.append(v)
    return tuple(out)


def finite(x: float, what: str) -> float:
    if not math.isfinite(x):
        raise ValueError(f"{what} must be finite, got {x}")
    return x
