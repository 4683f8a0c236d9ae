"""Retrieval latency: how fast `POST /v1/retrieve` answers, alone and under load (issue 3).

What runs: a long-term store of up to 1M memories (bulk-loaded, `bench.retrieval_data`)
with 1k- and 10k-memory users, 500 short-term turns each in Valkey, and a real
`memstream serve` process over them (its own process, as an operator runs it; the
broker and Valkey are their own processes too). `bench.retrieval_load` drives it over
loopback: closed loops of 1, 16 and 64 callers (the best is the saturation throughput),
Poisson arrivals at half of it, and one caller replaying cached queries (the server-side
cost without encoding). Beside it, in the same run: a flat numpy brute force
over the same vectors, the bare encoder, and mem0 (in its own venv, same encoder).

Everything shares 2 cores: the load generator, the server, Valkey. Absolute numbers
carry that; the references are measured in the same run so the ratios do not.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import retrieval_data as data
from bench.core import Context, Result, Row
from bench.plotting import latency_chart
from bench.retrieval_load import Driver, RetrievalServer, Run, throughput_plot
from bench.services import services
from memstream.settings import DEMO_TENANT, Settings
from stores.encoder import OnnxEncoder
from stores.redis_state import RedisState

NAME = "retrieval_latency"
TURNS_PER_USER = 500  # the RPC's default short-term candidate cap: the worst case
P99_TARGET_MS = 20.0  # caller p99 at half load, 10k memories per user
MEM0_VENV = Path(__file__).resolve().parent / "out" / "mem0-venv"
MEM0_RUNNER = Path(__file__).resolve().parent / "mem0_runner.py"


@dataclass(frozen=True)
class Plan:
    users: dict[str, int]
    total: int
    saturation_s: float
    open_s: float
    closed_s: float
    cached_queries: int
    reference_n: int
    upsert_n: int
    mem0_memories: int


QUICK = Plan({"u-1k": 1_000}, 20_000, 3, 4, 2, 40, 60, 1_000, 100)
FULL = Plan({"u-1k": 1_000, "u-10k": 10_000}, 1_000_000, 8, 15, 6, 200, 300, 5_000, 1_000)


async def run(ctx: Context) -> Result:
    plan = QUICK if ctx.quick else FULL
    work = ctx.out_dir / "retrieval"
    t0 = time.perf_counter()
    store, vectors = await data.build_store(
        work / "stores", DEMO_TENANT, plan.users, plan.total, ctx.seed, reuse=not ctx.quick
    )
    raw: dict[str, Any] = {"plan": plan.__dict__, "store": _store_raw(store)}
    raw["build_s"] = time.perf_counter() - t0
    raw["upsert"] = await data.upsert_rate(work, DEMO_TENANT, ctx.seed, plan.upsert_n)
    texts = data.queries(ctx.seed)
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    per_user: dict[str, dict[str, Any]] = {}
    for user in plan.users:
        per_user[user] = {
            "direct_search": await data.direct_search(
                store.path, DEMO_TENANT, user, plan.reference_n, ctx.seed
            ),
            "brute_force": data.brute_force(vectors[user], plan.reference_n, ctx.seed),
            "encode_and_search": data.encode_and_search(
                encoder, vectors[user], [next(texts) for _ in range(plan.reference_n)]
            ),
        }
    runs: dict[str, list[Run]] = {}
    with services(work / "services") as svc:
        server = RetrievalServer("serve", svc, store.path)
        state = RedisState.from_url(svc.redis.url, prefix=server.prefix)
        for user in plan.users:
            await data.seed_turns(state, DEMO_TENANT, user, TURNS_PER_USER, ctx.seed)
        await state.close()
        server.start()
        try:
            for user in plan.users:
                runs[user] = await _drive(server, user, plan, texts, ctx.seed)
        finally:
            server.stop()
    for user, user_runs in runs.items():
        per_user[user]["runs"] = [r.report() for r in user_runs]
    raw["users"] = per_user
    raw["mem0"] = _mem0(work, plan, encoder.model_id, texts)
    raw["measure_s"] = time.perf_counter() - t0 - raw["build_s"]
    plots = _plots(ctx.out_dir, runs, per_user)
    return Result(NAME, _rows(plan, per_user), _markdown(plan, raw), _jsonable(raw), plots)


async def _drive(
    server: RetrievalServer, user: str, plan: Plan, texts: Any, seed: int
) -> list[Run]:
    async with Driver(server, user, texts) as d:
        await d.closed_loop("warm-up", 4, 1.0)
        one = await d.closed_loop("1 caller", 1, plan.closed_s)
        sixteen = await d.closed_loop("16 callers", 16, plan.closed_s)
        many = await d.closed_loop("64 callers", 64, plan.saturation_s)
        # Saturation: the most any closed loop got through (past it, more callers only queue).
        saturation = max(sixteen.qps, many.qps)
        half = await d.open_loop("open, half load", saturation / 2, plan.open_s, seed)
        replay = [next(texts) for _ in range(plan.cached_queries)]
        await d.closed_loop("cache warm-up", 8, 60.0, texts=iter(replay))
        cycle = itertools.cycle(replay)
        cached = await d.closed_loop("1 caller, cached", 1, plan.closed_s, texts=cycle)
    return [one, sixteen, many, half, cached]


def _mem0(work: Path, plan: Plan, model_id: str, texts: Any) -> dict[str, Any]:
    """mem0 timed by `bench/mem0_runner.py` in its own venv, or why it could not run."""
    python = MEM0_VENV / "bin" / "python"
    if not python.exists():
        return {"skipped": f"no mem0 venv at {MEM0_VENV} (see the section for the install)"}
    spec = {
        "sha256": Settings().encoder.model_sha256,
        "user_id": "u-mem0",
        "memories": [_memory_text(i) for i in range(plan.mem0_memories)],
        "queries": [next(texts) for _ in range(plan.reference_n // 2)],
        "top_k": 8,
    }
    spec_path, out_path = work / "mem0-spec.json", work / "mem0-out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    done = subprocess.run(
        [str(python), str(MEM0_RUNNER), str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(work), "MEM0_DIR": str(work / "mem0-home")},
    )
    if done.returncode != 0 or not out_path.exists():
        return {"failed": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(out_path.read_text())
    result["search"] = data.summary(result.pop("search_ms"))
    result["encode"] = data.summary(result.pop("encode_ms"))
    result["model_id"] = model_id
    return result


def _memory_text(i: int) -> str:
    return (
        f"Order A-{10_000 + i}: the parcel left the warehouse {i % 9 + 1} days ago and has not "
        f"arrived; the customer asked for a refund of the {i % 40 + 5} euro shipping fee."
    )


def _run(user_raw: dict[str, Any], label: str) -> dict[str, Any]:
    return next(r for r in user_raw["runs"] if r["label"] == label)


def _rows(plan: Plan, per_user: dict[str, dict[str, Any]]) -> list[Row]:
    big = max(plan.users, key=lambda u: plan.users[u])  # 10k/user in full mode
    u = per_user[big]
    return [
        Row(
            "retrieval p99 ms (half load, 10k/user)",
            _run(u, "open, half load")["latency"]["p99"],
            u["encode_and_search"]["total"]["p99"],
            "flat numpy brute force + same encoder, one query at a time, in-process",
            higher_is_better=False,
            target=f"<= {P99_TARGET_MS:.0f} ms",
        ),
        Row(
            "retrieval server-side p99 ms (10k/user, 1M store)",
            _run(u, "1 caller, cached")["took"]["p99"],
            u["brute_force"]["p99"],
            "flat numpy brute force over the user's vectors",
            higher_is_better=False,
            target="<= 5 ms",
        ),
    ]


def _plots(out: Path, runs: dict[str, list[Run]], per_user: dict[str, Any]) -> list[Path]:
    plots = [
        throughput_plot(
            out / "retrieval_throughput.png",
            {u: [r for r in rs if r.label != "1 caller, cached"] for u, rs in runs.items()},
            "Retrieval RPC: caller latency against throughput\n"
            "(closed loops of 1, 16 and 64 callers; open loop at half the best closed rate)",
            target_ms=P99_TARGET_MS,
            refs_ms={u: 2 * per_user[u]["encode_and_search"]["total"]["p99"] for u in runs},
        )
    ]
    for user, user_runs in runs.items():
        half = next(r for r in user_runs if r.label == "open, half load")
        refs = {"brute force + encode p99": per_user[user]["encode_and_search"]["total"]["p99"]}
        plots.append(
            latency_chart(
                out / f"retrieval_latency_{user}.png",
                half.latencies_ms,
                f"Retrieval at half load ({half.load:.0f}/s Poisson), {user}",
                refs,
            )
        )
    return plots


def _store_raw(store: data.StoreInfo) -> dict[str, Any]:
    return {
        "total": store.total,
        "users": store.users,
        "bulk_per_s": store.bulk_per_s,
        "bulk_s": store.bulk_s,
        "reused": store.reused,
    }


def _jsonable(raw: dict[str, Any]) -> dict[str, Any]:
    for user in raw["users"].values():
        user["encode_and_search"].pop("total_ms", None)
    return raw


def _ms(stats: dict[str, Any], key: str = "p99") -> str:
    value = stats.get(key)
    return "–" if value is None else f"{value:.1f}"


def _markdown(plan: Plan, raw: dict[str, Any]) -> str:
    store, ups = raw["store"], raw["upsert"]
    lines = [
        "## Retrieval latency",
        "",
        f"Store: {store['total']:,} memories in Qdrant Edge "
        f"({', '.join(f'{u}: {n:,}' for u, n in store['users'].items())}, the rest spread over "
        f"{data.FILLER_PER_USER:,}-memory users in 10 tenants), {TURNS_PER_USER} short-term "
        "turns per measured user in Valkey. Bulk load (`upsert_bulk`): "
        f"{store['bulk_per_s']:,.0f} memories/s ({store['bulk_s']:.0f} s"
        f"{', built by an earlier run and reused' if store['reused'] else ''}); "
        f"ordinary `upsert` in batches of 16: {ups['per_s']:,.0f} memories/s.",
        "",
        "The RPC is a real `memstream serve` process; the load generator (httpx, same "
        "machine) shares its 2 cores. Open loop: Poisson arrivals, latency counted from "
        "each request's scheduled arrival. Server phases come from the "
        "`memstream_retrieval_latency_seconds` histogram (p99 interpolated in its buckets).",
        "",
    ]
    for user, u in raw["users"].items():
        lines += [
            f"### {user} ({plan.users[user]:,} memories)",
            "",
            "| run | queries/s | caller p50 ms | caller p99 ms | server took p50 / p99 ms "
            "| encode / fetch / rank mean ms | errors |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in u["runs"]:
            ph = r["phases"]
            lines.append(
                f"| {r['label']} | {r['qps']:.1f} | {_ms(r['latency'], 'p50')} | "
                f"{_ms(r['latency'])} | {_ms(r['took'], 'p50')} / {_ms(r['took'])} | "
                f"{_ms(ph['encode'], 'mean')} / {_ms(ph['fetch'], 'mean')} / "
                f"{_ms(ph['rank'], 'mean')} | {r['errors']} |"
            )
        ref, bf, ds = u["encode_and_search"], u["brute_force"], u["direct_search"]
        half = _run(u, "open, half load")
        lines += [
            "",
            f"Saturation: {2 * half['load']:.1f} queries/s (the best closed loop); half load "
            f"= {half['load']:.1f}/s Poisson. `1 caller, cached` replays "
            f"{plan.cached_queries} queries already in the RPC's query cache: its server "
            "`took` is the retrieval without encoding (fetch + rank), the server-side figure.",
            "",
            f"References, same vectors, in-process: numpy brute force p50 {_ms(bf, 'p50')} / "
            f"p99 {_ms(bf)} ms; the Edge store's own search (no RPC) p50 {_ms(ds, 'p50')} / "
            f"p99 {_ms(ds)} ms; encoder + brute force, one query at a time, p50 "
            f"{_ms(ref['total'], 'p50')} / p99 {_ms(ref['total'])} ms (encoding alone p50 "
            f"{_ms(ref['encode'], 'p50')} ms).",
            "",
        ]
    lines += _mem0_lines(raw["mem0"])
    lines += [
        "",
        f"Timing: {raw['build_s']:.0f} s building the store, {raw['measure_s']:.0f} s measuring.",
    ]
    return "\n".join(lines)


def _mem0_lines(m: dict[str, Any]) -> list[str]:
    head = ["### mem0 (`mem0ai==2.2.1`), same encoder", ""]
    if "skipped" in m or "failed" in m:
        return [*head, f"Not measured: {m.get('skipped') or m.get('failed')}"]
    return [
        *head,
        f"mem0 in its own venv (`{MEM0_VENV.relative_to(MEM0_VENV.parents[2])}`), offline: "
        "Qdrant local mode on disk (its default store), a dummy LLM never called "
        "(`infer=False`), our ONNX encoder through mem0's `langchain` embedder provider. "
        f"{m['memories']:,} memories for one user added at {m['add_per_s']:.0f}/s; "
        f"`search` (which embeds the query itself) p50 {_ms(m['search'], 'p50')} / p99 "
        f"{_ms(m['search'])} ms, of which encoding p50 {_ms(m['encode'], 'p50')} ms, one "
        "query at a time. mem0's BM25 and entity boosts need spaCy models and fastembed, "
        "downloads this offline machine cannot make; mem0 logs that and searches by vector.",
    ]
