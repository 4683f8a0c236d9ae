"""The retrieval fast paths give the answers of the plain ones.

- The RPC's per-user turn index, synced incrementally, gives the same items and context as
  one built from scratch (from the archive and the hot tier); it reads nothing while the
  user's turns do not change, and keeps the turns that leave the hot tier.
- The token counter memoised by line counts what the encoder's tokenizer counts.
- The micro-batching query encoder returns what one-at-a-time encoding returns, encodes
  concurrent texts in shared calls, and hands every caller its error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.rpc.retrieval import QueryEncoder, Retriever
from memstream.schemas import ConsolidatedMemory, RetrieveRequest, StoredTurn
from memstream.settings import EncoderSettings, Settings
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.longterm import ArchivedTurn, memory_point_id
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.stores.text_encoder import TokenCounter

pytestmark = pytest.mark.integration

DIM = 384  # the real encoder's
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


class RecordingEncoder(OnnxEncoder):
    """The real encoder, recording the texts of each encode call (and failing on demand)."""

    calls: list[list[str]]
    fail: bool

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> np.ndarray:
        self.calls.append(list(texts))
        if self.fail:
            raise RuntimeError("encoder down")
        return super().encode(texts, query=query, cache=cache)


def recording_encoder(fail: bool = False) -> RecordingEncoder:
    encoder = RecordingEncoder.from_settings(EncoderSettings())
    encoder.calls, encoder.fail = [], fail
    return encoder


@pytest.fixture
async def stores(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> AsyncIterator[tuple[RedisState, QdrantEdgeStore]]:
    state = RedisState.from_url(redis_server.url, prefix=f"fp{tmp_path.name[-8:]}")
    longterm = QdrantEdgeStore(tmp_path / "shard")
    await longterm.ensure_collection(DIM)
    yield state, longterm
    await longterm.close()
    await state.close()


async def _write(
    state: RedisState, longterm: QdrantEdgeStore, user: str, turn: StoredTurn, vector: np.ndarray
) -> None:
    """As the pipeline writes a turn: memorize to the hot tier, the archive worker beside it."""
    await state.apply("acme", user, UserUpdate(turn.event_id, turn, vector))
    await longterm.upsert_turns([ArchivedTurn("acme", user, turn, vector)])


async def _seed(
    state: RedisState, longterm: QdrantEdgeStore, user: str, rng: np.random.Generator
) -> None:
    base = rng.standard_normal((6, DIM)).astype(np.float32)
    for i in range(120):
        # Few distinct directions and repeated timestamps: ties on score and on time.
        v = base[i % 6] + (0.0 if i % 4 else 0.3) * rng.standard_normal(DIM)
        turn = StoredTurn(
            event_id=f"ev{i:03d}",
            session_id=f"s{i // 30}",
            role="user",
            text=f"turn {i} about order A-{i % 7}",
            ts=T0 + timedelta(minutes=i // 12),
        )
        vector = (v / np.linalg.norm(v)).astype(np.float32)
        await _write(state, longterm, user, turn, vector)
    memories = []
    for j in range(6):
        memory = ConsolidatedMemory(
            memory_id=memory_point_id("acme", user, f"topic:{j}"),
            tenant_id="acme",
            user_id=user,
            key=f"topic:{j}",
            title=f"Topic {j}",
            keys=[f"topic:{j}", f"order:A-1029{j}"],
            strength=0.5 + j / 10,
            created_at=T0,
            updated_at=T0 + timedelta(hours=j),
            # Memories cover many of the best turns: the lazy read must look past them.
            source_event_ids=[f"ev{i:03d}" for i in range(120) if i % 6 == j][1::2],
        )
        memories.append((memory, base[j] / np.linalg.norm(base[j])))
    await longterm.upsert(memories)


def _retriever(state: RedisState, longterm: QdrantEdgeStore, candidates: int = 500) -> Retriever:
    return Retriever(
        queries=QueryEncoder(recording_encoder()),
        state=state,
        longterm=longterm,
        metrics=Metrics(CollectorRegistry()),
        short_term_candidates=candidates,
    )


QUERIES = ["where is my parcel", "status of order A-10293", "turn 7", "hello", "x y z"]


async def _answers(retriever: Retriever, user: str, top_k: int) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for query in QUERIES:
        request = RetrieveRequest(user_id=user, query=query, top_k=top_k, budget_tokens=4096)
        got = await retriever.retrieve("acme", request)
        out.append((tuple((i.id, i.kind, i.score) for i in got.items), got.context))
    return out


@pytest.mark.parametrize("top_k", [1, 5, 12, 40])
async def test_incremental_turn_index_ranks_like_a_cold_one(
    stores: tuple[RedisState, QdrantEdgeStore], top_k: int
) -> None:
    state, longterm = stores
    rng = np.random.default_rng(top_k)
    await _seed(state, longterm, "u1", rng)
    warm = _retriever(state, longterm, candidates=100)
    await _answers(warm, "u1", top_k)
    syncs = warm.turn_index.syncs
    await _answers(warm, "u1", top_k)
    assert warm.turn_index.syncs == syncs  # nothing written: no turn read again
    # New turns arrive and the hot tier drops the oldest (the cap): the warm index syncs only
    # the new ones and keeps the dropped ones, which a cold index reads from the archive.
    state.max_turns = 110
    for i in range(120, 130):
        turn = StoredTurn(
            event_id=f"ev{i:03d}",
            session_id="s9",
            role="user",
            text=f"late turn {i} about my parcel and order A-{i % 7}",
            ts=T0 + timedelta(hours=5, minutes=i),
        )
        v = rng.standard_normal(DIM).astype(np.float32)
        await _write(state, longterm, "u1", turn, v / np.linalg.norm(v))
    assert await state.count_hot_turns("acme", "u1") == 110
    got = await _answers(warm, "u1", top_k)
    assert warm.turn_index.syncs == syncs + 1
    assert len((await warm.turn_index.get("acme", "u1")).ids) == 130
    cold_retriever = _retriever(state, longterm, candidates=100)
    cold = await _answers(cold_retriever, "u1", top_k)
    assert cold_retriever.turn_index.archive_reads == 1
    assert got == cold
    kinds = {kind for items, _ in got for _, kind, _ in items}
    assert kinds == {"memory", "turn"} or top_k == 1


async def test_user_without_turns_or_memories_gets_an_empty_answer(
    stores: tuple[RedisState, QdrantEdgeStore],
) -> None:
    state, longterm = stores
    retriever = _retriever(state, longterm)
    got = await retriever.retrieve("acme", RetrieveRequest(user_id="nobody", query="hello"))
    assert (got.items, got.context, got.context_tokens) == ([], "", 0)


async def test_turns_that_leave_the_hot_tier_in_event_time_stay_retrievable(
    stores: tuple[RedisState, QdrantEdgeStore],
) -> None:
    state, longterm = stores
    retriever = _retriever(state, longterm, candidates=0)
    encode = retriever.queries.encoder.encode
    request = RetrieveRequest(user_id="u2", query="where is my parcel, order A-90", top_k=8)
    # A one-day hot tier: each turn a day after the last pushes the previous one out of Redis
    # (event time; the wall clock plays no part), and the archive keeps every one.
    short = RedisState(state.redis, prefix=state.prefix, ttl_days=1.0)
    turns = [
        StoredTurn(
            event_id=f"brief{i}",
            session_id="s9",
            role="user",
            text=f"where is my parcel, order A-9{i}",
            ts=T0 + timedelta(days=1.5 * i),
        )
        for i in range(4)
    ]
    await _write(short, longterm, "u2", turns[0], encode([turns[0].text])[0])
    during = await retriever.retrieve("acme", request)
    assert [i.id for i in during.items if i.kind == "turn"] == ["brief0"]
    for turn in turns[1:]:
        await _write(short, longterm, "u2", turn, encode([turn.text])[0])
    assert await state.timeline_ids("acme", "u2") == ["brief3"]
    after = await retriever.retrieve("acme", request)
    assert {i.id for i in after.items} >= {f"brief{i}" for i in range(4)}
    assert "A-90" in after.context
    cold = await _retriever(state, longterm, candidates=0).retrieve("acme", request)
    assert [(i.id, i.score) for i in after.items] == [(i.id, i.score) for i in cold.items]
    assert after.context == cold.context


async def test_a_turn_that_left_the_hot_tier_unseen_is_read_from_redis_until_archived(
    stores: tuple[RedisState, QdrantEdgeStore],
) -> None:
    state, longterm = stores
    retriever = _retriever(state, longterm, candidates=0)
    encode = retriever.queries.encoder.encode
    request = RetrieveRequest(user_id="u3", query="the blue umbrella", top_k=4)
    first = StoredTurn(event_id="u0", session_id="s", role="user", text="hi", ts=T0)
    await _write(state, longterm, "u3", first, encode([first.text])[0])
    await retriever.retrieve("acme", request)
    # Written and pushed out of Redis before this process looked, and not archived yet (the
    # archive worker lags): Redis keeps it readable meanwhile.
    short = RedisState(state.redis, prefix=state.prefix, ttl_days=1.0)
    lost = StoredTurn(
        event_id="lost", session_id="s", role="user", text="I left the blue umbrella", ts=T0
    )
    later = StoredTurn(
        event_id="later", session_id="s", role="user", text="ok", ts=T0 + timedelta(days=3)
    )
    await short.apply("acme", "u3", UserUpdate("lost", lost, encode([lost.text])[0]))
    await _write(short, longterm, "u3", later, encode([later.text])[0])
    assert await state.timeline_ids("acme", "u3") == ["later"]
    found = await retriever.retrieve("acme", request)
    assert "lost" in {i.id for i in found.items}
    assert "blue umbrella" in found.context
    # Archived and released: a process that never saw it reads it from the archive.
    await longterm.upsert_turns([ArchivedTurn("acme", "u3", lost, encode([lost.text])[0])])
    assert await state.release_archived("acme", "u3", ["lost"]) == 1
    fresh = await _retriever(state, longterm, candidates=0).retrieve("acme", request)
    assert [(i.id, i.score) for i in fresh.items] == [(i.id, i.score) for i in found.items]
    syncs = retriever.turn_index.syncs
    await retriever.retrieve("acme", request)
    assert retriever.turn_index.syncs == syncs  # complete: nothing read


async def test_query_encoder_batches_concurrent_texts() -> None:
    encoder = recording_encoder()
    queries = QueryEncoder(encoder, max_batch=8, max_wait_s=0.01)
    texts = [f"question {i}" for i in range(20)] + ["question 3"]  # one asked twice at once
    vectors = await asyncio.gather(*(queries.encode("acme", t) for t in texts))
    alone = encoder.encode(texts)
    encoder.calls.pop()
    assert np.allclose(np.stack(vectors), alone)
    assert sorted(t for call in encoder.calls for t in call) == sorted(set(texts))
    assert len(encoder.calls) == 3  # 20 distinct texts in batches of at most 8
    assert all(len(call) <= 8 for call in encoder.calls)
    calls = len(encoder.calls)
    again = await queries.encode("acme", "question 5")  # cached
    assert len(encoder.calls) == calls
    assert np.array_equal(again, vectors[5])


async def test_query_encoder_errors_reach_every_caller_and_it_recovers() -> None:
    encoder = recording_encoder(fail=True)
    queries = QueryEncoder(encoder, max_wait_s=0.001)
    results = await asyncio.gather(
        *(queries.encode("acme", f"q{i}") for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
    encoder.fail = False
    assert (await queries.encode("acme", "q1")).shape == (DIM,)


def test_token_counter_counts_like_the_encoder() -> None:
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    counter = TokenCounter(encoder)
    assert counter.by_line  # the default model's BERT tokenizer: counted line by line
    lines = [
        "## Memories",
        "Delayed parcel (updated 2026-03-02 09:00)",
        "- Open: call back the customer (due 2026-03-04 09:00)",
        "[2026-03-02 09:01] customer (session s1): Où est ma commande A-10293 ? 我的订单在哪里",
        "e-mail: ana@example.com, tel +34 600 123 456, naïve café, ﬁ ligature, emoji 📦",
        "x" * 300,
        "",
        # Counted chunk by chunk at spaces: runs of spaces, other whitespace, JSON.
        '  {"title":"Order A-10293","facts":["the  parcel\tleft"]}  ',
        "a\u00a0b c\u3000d \u200bzero-width, don't   re-count",
    ]
    rng = np.random.default_rng(5)
    for _ in range(50):
        picked = rng.choice(len(lines), size=int(rng.integers(1, 12)))
        text = "\n".join(lines[i] for i in picked)
        assert counter(text) == encoder.count_tokens(text), text
