"""Resources: what memstream costs — LLM calls and tokens per event, memory and disk.

This benchmark owns the cost and memory figures of BENCHMARKS.md. Before the process
starts, long-term memories are bulk-loaded into its Qdrant Edge shard through
``LongTermStore.upsert`` and most short-term turns into Valkey through
``RedisState.apply`` (memorize's own write path); then a real ``memstream up`` opens that
data, the sample stream and a generated stream are replayed through the whole pipeline
(the rest of the short-term turns, and the consolidations whose calls and tokens are
counted), and retrievals read the biggest users. The RSS of every process is sampled
throughout, memstream's apart from the broker's and Valkey's. The reference for cost is
an eager system that consolidates every event (one call per event, by definition).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from redis.asyncio import Redis

from bench.core import Context, Result, Row
from bench.cost import consolidated_messages, token_costs
from bench.generate import generate_events, write_jsonl
from bench.maintenance import maintenance_markdown, time_maintenance
from bench.plotting import bar_chart, series_chart
from bench.resources_params import Params
from bench.resources_report import markdown
from bench.services import MIB, Memstream, RssSampler, Samples, rss_breakdown, services
from memstream.ops.demo import SAMPLE_STREAM
from memstream.ops.replay import replay_file
from memstream.schemas import ConsolidatedMemory, Fact, OpenAction, StoredTurn
from memstream.settings import QdrantSettings
from memstream.stores.longterm import memory_point_id
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.wiring import open_longterm

NAME = "resources"
log = logging.getLogger(__name__)
TENANT = "demo"
DIM = 384  # all-MiniLM-L6-v2; checked against the store's collection when it opens
RSS_TARGET_MIB = 600.0
PAGE = os.sysconf("SC_PAGE_SIZE")
# One memory in DUE_EVERY has an open action due an hour ago, one more a day from now: the
# reminders pass has a few due among many (the rest have no dated action).
DUE_EVERY = 1_000
MEM0_NOTE = (
    "mem0 (`mem0ai==2.2.1`, a pure-Python wheel; `pip download --no-deps` works) is not "
    "measured here: it is installed only in the retrieval-latency benchmark's own "
    "virtualenv (`make mem0-venv`, which `make bench` runs), never in the project's. "
    "The reference column holds the target."
)


QUICK = Params(100, 5_000, 50, 1_000, 4, 150, 20)
FULL = Params(276, 100_000, 200, 20_000, 40, 1_500, 200)


class SplitRssSampler(RssSampler):
    """RSS, plus memstream's split into anonymous memory (heap, onnxruntime, Python) and
    file-backed pages (the Edge shard's mmapped segments, libraries): ``statm``, cheap
    enough for every sample, so the peak's make-up is known, not guessed."""

    def __init__(self, procs: dict[str, Any], split: str) -> None:
        super().__init__(procs)
        self.statm = Path(f"/proc/{procs[split].pid}/statm")
        self.split_series: dict[str, list[tuple[float, float]]] = {"anon": [], "file": []}
        self.at_peak: dict[str, float] = {}

    def sample(self) -> None:
        super().sample()
        try:  # pages: size resident shared text lib data dt
            _, resident, shared, *_ = (int(x) for x in self.statm.read_text().split())
        except OSError:  # the process ended: keep what was seen
            return
        now = time.monotonic() - self.t0
        rss, file = resident * PAGE / MIB, shared * PAGE / MIB
        anon = rss - file
        self.split_series["anon"].append((now, anon))
        self.split_series["file"].append((now, file))
        if rss >= self.at_peak.get("rss", 0.0):
            self.at_peak = {"rss": rss, "anon": anon, "file": file}


def memory_user(k: int) -> str:
    return f"rss-u{k:04d}"


def _memory(i: int, users: int, rng: np.random.Generator, now: datetime) -> ConsolidatedMemory:
    """A memory shaped like what consolidation writes: title, facts, keys, summary."""
    user = memory_user(i % users)
    order = f"R-{10000 + i}"
    key = f"entity:order:{order}"
    text = f"Order {order} for the {['kettle', 'lamp', 'sheets', 'blender'][i % 4]}"
    actions = []
    if i % DUE_EVERY in (0, DUE_EVERY // 2):
        due = now + (timedelta(hours=-1) if i % DUE_EVERY == 0 else timedelta(days=1))
        actions.append(OpenAction(text=f"Email the tracking link for {order}", due=due))
    return ConsolidatedMemory(
        memory_id=memory_point_id(TENANT, user, key),
        tenant_id=TENANT,
        user_id=user,
        key=key,
        title=f"{text}: delayed, then shipped",
        facts=[
            Fact(text=f"{text} was delayed at the warehouse.", source_event_ids=[f"{user}-e{i}"]),
            Fact(text=f"{text} shipped on day {i % 28 + 1}.", attribute="status"),
            Fact(text="The customer prefers email over phone calls.", attribute="preference"),
        ],
        status="shipped",
        keys=[f"order:{order}", f"email:{user}@example.com"],
        summary=f"{text} was delayed, escalated and then shipped; updates go by email.",
        open_actions=actions,
        strength=float(rng.uniform(0.1, 2.0)),
        created_at=now,
        updated_at=now,
        source_event_ids=[f"{user}-e{i}-{k}" for k in range(5)],
    )


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    unit: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return unit


async def load_memories(data_dir: Path, p: Params, seed: int) -> dict[str, Any]:
    """Bulk-load the long-term store the process will open; random unit vectors.

    The vectors' values do not change memory or disk use, and encoding 100k texts would
    take longer than the whole suite may.
    """
    rng = np.random.default_rng(seed)
    now = datetime.now(UTC)
    store = open_longterm(QdrantSettings(), data_dir)
    await store.ensure_collection(DIM)
    started = time.perf_counter()
    for start in range(0, p.memories, 2_000):
        n = min(2_000, p.memories - start)
        memories = [_memory(start + k, p.memory_users, rng, now) for k in range(n)]
        await store.upsert(list(zip(memories, _unit(rng, n), strict=True)))
    await store.close()  # flush + optimize; the process opens the shard next
    took = time.perf_counter() - started
    shard = data_dir / "qdrant" / QdrantSettings().collection
    disk = sum(f.stat().st_size for f in shard.rglob("*") if f.is_file())
    return {
        "count": p.memories,
        "seconds": took,
        "per_s": p.memories / took,
        "disk_bytes": disk,
        "bytes_per_memory": disk / p.memories,
    }


async def load_turns(redis_url: str, prefix: str, n: int, users: int, seed: int) -> list[str]:
    """``n`` short-term turns through memorize's own write path; realistic generated texts."""
    state = RedisState.from_url(redis_url, prefix=prefix)
    rng = np.random.default_rng(seed)
    events = generate_events(n, seed=seed + 1, tenant=TENANT)
    vectors = _unit(rng, n)
    user_ids = [f"rss-u{k:04d}" for k in range(users)]
    for start in range(0, n, 32):  # 32 transactions in flight: within the client's pool
        updates = []
        for k in range(start, min(n, start + 32)):
            e = events[k]
            turn = StoredTurn(
                event_id=f"bulk-{k}",
                session_id=e["session_id"],
                role=e["role"],
                text=e["text"],
                ts=datetime.fromisoformat(e["ts"]),
            )
            update = UserUpdate(turn.event_id, turn, vectors[k])  # not pending: no recurrence
            updates.append(state.apply(TENANT, user_ids[k % users], update))
        await asyncio.gather(*updates)
    await state.close()
    return [e["text"] for e in events]


async def _settle(mem: Memstream, expected: float, timeout_s: float = 900) -> Samples:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = await asyncio.to_thread(mem.metrics)
        if s.handled() >= expected and s.unsettled_work() <= 0:
            return s
        await asyncio.sleep(0.25)
    raise TimeoutError("the pipeline did not settle in time")


def _counts(before: Samples, after: Samples) -> dict[str, float]:
    def d(name: str, **labels: str) -> float:
        return after.get(name, **labels) - before.get(name, **labels)

    return {
        "llm_calls": d("memstream_llm_calls_total"),
        "triggers": d("memstream_triggers_total"),
        **{
            f"consolidations_{o}": d("memstream_consolidations_total", outcome=o)
            for o in ("created", "updated", "unchanged", "skipped")
        },
    }


async def run(ctx: Context) -> Result:
    p = QUICK if ctx.quick else FULL
    work = ctx.out_dir / "resources"
    work.mkdir(parents=True, exist_ok=True)
    lines = [x for x in SAMPLE_STREAM.read_text().splitlines() if x.strip()]
    sample = [json.loads(x) for x in lines[: p.sample_events]]
    sample_path = write_jsonl(sample, work / "sample.jsonl")
    generated = generate_events(p.generated_events, seed=ctx.seed + 2, tenant=TENANT)
    gen_path = write_jsonl(generated, work / "generated.jsonl")
    bulk_turns = p.short_term_turns - len(sample) - len(generated)
    raw: dict[str, Any] = {"params": asdict(p), "bulk_turns": bulk_turns}
    with services(work / "services") as svc:
        mem = Memstream("up", svc, work / "memstream")
        log.info("bulk-loading %d long-term memories", p.memories)
        raw["memories"] = await load_memories(mem.data_dir, p, ctx.seed)
        log.info("timing the maintenance passes over %d memories", p.memories)
        users = [memory_user(i) for i in range(p.memory_users)]
        raw["maintenance"] = await time_maintenance(mem.data_dir, DIM, users, TENANT)
        log.info("bulk-loading %d short-term turns", bulk_turns)
        queries = await load_turns(svc.redis.url, mem.prefix, bulk_turns, p.turn_users, ctx.seed)
        mem.spawn()
        try:
            procs = {"memstream": mem.ps, "broker": svc.broker_proc, "valkey": svc.redis_proc}
            rss = SplitRssSampler(procs, "memstream")
            with rss:  # from the spawn: start-up counts for the peak
                await asyncio.to_thread(mem.ready)
                rss.sample()
                raw["rss_idle_mib"] = {k: v[-1][1] for k, v in rss.series.items() if v}
                data_dir = mem.data_dir.resolve()
                raw["rss_parts_mib"] = {"when started": rss_breakdown(mem.ps, data_dir)}
                raw["runs"] = await _drive(
                    mem, svc.broker.url, rss, sample_path, gen_path, p, queries
                )
                raw["rss_parts_mib"]["at the end"] = rss_breakdown(mem.ps, data_dir)
            raw["rss_peak_mib"] = rss.peak_mib
            raw["rss_at_peak_mib"] = rss.at_peak
            raw["rss_split_peak_mib"] = {
                k: max((m for _, m in v), default=0.0) for k, v in rss.split_series.items()
            }
            series = {**rss.series, **{f"memstream {k}": v for k, v in rss.split_series.items()}}
            raw["rss_series"] = {
                k: [(round(t, 1), round(m, 1)) for t, m in v] for k, v in series.items()
            }
            raw["rss_marks"] = rss.marks
            raw["valkey_used_bytes"] = await _valkey_used(svc.redis.url)
            log.info("reading the consolidated memories back for token estimates")
            messages = await consolidated_messages(svc.broker.url, f"{mem.prefix}.consolidated")
        finally:
            mem.stop()
    raw["tokens"] = {
        name: asdict(token_costs(events, messages, raw["runs"][name]["llm_calls"]))
        for name, events in (("sample stream", sample), ("generated stream", generated))
    }
    return _result(ctx, p, raw)


async def _drive(
    mem: Memstream,
    broker_url: str,
    rss: RssSampler,
    sample_path: Path,
    gen_path: Path,
    p: Params,
    queries: list[str],
) -> dict[str, dict[str, float]]:
    rss.mark("ready")
    runs: dict[str, dict[str, float]] = {}
    expected = 0.0
    for name, path, count in (
        ("sample stream", sample_path, p.sample_events),
        ("generated stream", gen_path, p.generated_events),
    ):
        log.info("replaying the %s (%d events)", name, count)
        before = await asyncio.to_thread(mem.metrics)
        expected = before.handled() + count
        await replay_file(path, broker_url, f"{mem.prefix}.events", progress=False)
        after = await _settle(mem, expected)
        runs[name] = {"events": count, **_counts(before, after)}
        rss.mark(f"{name} settled")
    log.info("%d retrievals over the users with the most turns", p.retrievals)
    took = []
    async with mem.client() as http:
        for i in range(p.retrievals):
            body = {"user_id": f"rss-u{i % p.turn_users:04d}", "query": queries[i % len(queries)]}
            t = time.perf_counter()
            (await http.post("/v1/retrieve", json=body)).raise_for_status()
            took.append((time.perf_counter() - t) * 1000)
    rss.mark("retrievals done")
    runs["retrievals"] = {"count": len(took), "p50_ms": float(np.percentile(took, 50))}
    return runs


async def _valkey_used(url: str) -> int:
    redis = Redis.from_url(url)
    try:
        return int((await redis.info("memory"))["used_memory"])
    finally:
        await redis.aclose()


def _result(ctx: Context, p: Params, raw: dict[str, Any]) -> Result:
    runs, tokens = raw["runs"], raw["tokens"]
    events = sum(runs[n]["events"] for n in tokens)
    calls = sum(runs[n]["llm_calls"] for n in tokens)
    peak = raw["rss_peak_mib"]["memstream"]
    rows = [
        Row(
            "LLM calls per event",
            calls / events,
            1.0,
            "eager: one consolidation per event",
            higher_is_better=False,
            target="<= 0.1",
        ),
        Row(
            "peak RSS MiB (100k memories)",
            peak,
            RSS_TARGET_MIB,
            "target; mem0 not measured, see resources",
            higher_is_better=False,
            target="<= 600",
        ),
    ]
    eager = sum(t["eager_tokens"] for t in tokens.values())
    per_1k = {"eager (every event)": 1000 * eager / events}
    for name, t in tokens.items():
        per_1k[f"memstream, {name}"] = 1000 * t["memstream_tokens"] / t["events"]
    plots = [
        series_chart(
            ctx.out_dir / "resources_rss.png",
            raw["rss_series"],
            "RSS MiB",
            raw["rss_marks"],
            (RSS_TARGET_MIB, "memstream target"),
        ),
        bar_chart(ctx.out_dir / "resources_tokens.png", per_1k, "LLM tokens per 1,000 events"),
    ]
    maintenance = maintenance_markdown(
        p.memories, 2 * p.memories // DUE_EVERY, p.memories // DUE_EVERY, raw["maintenance"]
    )
    text = "\n\n".join((markdown(p, raw, MEM0_NOTE), maintenance))
    return Result(NAME, rows, text, raw, plots)
