"""The whole embedded stack SIGKILLed right after it accepted events: a 202 is a promise.

One ``memstream up`` (every role in one process, the embedded Tansu broker with memory-only
topics, Valkey with its AOF synced every second, Qdrant Edge) on a fresh data folder. Bots
post ``N`` events through ``POST /v1/events`` (every batch must get its 202); 0.3 s after
the last 202 every process of the stack (memstream, the broker, Valkey) is SIGKILLed at
once. The stack starts again on the same folder and settles.

Read back from Redis (the restarted Valkey): *lost* is an accepted event whose processed
mark is missing once the stack settled; *duplicated* a turn memorize wrote that was not
accepted, or written twice; *errors* are answers other than 202 and a stack that did not
settle. Before the intake journal (``rpc.journal``) 1,967 of 2,000 were lost here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import uuid
from pathlib import Path

import httpx

from memstream.launch import Process, child_pids, defaults, wait_for
from memstream.roles import ALL_ROLES
from memstream.settings import DEMO_API_KEY, Settings
from memstream.stores.embedded import free_port
from memstream.wiring import open_state
from reliability.core import Context, Row

NAME = "intake"
BATCH = 20
USERS = [f"intake-u{i}" for i in range(20)]
KILL_AFTER_S = 0.3


def stack(settings: Settings, log_path: Path) -> Process:
    """``memstream up``'s process (every role, embedded services) in a session of its own."""
    return Process(settings, ALL_ROLES, log_path=log_path, new_session=True)


def sigkill_all(process: Process) -> int:
    """SIGKILL memstream and its services together; how many processes."""
    pids = [*child_pids(process.pid), process.pid]  # the services run in sessions of their own
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(30)
    return len(pids)


def valkey_url(data_dir: Path) -> str:
    """The embedded Valkey's URL, from the config the stack wrote (its port is free-picked)."""
    found = re.search(r"^port (\d+)", (data_dir / "redis" / "valkey.conf").read_text(), re.M)
    assert found is not None
    return f"redis://127.0.0.1:{found.group(1)}/0"


async def read_back(
    settings: Settings, redis_url: str, events: list[tuple[str, str]]
) -> tuple[int, int]:
    """(accepted events memorized, distinct turns memorize wrote for these users)."""
    state = open_state(settings.redis, redis_url, cluster_cache_users=settings.cluster.cache_users)
    try:
        flags = await state.memorized_many([("demo", user, event) for event, user in events])
        written = sum([await state.turns_written("demo", user) for user in USERS])
        return sum(flags), written
    finally:
        await state.close()


def post_then_kill(
    settings: Settings, log_path: Path, n: int
) -> tuple[list[tuple[str, str]], int, list[float], int]:
    """Start the stack, post ``n`` events, SIGKILL it all ``KILL_AFTER_S`` after the last
    202: (accepted (event id, user), error answers, latencies in ms, processes killed)."""
    first = stack(settings, log_path).start(150)
    accepted: list[tuple[str, str]] = []
    errors = 0
    latencies: list[float] = []
    try:
        with httpx.Client(
            base_url=first.url, headers={"Authorization": f"Bearer {DEMO_API_KEY}"}, timeout=30
        ) as http:
            for at in range(0, n, BATCH):
                batch = [
                    {
                        "event_id": uuid.uuid4().hex,
                        "user_id": USERS[(at + i) % len(USERS)],
                        "session_id": "intake-s1",
                        "role": "user",
                        "text": f"where is my order D-{at + i}? it was due on Monday",
                    }
                    for i in range(min(BATCH, n - at))
                ]
                began = time.perf_counter()
                answer = http.post("/v1/events", json={"events": batch})
                latencies.append((time.perf_counter() - began) * 1000)
                if answer.status_code == 202:
                    accepted.extend((e["event_id"], e["user_id"]) for e in batch)
                else:
                    errors += 1
        time.sleep(KILL_AFTER_S)
        killed = sigkill_all(first)
    finally:
        first.kill()
    return accepted, errors, latencies, killed


async def run(ctx: Context) -> list[Row]:
    n = 200 if ctx.quick else 2000
    root = ctx.root / NAME
    data_dir = root / "data"
    settings = defaults({"data_dir": data_dir, "rpc": {"port": free_port()}})
    accepted, errors, latencies, killed = await asyncio.to_thread(
        post_then_kill, settings, root / "up-1.log", n
    )
    ctx.say(f"{len(accepted)} of {n} accepted; SIGKILLed {killed} processes {KILL_AFTER_S} s later")

    second = stack(settings, root / "up-2.log")
    began = time.monotonic()
    memorized = written = 0
    settled = True
    try:
        second.start(150)
        redis_url = valkey_url(data_dir)

        def all_memorized() -> bool:
            nonlocal memorized, written
            memorized, written = asyncio.run(read_back(settings, redis_url, accepted))
            return memorized >= len(accepted)

        try:
            await asyncio.to_thread(wait_for, all_memorized, 240, "accepted events", 1.0)
        except TimeoutError:
            settled = False
        await asyncio.sleep(2.0)  # a duplicate would show up late
        memorized, written = await read_back(settings, redis_url, accepted)
        recovered = second.metrics().get("memstream_rpc_journal_recovered_total")
    finally:
        second.stop()
    seconds = time.monotonic() - began
    lost = len(accepted) - memorized
    duplicated = written - memorized
    errors += 0 if settled else 1
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None
    note = (
        f"{len(accepted)} of {n} events accepted (202) in batches of {BATCH}, every process "
        f"SIGKILLed {KILL_AFTER_S} s after the last; restarted on the same folder, "
        f"{recovered:.0f} re-published from the intake journal, {memorized} memorized "
        f"{seconds:.0f} s after the restart." + ("" if settled else " NOT SETTLED.")
    )
    return [
        Row(
            f"stack SIGKILLed after {n:,} accepted events",
            n,
            lost=lost,
            duplicated=duplicated,
            errors=errors,
            p99_ms=p99,
            note=note,
        )
    ]
