"""Scale-out of the processors: 1 and then 2 ``memstream worker`` processes on the same partitions.

Part of the ingest benchmark. Only the processors (encode + memorize) can run as several
processes on one machine: consolidation and the RPC share Qdrant Edge, which one process
owns. The processes join one consumer group and split the 4 partitions; what they
processed is read from each one's ``/metrics`` and cross-checked against the turns the
processors wrote to Redis.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psutil
from redis.asyncio import Redis

from bench.generate import write_jsonl
from bench.services import Memstream, Services, busy_since, cpu_seconds, wait_until
from memstream.ops.replay import replay_file
from stores.redis_state import user_tag

TENANT = "demo"


async def scale_out(
    svc: Services, workdir: Path, path: Path, count: int, workers: int
) -> dict[str, Any]:
    """``workers`` processor processes in one consumer group; events/s to memorized."""
    prefix = f"so{workers}-{int(time.time())}"
    group = [
        Memstream("worker", svc, workdir / f"worker{workers}-{k}", prefix=prefix)
        for k in range(workers)
    ]
    await asyncio.gather(*(asyncio.to_thread(w.start) for w in group))
    try:
        # Warm up until every process owns partitions: a late joiner triggers a rebalance,
        # so keep sending small rounds (distinct users, spread over the partitions).
        warm = 0
        for _ in range(60):
            batch = [warm_event(warm + i) for i in range(16)]
            warm += len(batch)
            await replay_file(
                write_jsonl(batch, workdir / "warm.jsonl"),
                svc.broker.url,
                f"{prefix}.events",
                progress=False,
            )
            target = warm

            def warmed(target: int = target) -> bool:
                return sum(_handled(group)) >= target

            await asyncio.to_thread(wait_until, warmed, 120, "the warm-up")
            if all(c > 0 for c in _handled(group)):
                break
            await asyncio.sleep(1.0)
        else:
            raise TimeoutError("processor processes never all received partitions")
        cpu0 = [cpu_seconds(w.ps) for w in group]
        machine0 = psutil.cpu_times()
        t0 = time.monotonic()
        await replay_file(path, svc.broker.url, f"{prefix}.events", progress=False)

        done = await asyncio.to_thread(
            wait_until, lambda: sum(_handled(group)) >= warm + count, 900, "the processors", 0.25
        )
        elapsed = done - t0
        turns = await _redis_turns(svc.redis.url, prefix)
        return {
            "workers": workers,
            "events": count,
            "elapsed_s": elapsed,
            "events_per_s": count / elapsed,
            "cpu_s": [cpu_seconds(w.ps) - c for w, c in zip(group, cpu0, strict=True)],
            "per_worker": _handled(group),
            "turns_in_redis": turns,
            "machine_busy": busy_since(machine0),
        }
    finally:
        for w in group:
            w.stop()


def _handled(group: list[Memstream]) -> list[float]:
    return [w.metrics().handled() for w in group]


def warm_event(i: int) -> dict[str, Any]:
    return {
        "event_id": f"warm-{i}",
        "tenant_id": TENANT,
        "user_id": f"warm-u{i}",
        "session_id": f"warm-s{i}",
        "role": "user",
        "text": f"Hello, I have a question about my order W-{10000 + i}, it has not arrived.",
        "ts": "2025-01-06T08:00:00Z",
    }


async def _redis_turns(url: str, prefix: str) -> int:
    """Turns stored, summed over every user's timeline: the processors' output, counted."""
    redis = Redis.from_url(url)
    try:
        total = 0
        for user in await redis.smembers(f"{prefix}:users"):
            name = user.decode() if isinstance(user, bytes) else user
            tenant, _, uid = name.partition(":")
            total += int(await redis.zcard(f"{prefix}:{user_tag(tenant, uid)}:timeline"))
        return total
    finally:
        await redis.aclose()
