"""The archive tier's retrieval cost: every turn of a 10k-turn user ranked, hot or archived.

What runs (in process, bounded: ~1-2 min): a real Valkey, a Qdrant Edge store, the real
encoder and the RPC's ``Retriever``. Three users of ``TURNS`` turns each, written as the
pipeline writes them (``RedisState.apply`` for the hot tier, ``upsert_turns`` for the
archive worker's write-through):

- ``hot``: every turn still in Redis (no TTL, no cap), the archive not read;
- ``archived``: the default hot tier (7 days of event time, 2000 turns): most turns
  have left Redis and come from the archive;
- ``capped``: the ``hot`` data ranked as before this change, the newest 500 turns only
  (``rpc.short_term_candidates=500``): what "no cap" costs.

Per user: the first query (the index built: archive scroll plus Redis reads), then
``QUERIES`` distinct queries (server ``took_ms``: encode + fetch + rank), the same queries
again (encoder cache hits: fetch + rank only), and queries right after a new turn (the
index re-synced). Vectors are random unit vectors (ranking cost does not depend on them);
turn texts are short chat lines.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from bench.core import Context, Result
from bench.retrieval_data import queries, summary, unit_rows
from memstream.metrics import Metrics
from memstream.rpc.retrieval import QueryEncoder, Retriever, exemplars_of
from memstream.schemas import RetrieveRequest, StoredTurn
from memstream.settings import DEMO_TENANT, Settings
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.longterm import ArchivedTurn
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.stores.turn_index import TurnIndex

NAME = "archive"
T0 = datetime(2023, 1, 2, 9, 0, tzinfo=UTC)
SPAN = timedelta(days=21)  # the turns span 3 weeks: most are older than the 7-day TTL
TOPICS = ("parcel", "refund", "password", "invoice", "address", "gift card", "subscription")


def _turn(user: str, i: int, n: int) -> StoredTurn:
    topic = TOPICS[i % len(TOPICS)]
    return StoredTurn(
        event_id=f"{user}-e{i:05d}",
        session_id=f"s{i // 40}",
        role="user" if i % 2 else "assistant",
        text=f"About the {topic} of order A-{10_000 + i % 997}: note {i}, please check it.",
        ts=T0 + SPAN * (i / n),
        speaker="Ana" if i % 2 else "Agent",
    )


async def _write(
    state: RedisState, store: QdrantEdgeStore, user: str, n: int, seed: int, *, archive: bool
) -> None:
    vectors = unit_rows(np.random.default_rng(seed), n)
    batch: list[ArchivedTurn] = []
    for i, vector in enumerate(vectors):
        turn = _turn(user, i, n)
        await state.apply(DEMO_TENANT, user, UserUpdate(turn.event_id, turn, vector))
        if archive:
            batch.append(ArchivedTurn(DEMO_TENANT, user, turn, vector))
            if len(batch) >= 512:
                await store.upsert_turns(batch)
                batch.clear()
    if batch:
        await store.upsert_turns(batch)


async def _measure(
    retriever: Retriever,
    state: RedisState,
    store: QdrantEdgeStore,
    user: str,
    texts: list[str],
    after_write: int,
    archive: bool,
) -> dict[str, Any]:
    def request(text: str) -> RetrieveRequest:
        return RetrieveRequest(user_id=user, query=text, top_k=10, budget_tokens=1024)

    started = time.perf_counter()
    first = await retriever.retrieve(DEMO_TENANT, request(texts[0]))
    cold_ms = (time.perf_counter() - started) * 1000
    index = await retriever.turn_index.get(DEMO_TENANT, user)
    hot = await state.count_hot_turns(DEMO_TENANT, user)
    archived = await store.count_turns(DEMO_TENANT, user)
    distinct = [(await retriever.retrieve(DEMO_TENANT, request(t))).took_ms for t in texts]
    cached = [(await retriever.retrieve(DEMO_TENANT, request(t))).took_ms for t in texts]
    # One new turn, then a query: the index re-syncs (the cost each write adds to a query).
    synced: list[float] = []
    n = len(index.ids)
    for j in range(after_write):
        turn = _turn(user, n + j, n)
        vector = unit_rows(np.random.default_rng(n + j), 1)[0]
        await state.apply(DEMO_TENANT, user, UserUpdate(turn.event_id, turn, vector))
        if archive:
            await store.upsert_turns([ArchivedTurn(DEMO_TENANT, user, turn, vector)])
        synced.append((await retriever.retrieve(DEMO_TENANT, request(texts[j]))).took_ms)
    return {
        "turns_ranked": len(index.ids),
        "hot_turns": hot,
        "archived_turns": archived,
        "index_mb_estimate": index.nbytes / 2**20,
        "cold_first_query_ms": cold_ms,
        "first_items": len(first.items),
        "took_ms": summary(distinct),
        "took_ms_cached": summary(cached),
        "took_ms_after_a_write": summary(synced),
    }


async def _traced_index_mb(state: RedisState, store: QdrantEdgeStore, user: str, dim: int) -> float:
    """What one user's index really holds (tracemalloc), to check the estimate."""
    index = TurnIndex(state, dim=dim, archive=store)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = await index.get(DEMO_TENANT, user)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held.ids
    return (after - before) / 2**20


async def run(ctx: Context) -> Result:
    turns = 1_000 if ctx.quick else 10_000
    n_queries = 40 if ctx.quick else 200
    after_write = 5 if ctx.quick else 20
    work = Path(tempfile.mkdtemp(prefix="archive-", dir=ctx.out_dir))
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    text_source = queries(ctx.seed)
    texts = [next(text_source) for _ in range(n_queries)]
    redis = EmbeddedRedis(work / "redis", persist=False).start()
    store = QdrantEdgeStore(work / "qdrant" / "memories")
    await store.ensure_collection(encoder.dim)
    raw: dict[str, Any] = {"turns_per_user": turns, "queries": n_queries}
    try:
        everything = RedisState.from_url(redis.url, prefix="bh", ttl_days=0, max_turns=0)
        default = RedisState.from_url(redis.url, prefix="bh")  # 7 days, 2000 turns
        t0 = time.perf_counter()
        await _write(everything, store, "hot", turns, ctx.seed, archive=False)
        await _write(default, store, "archived", turns, ctx.seed, archive=True)
        raw["write_s"] = time.perf_counter() - t0
        users = {"hot": ("hot", everything, 0), "archived": ("archived", default, 0)}
        users["capped"] = ("hot", everything, 500)
        runs: dict[str, Any] = {}
        for label, (user, state, cap) in users.items():
            retriever = Retriever(
                queries=QueryEncoder(encoder),
                state=state,
                longterm=store,
                metrics=Metrics(CollectorRegistry()),
                short_term_candidates=cap,
                exemplars=exemplars_of(encoder),
            )
            await retriever.queries.encode("bench", texts[0])  # load the model outside the timings
            retriever.queries._cache.clear()
            runs[label] = await _measure(
                retriever, state, store, user, texts, after_write, archive=user == "archived"
            )
        runs["archived"]["index_mb_traced"] = await _traced_index_mb(
            default, store, "archived", encoder.dim
        )
        raw["runs"] = runs
        await everything.close()
        await default.close()
    finally:
        await store.close()
        redis.stop()
    return Result(NAME, [], _markdown(raw), raw)


def _ms(stats: dict[str, float], key: str) -> str:
    return f"{stats[key]:.1f}"


def _markdown(raw: dict[str, Any]) -> str:
    lines = [
        "## Archive tier: retrieval over every turn",
        "",
        f"{raw['turns_per_user']:,} turns per user, {raw['queries']} distinct queries each, "
        "in process (real Valkey, Qdrant Edge, encoder; 2 shared cores). `took_ms` is the "
        "server's own figure (encode + fetch + rank); cached = the same queries again "
        "(encoder cache hits: fetch + rank); after a write = a query right after a new turn "
        "(the index re-synced).",
        "",
        "| user | turns ranked | hot / archived | first query ms | took p50 / p99 ms "
        "| cached p50 / p99 ms | after a write p50 / p99 ms | index MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, r in raw["runs"].items():
        ranked = min(r["turns_ranked"], 500) if label == "capped" else r["turns_ranked"]
        lines.append(
            f"| {label} | {ranked:,} | {r['hot_turns']:,} / {r['archived_turns']:,} | "
            f"{r['cold_first_query_ms']:.0f} | {_ms(r['took_ms'], 'p50')} / "
            f"{_ms(r['took_ms'], 'p99')} | {_ms(r['took_ms_cached'], 'p50')} / "
            f"{_ms(r['took_ms_cached'], 'p99')} | {_ms(r['took_ms_after_a_write'], 'p50')} / "
            f"{_ms(r['took_ms_after_a_write'], 'p99')} | {r['index_mb_estimate']:.1f} |"
        )
    traced = raw["runs"]["archived"].get("index_mb_traced")
    lines += [
        "",
        f"Index memory: estimate shown; tracemalloc measured {traced:.1f} MB for the "
        f"archived user. Writing the data took {raw['write_s']:.0f} s.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m bench.archive [--quick]: prints the section and JSON
    quick = "--quick" in sys.argv
    out = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    result = asyncio.run(run(Context(quick=quick, out_dir=out, shared_bench=out)))
    print(result.markdown)
    print(json.dumps(result.raw, indent=1, default=str))
