"""The byte forms of a user's engine state in Redis: clusters, the clustering engine,
recurrence key states and pending turns.

``stores.redis_state`` writes and reads these (and ``tests.fakes`` keeps the same bytes, so
the fake answers what Redis would). The values themselves -- ``Cluster``, ``ClusterState``,
``KeyState``, ``TurnSignal`` -- and every rule about them are ``memory``'s; only the layout
of their bytes lives here. Every decoder raises ``ValueError`` on anything that is not one
of its blobs, so a corrupt value is reported as such, not as a ``KeyError`` deep inside.
"""

from __future__ import annotations

import json
import math
import struct
from functools import lru_cache
from typing import Any

import numpy as np

from memstream.memory.cluster_state import Buffered, Cluster, ClusterState, Member
from memstream.memory.recurrence import KeyState, TurnSignal
from memstream.memory.vectors import FloatArray

# --- clusters (``clusters`` hash fields, the ``engine`` field of ``meta``) ------------------
#
# Layout of both blobs: magic | uint32 header length | JSON header | little-endian float32
# vectors. JSON keeps the header extensible; vectors stay compact binary (384 floats = 1.5 KB
# instead of ~8 KB of JSON text).

_CLUSTER_MAGIC = b"MSC2"
_ENGINE_MAGIC = b"MSE1"
_HEADER_LEN = struct.Struct("<I")
_F32 = np.dtype("<f4")


def _pack(magic: bytes, header: dict[str, Any], vectors: list[FloatArray]) -> bytes:
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    body = b"".join(np.asarray(v, dtype=_F32).tobytes() for v in vectors)
    return magic + _HEADER_LEN.pack(len(head)) + head + body


def _unpack(magic: bytes, b: bytes) -> tuple[dict[str, Any], bytes]:
    prefix = len(magic) + _HEADER_LEN.size
    if len(b) < prefix or not b.startswith(magic):
        raise ValueError(f"not a serialised {magic.decode()} value")
    (header_len,) = _HEADER_LEN.unpack_from(b, len(magic))
    try:
        header = json.loads(b[prefix : prefix + header_len])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt header: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError("corrupt header: not an object")
    return header, b[prefix + header_len :]


def _vectors(body: bytes, dim: int, count: int) -> list[FloatArray]:
    if dim <= 0 or len(body) != dim * count * _F32.itemsize:
        raise ValueError(f"vector body has {len(body)} bytes, expected {count} x {dim} float32")
    flat = np.frombuffer(body, dtype=_F32).astype(np.float32)
    return [flat[i * dim : (i + 1) * dim] for i in range(count)]


def cluster_to_bytes(c: Cluster) -> bytes:
    vectors = [c.centroid] if c.description_vector is None else [c.centroid, c.description_vector]
    header = {
        "id": c.cluster_id,
        "weight": c.weight,
        "coherence": c.coherence,
        "members": [[m.event_id, m.weight, " ".join(m.terms)] for m in c.members],
        "created_ts": c.created_ts,
        "updated_ts": c.updated_ts,
        "energy": c.energy,
        "energy_ts": c.energy_ts,
        "pinned": c.pinned,
        "archived": c.archived,
        "description": c.description,
        "described_size": c.described_size,
        "described_ts": c.described_ts,
        "dim": int(c.centroid.shape[0]),
        "nvec": len(vectors),
    }
    return _pack(_CLUSTER_MAGIC, header, vectors)


def cluster_from_bytes(b: bytes) -> Cluster:
    """Inverse of ``cluster_to_bytes``; ``ValueError`` on anything that is not one."""
    header, body = _unpack(_CLUSTER_MAGIC, b)
    try:
        vectors = _vectors(body, int(header["dim"]), int(header["nvec"]))
        return Cluster(
            cluster_id=str(header["id"]),
            centroid=vectors[0],
            weight=float(header["weight"]),
            coherence=float(header["coherence"]),
            members=tuple(
                Member(str(i), float(w), tuple(str(t).split())) for i, w, t in header["members"]
            ),
            created_ts=float(header["created_ts"]),
            updated_ts=float(header["updated_ts"]),
            energy=float(header["energy"]),
            energy_ts=float(header["energy_ts"]),
            pinned=bool(header["pinned"]),
            archived=bool(header["archived"]),
            description=str(header["description"]),
            description_vector=vectors[1] if len(vectors) > 1 else None,
            described_size=int(header["described_size"]),
            described_ts=float(header["described_ts"]),
        )
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"corrupt cluster header: {exc}") from exc


def engine_to_bytes(s: ClusterState) -> bytes:
    """Everything of a ``ClusterState`` but its clusters (those are stored one per field)."""
    header = {
        "merge": s.merge_threshold,
        "create": s.create_threshold,
        "next": s.next_number,
        "since": s.since_maintenance,
        "created_since": s.created_since_maintenance,
        "last_mean": s.last_mean_size,
        "streak": s.growth_streak,
        "maintained_ts": s.maintained_ts if math.isfinite(s.maintained_ts) else None,
        "buffer": [
            [b.event_id, b.weight, b.ts, " ".join(b.terms), b.pinned, b.nearest] for b in s.buffer
        ],
        "dim": int(s.buffer[0].vector.shape[0]) if s.buffer else 0,
    }
    return _pack(_ENGINE_MAGIC, header, [b.vector for b in s.buffer])


def engine_from_bytes(b: bytes, clusters: tuple[Cluster, ...]) -> ClusterState:
    header, body = _unpack(_ENGINE_MAGIC, b)
    try:
        entries = header["buffer"]
        vectors = _vectors(body, int(header["dim"]), len(entries)) if entries else []
        buffer = tuple(
            Buffered(str(i), v, float(w), float(ts), tuple(str(t).split()), bool(p), str(n))
            for (i, w, ts, t, p, n), v in zip(entries, vectors, strict=True)
        )
        return ClusterState(
            clusters=clusters,
            buffer=buffer,
            merge_threshold=float(header["merge"]),
            create_threshold=float(header["create"]),
            next_number=int(header["next"]),
            since_maintenance=int(header["since"]),
            created_since_maintenance=int(header["created_since"]),
            last_mean_size=float(header["last_mean"]),
            growth_streak=int(header["streak"]),
            maintained_ts=-math.inf
            if header["maintained_ts"] is None
            else float(header["maintained_ts"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"corrupt clustering state: {exc}") from exc


# --- recurrence (``keys`` hash values, ``pending`` hash values) --------------------------


def key_state_to_json(s: KeyState) -> str:
    return json.dumps(
        {
            "score": s.score,
            "last_ts": s.last_ts,
            "turn_ids": s.turn_ids,
            "sessions": s.sessions,
            "new_since_fire": s.new_since_fire,
            "fired": s.fired,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


def key_state_from_json(s: str) -> KeyState:
    """Inverse of ``key_state_to_json``; ``ValueError`` on malformed input."""
    try:
        raw: Any = json.loads(s)
        return KeyState(
            score=float(raw["score"]),
            last_ts=float(raw["last_ts"]),
            turn_ids=[str(i) for i in _as_list(raw["turn_ids"])],
            sessions=[str(i) for i in _as_list(raw["sessions"])],
            new_since_fire=int(raw["new_since_fire"]),
            fired=int(raw["fired"]),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"corrupt key state: {exc}") from exc


def _as_list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


_SIGNAL_LEN = struct.Struct("<I")
_SIGNAL_VECTOR_DTYPE = np.dtype("<f2")  # pending vectors only feed a 0.7 bound: half precision


def signal_to_bytes(s: TurnSignal) -> bytes:
    """Compact form of a pending turn: a JSON header and its vector as float16."""
    header = json.dumps(
        {
            "id": s.event_id,
            "session": s.session_id,
            "ts": s.ts,
            "entities": list(s.entities),
            "cluster": s.cluster_id,
            "salient": s.salient,
            "pinned": s.pinned,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    vector = np.asarray(s.vector, dtype=_SIGNAL_VECTOR_DTYPE).tobytes()
    return _SIGNAL_LEN.pack(len(header)) + header + vector


def signal_from_bytes(b: bytes) -> TurnSignal:
    """Inverse of ``signal_to_bytes``; ``ValueError`` on malformed input."""
    try:
        (header_len,) = _SIGNAL_LEN.unpack_from(b, 0)
        start = _SIGNAL_LEN.size
        raw: Any = json.loads(b[start : start + header_len])
        vector = np.frombuffer(b[start + header_len :], dtype=_SIGNAL_VECTOR_DTYPE)
        return TurnSignal(
            event_id=str(raw["id"]),
            session_id=str(raw["session"]),
            ts=float(raw["ts"]),
            vector=vector.astype(np.float32),
            entities=tuple(str(e) for e in _as_list(raw["entities"])),
            cluster_id=str(raw["cluster"]),
            salient=bool(raw["salient"]),
            pinned=bool(raw["pinned"]),
        )
    except (KeyError, TypeError, struct.error, json.JSONDecodeError) as exc:
        raise ValueError(f"corrupt pending turn: {exc}") from exc


# Clusters and pending turns are re-read for every event of a user but rarely change: decode
# each distinct serialised value once (content-addressed, so never stale; values are frozen).
decode_cluster = lru_cache(maxsize=16_384)(cluster_from_bytes)
decode_signal = lru_cache(maxsize=16_384)(signal_from_bytes)
