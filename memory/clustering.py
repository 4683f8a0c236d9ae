"""Incremental topic clustering of one user's turns (CLAG's routing step, two thresholds).

Each new vector is compared with every centroid of the user's clusters and lands in exactly
one of three bands:

- ``merge``  (best similarity >= ``merge_threshold``): join the best cluster; its centroid
  becomes the importance-weighted running mean of its members, re-normalised.
- ``create`` (best similarity < ``create_threshold``, or no clusters yet): open a new cluster
  whose centroid is the vector itself.
- ``fuzzy``  (in between): the vector is close enough to belong somewhere but not close
  enough to be trusted to steer a centroid. For now it joins the nearest cluster as a member
  (size and ``updated_ts`` change) while the centroid and its weight stay put, so borderline
  turns cannot drag a topic sideways. A fuzzy buffer that re-clusters such vectors in small
  groups (and optional LLM routing among the nearest descriptions) replaces this rule later;
  the band is reported so callers can already count and observe it.

Everything is pure and deterministic: ties between equally similar clusters go to the one
listed first, so callers should pass clusters in a stable order (e.g. by ``created_ts``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from memory.vectors import FloatArray, cosine_to_rows, normalize

Band = Literal["merge", "fuzzy", "create"]

# A turn marked importance 0 still counts a little: otherwise it would join a cluster with
# no say at all in its centroid, and a cluster made only of such turns would have weight 0.
MIN_WEIGHT = 0.05


@dataclass(frozen=True)
class ClusterParams:
    merge_threshold: float = 0.75
    create_threshold: float = 0.65

    def __post_init__(self) -> None:
        if not -1.0 <= self.create_threshold <= self.merge_threshold <= 1.0:
            raise ValueError(
                "need -1 <= create_threshold <= merge_threshold <= 1, got "
                f"{self.create_threshold} and {self.merge_threshold}"
            )


@dataclass(frozen=True, eq=False)
class Cluster:
    """One topic cluster. ``weight`` is the importance mass behind the centroid (fuzzy members
    add to ``size`` only). The centroid is stored read-only so a frozen cluster stays frozen."""

    cluster_id: str
    centroid: FloatArray = field(repr=False)
    weight: float
    size: int
    created_ts: float
    updated_ts: float

    def __post_init__(self) -> None:
        centroid = np.array(self.centroid, dtype=np.float32)  # a private copy
        if centroid.ndim != 1 or centroid.size == 0:
            raise ValueError(f"centroid must be a non-empty 1-d vector, got {centroid.shape}")
        centroid.flags.writeable = False
        object.__setattr__(self, "centroid", centroid)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return (
            self.cluster_id == other.cluster_id
            and np.array_equal(self.centroid, other.centroid)
            and self.weight == other.weight
            and self.size == other.size
            and self.created_ts == other.created_ts
            and self.updated_ts == other.updated_ts
        )

    # Defining __eq__ leaves __hash__ = None: clusters compare by value and are not hashable.


@dataclass(frozen=True)
class Assignment:
    cluster: Cluster  # the cluster after the update (new or changed)
    created: bool
    similarity: float  # to the chosen cluster before the update (1.0 when created)
    band: Band


def _unit_vector(vector: npt.ArrayLike) -> FloatArray:
    v = np.asarray(vector, dtype=np.float32)
    if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("vector must be a non-empty, finite 1-d array")
    unit = normalize(v)
    if not np.any(unit):
        raise ValueError("a zero vector has no direction to cluster by")
    return unit


def _importance_weight(importance: float) -> float:
    if not math.isfinite(importance):
        raise ValueError(f"importance must be finite, got {importance}")
    return max(importance, MIN_WEIGHT)


def _band(similarity: float, params: ClusterParams) -> Band:
    if similarity >= params.merge_threshold:
        return "merge"
    if similarity < params.create_threshold:
        return "create"
    return "fuzzy"


def assign(
    clusters: Sequence[Cluster],
    vector: npt.ArrayLike,
    importance: float,
    now: float,
    next_id: str,
    params: ClusterParams,
) -> Assignment:
    """Route one vector into the user's clusters; return the new or updated cluster.

    The input clusters are not modified (they are frozen); the caller stores the returned one.
    Raises ``ValueError`` for a zero, non-finite or wrong-dimension vector.
    """
    unit = _unit_vector(vector)
    weight = _importance_weight(importance)
    if not clusters:
        return _create(unit, weight, now, next_id)
    centroids = np.stack([c.centroid for c in clusters])
    if centroids.shape[1] != unit.shape[0]:
        raise ValueError(f"vector has {unit.shape[0]} dims, clusters have {centroids.shape[1]}")
    similarities = cosine_to_rows(unit, centroids)
    best = int(np.argmax(similarities))  # first maximum: ties resolve by input order
    similarity = float(similarities[best])
    band = _band(similarity, params)
    if band == "create":
        return _create(unit, weight, now, next_id)
    nearest = clusters[best]
    if band == "merge":
        mass = nearest.weight + weight
        # Running weighted mean of unit vectors, re-projected onto the sphere.
        weighted_sum = nearest.centroid * np.float32(nearest.weight) + unit * np.float32(weight)
        centroid = normalize(weighted_sum)
        updated = Cluster(
            nearest.cluster_id, centroid, mass, nearest.size + 1, nearest.created_ts, now
        )
    else:
        updated = Cluster(
            nearest.cluster_id,
            nearest.centroid,
            nearest.weight,
            nearest.size + 1,
            nearest.created_ts,
            now,
        )
    return Assignment(cluster=updated, created=False, similarity=similarity, band=band)


def _create(unit: FloatArray, weight: float, now: float, cluster_id: str) -> Assignment:
    cluster = Cluster(cluster_id, unit, weight, 1, now, now)
    return Assignment(cluster=cluster, created=True, similarity=1.0, band="create")


# --- serialisation -------------------------------------------------------------------------
#
# Layout: b"MSC1" | uint32 header length | JSON header | little-endian float32 centroid.
# JSON keeps the header extensible (later: energy, description, pinned) while the centroid
# stays compact binary (384 floats = 1.5 KB instead of ~8 KB of JSON text).

_MAGIC = b"MSC1"
_HEADER_LEN = struct.Struct("<I")
_CENTROID_DTYPE = np.dtype("<f4")


def cluster_to_bytes(c: Cluster) -> bytes:
    header = json.dumps(
        {
            "id": c.cluster_id,
            "weight": c.weight,
            "size": c.size,
            "created_ts": c.created_ts,
            "updated_ts": c.updated_ts,
            "dim": int(c.centroid.shape[0]),
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    centroid = c.centroid.astype(_CENTROID_DTYPE).tobytes()
    return _MAGIC + _HEADER_LEN.pack(len(header)) + header + centroid


def cluster_from_bytes(b: bytes) -> Cluster:
    """Inverse of ``cluster_to_bytes``; ``ValueError`` on anything that is not one."""
    prefix = len(_MAGIC) + _HEADER_LEN.size
    if len(b) < prefix or not b.startswith(_MAGIC):
        raise ValueError("not a serialised cluster")
    (header_len,) = _HEADER_LEN.unpack_from(b, len(_MAGIC))
    try:
        header = json.loads(b[prefix : prefix + header_len])
        dim = int(header["dim"])
        body = b[prefix + header_len :]
        if len(body) != dim * _CENTROID_DTYPE.itemsize:
            raise ValueError(f"centroid has {len(body)} bytes, expected {dim} float32")
        return Cluster(
            cluster_id=str(header["id"]),
            centroid=np.frombuffer(body, dtype=_CENTROID_DTYPE).astype(np.float32),
            weight=float(header["weight"]),
            size=int(header["size"]),
            created_ts=float(header["created_ts"]),
            updated_ts=float(header["updated_ts"]),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"corrupt cluster header: {exc}") from exc
