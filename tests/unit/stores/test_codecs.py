"""The byte forms of the engine state in Redis (``stores.codecs``): every value round-trips
exactly, and anything that is not one of its blobs is a ``ValueError``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memstream.memory.clustering import ClusterParams, ClusterState, MemoryIn, step
from memstream.memory.recurrence import KeyState, TurnSignal
from memstream.memory.vectors import FloatArray, normalize
from memstream.stores.codecs import (
    cluster_from_bytes,
    cluster_to_bytes,
    engine_from_bytes,
    engine_to_bytes,
    key_state_from_json,
    key_state_to_json,
    signal_from_bytes,
    signal_to_bytes,
)

PARAMS = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
DIM = 8
T0 = 1_790_000_000.0


def unit(i: int, j: int | None = None, cosine: float = 1.0) -> FloatArray:
    """Axis ``i``, or the unit vector at ``cosine`` to axis ``i`` towards axis ``j``."""
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = cosine
    if j is not None:
        v[j] = math.sqrt(1 - cosine**2)
    return normalize(v)


def clustered() -> ClusterState:
    """Two clusters (one of two members) and one fuzzy memory in the buffer."""
    s = ClusterState.empty(PARAMS)
    for n, v in enumerate([unit(0), unit(0, 1, 0.9), unit(0, 2, 0.7), unit(3)]):
        s = step(s, MemoryIn(f"e{n}", v, 0.5, terms=("order", f"t{n}")), float(n), PARAMS).state
    return s


def test_clusters_and_the_engine_round_trip() -> None:
    s = clustered()
    assert len(s.clusters) == 2
    assert len(s.buffer) == 1
    back = tuple(cluster_from_bytes(cluster_to_bytes(c)) for c in s.clusters)
    assert back == s.clusters
    assert [c.member_ids for c in back] == [c.member_ids for c in s.clusters]
    assert engine_from_bytes(engine_to_bytes(s), back) == s
    empty = ClusterState.empty(PARAMS)
    assert engine_from_bytes(engine_to_bytes(empty), ()) == empty  # -inf maintained_ts too


@pytest.mark.parametrize("seed", range(5))
def test_every_state_of_a_long_run_round_trips(seed: int) -> None:
    """Through maintenance (splits, merges, thresholds that adapt, a buffer that flushes)."""
    params = ClusterParams(buffer_size=3, maintain_every=5, split_min_size=4, split_dispersion=0.05)
    rng = np.random.default_rng(seed)
    raw = rng.normal(size=(80, DIM)).astype(np.float32)
    raw[:40, 0] += 3.0  # one dense topic, the rest spread out
    vectors = {f"e{i}": normalize(v) for i, v in enumerate(raw)}
    s = ClusterState.empty(params)
    for i, (event_id, v) in enumerate(vectors.items()):
        memory = MemoryIn(event_id, v, 0.1 + (i % 4) / 4, (f"w{i % 3}",), pinned=i == 7)
        s = step(s, memory, T0 + 3_600.0 * i, params, vectors).state
        back = tuple(cluster_from_bytes(cluster_to_bytes(c)) for c in s.clusters)
        assert engine_from_bytes(engine_to_bytes(s), back) == s
    assert s.since_maintenance < 5  # maintenance ran


@pytest.mark.parametrize(
    "blob", [b"", b"nope", b"MSC2\x05\x00\x00\x00{bad}", b"MSC2\x02\x00\x00\x00{}"]
)
def test_corrupt_cluster_bytes_are_rejected(blob: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - several messages, one contract
        cluster_from_bytes(blob)


def test_a_truncated_centroid_and_a_foreign_engine_blob_are_rejected() -> None:
    s = clustered()
    with pytest.raises(ValueError, match="float32"):
        cluster_from_bytes(cluster_to_bytes(s.clusters[0])[:-2])
    with pytest.raises(ValueError, match="MSE1"):
        engine_from_bytes(cluster_to_bytes(s.clusters[0]), ())


def test_key_state_json_round_trip() -> None:
    state = KeyState(
        score=2.5,
        last_ts=T0 + 0.25,
        turn_ids=["e1", "订单-1"],
        sessions=["s1"],
        new_since_fire=1,
        fired=3,
    )
    assert key_state_from_json(key_state_to_json(state)) == state


@pytest.mark.parametrize("raw", ["", "{}", "[]", '{"score": 1}', "not json"])
def test_corrupt_key_state_is_rejected(raw: str) -> None:
    with pytest.raises(ValueError, match="corrupt key state"):
        key_state_from_json(raw)


def test_a_pending_turn_round_trips_with_its_vector_as_float16() -> None:
    vector = np.zeros(384, dtype=np.float32)
    vector[3], vector[7] = 0.6, 0.8
    signal = TurnSignal(
        event_id="ana-s1-t03",
        session_id="ana-s1",
        ts=T0 + 0.5,
        vector=vector,
        entities=("order:A-10293", "email:ana@example.com"),
        cluster_id="c4",
        salient=True,
        pinned=False,
    )
    blob = signal_to_bytes(signal)
    back = signal_from_bytes(blob)
    assert (back.event_id, back.session_id, back.ts) == ("ana-s1-t03", "ana-s1", T0 + 0.5)
    assert back.entities == signal.entities
    assert back.cluster_id == "c4"
    assert (back.salient, back.pinned) == (True, False)
    assert back.vector.dtype == np.float32
    assert np.array_equal(back.vector, vector.astype(np.float16).astype(np.float32))
    assert len(blob) < 384 * 2 + 300  # half precision: 2 bytes a dimension and a header
    with pytest.raises(ValueError, match="corrupt"):
        signal_from_bytes(b"\x05\x00\x00\x00{bad")
