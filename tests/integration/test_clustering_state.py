"""A labelled synthetic stream through the real processors (broker, faust, encoder, Redis):
each user's clustering state in Redis equals the pure engine's state on the same input.

Small engine settings (buffer of 4, maintenance every 10 memories, splits from 8 members)
make every rule run within a short stream: routing bands, buffer flushes, maintenance,
splits (whose member vectors the processor reads back from Redis as float16), merges,
descriptions and their embeddings.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bench import synthetic
from memstream.memory.cluster_describe import terms_of
from memstream.memory.cluster_state import Cluster
from memstream.memory.clustering import (
    ClusterState,
    MemoryIn,
    step,
    vectors_needed,
    with_descriptions,
)
from memstream.memory.hot_tier import evictions
from memstream.memory.text import is_remember_request
from memstream.memory.vectors import normalize
from memstream.ops.replay import replay_file
from memstream.schemas import EncodedEvent, StoredTurn
from memstream.settings import Settings
from memstream.stores.codecs import cluster_to_bytes, engine_from_bytes, engine_to_bytes
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.streaming.params import cluster_params
from memstream.streams.memorize import description_encoder
from reliability.cluster import read_topic
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BASE = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
ENGINE = {"buffer_size": 4, "maintain_every": 10, "split_min_size": 8, "split_dispersion": 0.05}


@pytest.fixture
def running(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> Iterator[MemstreamProcess]:
    process = MemstreamProcess(
        with_free_port(settings_factory(cluster=ENGINE)), tmp_path / "memstream.log"
    ).start()
    yield process
    process.stop()


def events(turns: list[synthetic.LabelledTurn]) -> list[dict[str, object]]:
    return [
        {
            "event_id": t.event_id,
            "tenant_id": "demo",
            "user_id": t.user_id,
            "session_id": f"s{t.session}",
            "role": "user",
            "text": t.text,
            "ts": (BASE + timedelta(seconds=t.ts)).isoformat(),
        }
        for t in turns
    ]


async def encoded_vectors(settings: Settings, want: set[str]) -> dict[str, np.ndarray]:
    """The embeddings the processor memorized, read back from ``memstream.encoded``.

    The pure engine must start from the very same float32 vectors: onnxruntime's kernels
    for another batch shape (the encode stage batches by arrival) may round a vector's last
    bits differently, and a centroid is a running sum of them.
    """
    found: dict[str, np.ndarray] = {}
    for _key, value in await read_topic(settings.kafka.broker, settings.kafka.topic("encoded")):
        encoded = EncodedEvent.model_validate_json(value)
        found[encoded.event.event_id] = np.asarray(encoded.embedding, np.float32)
    assert want <= found.keys(), "every memorized event is on memstream.encoded"
    return found


def pure_state(
    turns: list[synthetic.LabelledTurn],
    settings: Settings,
    encoder: OnnxEncoder,
    embeddings: dict[str, np.ndarray],
) -> tuple[ClusterState, Counter[str]]:
    """What ``Memorizer`` computes, without a broker or Redis (member vectors as float16)."""
    params = cluster_params(settings.cluster)
    vectors = [normalize(embeddings[t.event_id]) for t in turns]
    stored = {
        t.event_id: v.astype(np.float16).astype(np.float32)
        for t, v in zip(turns, vectors, strict=True)
    }
    state = ClusterState.empty(params)
    ran: Counter[str] = Counter()
    # Redis holds only the hot tier (event-time TTL, cap): a split sees those vectors only.
    hot: list[tuple[str, float]] = []
    pinned: set[str] = set()
    newest: float | None = None
    ttl_s = int(settings.redis.short_term_ttl_days * 86_400)
    for t, v in zip(turns, vectors, strict=True):
        now = (BASE + timedelta(seconds=t.ts)).timestamp()
        memory = MemoryIn(t.event_id, v, 0.5, terms_of(t.text), is_remember_request(t.text))
        needed = vectors_needed(state, memory, params)
        held = {i for i, _ in hot}
        result = step(state, memory, now, params, {i: stored[i] for i in needed if i in held})
        out = evictions(
            hot, len(hot), pinned, (t.event_id, now, memory.pinned), newest, ttl_s,
            settings.redis.short_term_max_turns,
        )  # fmt: skip
        hot = [e for e in hot if e[0] not in out.evicted]
        if out.keep_new:
            hot = sorted([*hot, (t.event_id, now)], key=lambda e: (e[1], e[0]))
            pinned |= {t.event_id} if memory.pinned else set()
        newest = out.newest
        state = result.state
        ran["flush"] += bool(result.flushed)
        if result.maintenance is not None:
            ran["split"] += result.maintenance.splits
            ran["merge"] += result.maintenance.merges
        described = result.maintenance.described if result.maintenance else ()
        if described and description_encoder(settings, encoder) is not None:
            texts = [c.description for c in (state.cluster(i) for i in described) if c]
            embedded = encoder.encode(texts)
            state = with_descriptions(
                state,
                {
                    i: (text, embedded[k] if text else None)
                    for k, (i, text) in enumerate(zip(described, texts, strict=True))
                },
            )
    return state, ran


async def redis_state(settings: Settings, user: str) -> ClusterState:
    state = RedisState.from_url(settings.redis.url, prefix=settings.redis.prefix)
    try:
        clusters = tuple(await state.clusters("demo", user))
        engine = await state.redis.hget(state._key("demo", user, "meta"), "engine")
    finally:
        await state.close()
    assert engine is not None
    return engine_from_bytes(engine, clusters)


def _header(blob: bytes) -> dict[str, object]:
    length = int.from_bytes(blob[4:8], "little")
    header: dict[str, object] = json.loads(blob[8 : 8 + length])
    return header


def _close(a: object, b: object) -> bool:
    """Equal, floats to 1e-6. Both sides start from the same vectors (``encoded_vectors``);
    the slack covers the description embeddings, which each side encodes itself."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6 * max(1.0, abs(a))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def same_cluster(a: Cluster, b: Cluster) -> None:
    ha, hb = _header(cluster_to_bytes(a)), _header(cluster_to_bytes(b))
    assert ha.keys() == hb.keys()
    assert {k: ha[k] for k in ha if not _close(ha[k], hb[k])} == {}, a.cluster_id
    np.testing.assert_allclose(a.centroid, b.centroid, atol=1e-6)
    assert (a.description_vector is None) == (b.description_vector is None)
    if a.description_vector is not None and b.description_vector is not None:
        np.testing.assert_allclose(a.description_vector, b.description_vector, atol=1e-5)


def same_engine(a: ClusterState, b: ClusterState) -> None:
    ha, hb = _header(engine_to_bytes(a)), _header(engine_to_bytes(b))
    assert {k: (ha[k], hb[k]) for k in ha if not _close(ha[k], hb[k])} == {}
    for x, y in zip(a.buffer, b.buffer, strict=True):
        np.testing.assert_allclose(x.vector, y.vector, atol=1e-6)


def test_redis_state_equals_the_pure_engine(running: MemstreamProcess, tmp_path: Path) -> None:
    settings = running.settings
    turns = synthetic.generate(2, 45, seed=11)
    path = tmp_path / "stream.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events(turns)) + "\n")
    sent = asyncio.run(
        replay_file(path, settings.kafka.broker, settings.kafka.topic("events"), progress=False)
    )
    assert sent == len(turns)
    users = sorted({t.user_id for t in turns})

    async def counted() -> list[int]:
        state = RedisState.from_url(settings.redis.url, prefix=settings.redis.prefix)
        try:
            return [await state.count_turns("demo", u) for u in users]
        finally:
            await state.close()

    expected = [sum(t.user_id == u for t in turns) for u in users]
    wait_for(lambda: asyncio.run(counted()) == expected, 180, "every event memorized")

    encoder = OnnxEncoder.from_settings(settings.encoder)
    embeddings = asyncio.run(
        asyncio.wait_for(encoded_vectors(settings, {t.event_id for t in turns}), 60)
    )
    ran: Counter[str] = Counter()
    for user in users:
        mine = [t for t in turns if t.user_id == user]
        want, rules = pure_state(mine, settings, encoder, embeddings)
        ran.update(rules)
        got = asyncio.run(redis_state(settings, user))
        same_engine(got, want)
        assert [c.cluster_id for c in got.clusters] == [c.cluster_id for c in want.clusters]
        for a, b in zip(got.clusters, want.clusters, strict=True):
            same_cluster(a, b)
        # every memory is in exactly one cluster or the buffer
        placed = [m for c in got.clusters for m in c.member_ids] + [b.event_id for b in got.buffer]
        assert sorted(placed) == sorted(t.event_id for t in mine)
        assert any(c.description for c in got.clusters)
        # Embedded only where a retrieval reads them (streams.memorize.description_encoder).
        vectors = [c.description_vector is not None for c in got.clusters if c.description]
        assert any(vectors) if description_encoder(settings, encoder) else not any(vectors)
    assert ran["flush"] > 0
    assert ran["split"] > 0  # so member vectors were read back from Redis


# --- the in-process cache of RedisState --------------------------------------------------


def _turn(event_id: str) -> StoredTurn:
    return StoredTurn(event_id=event_id, session_id="s1", role="user", text="hi", ts=BASE)


async def test_cluster_cache_is_validated_by_the_version(redis_server: EmbeddedRedis) -> None:
    prefix = f"cc{uuid.uuid4().hex[:6]}"
    params = cluster_params(Settings().cluster)
    writer = RedisState.from_url(redis_server.url, prefix=prefix)
    other = RedisState.from_url(redis_server.url, prefix=prefix)  # another process, say
    rng = np.random.default_rng(5)
    state = ClusterState.empty(params)

    async def write(r: RedisState, event_id: str) -> ClusterState:
        snapshot = await r.load_user("t", "u", event_id)
        vector = normalize(rng.standard_normal(16).astype(np.float32))
        current = snapshot.clusters or ClusterState.empty(params)
        result = step(current, MemoryIn(event_id, vector), 1.0, params)
        update = UserUpdate(
            event_id,
            _turn(event_id),
            vector,
            clusters=result.state,
            clusters_changed=result.changed,
            clusters_removed=result.removed,
            cluster_version=snapshot.cluster_version,
        )
        await r.apply("t", "u", update)
        return result.state

    try:
        state = await write(writer, "e1")
        state = await write(writer, "e2")
        assert (writer.cluster_cache_hits, writer.cluster_cache_misses) == (1, 0)
        state = await write(other, "e3")  # changes the version behind writer's back
        snapshot = await writer.load_user("t", "u", "e4")
        assert writer.cluster_cache_misses == 1  # re-read from Redis, not the stale cache
        assert snapshot.clusters == state
        assert [c.member_ids for c in await writer.clusters("t", "u")] == [
            c.member_ids for c in state.clusters
        ]
        found = await writer.member_vectors("t", "u", ["e1", "e3", "missing"])
        assert sorted(found) == ["e1", "e3"]
        assert found["e1"].dtype == np.float32
        await other.delete_user("t", "u")
        assert (await writer.load_user("t", "u", "e5")).clusters is None
    finally:
        await writer.close()
        await other.close()
