"""Load: 50 concurrent clients call retrieve over loopback until a request count or a time
cap is reached, whichever comes first; the row's label says which stopped it, how many
requests were sent and in how many seconds (a fast machine reaches the count first).

Each client loops: pick a user of the isolation population (or the generated stream) and
a query, call ``POST /v1/retrieve``, record the latency. A refusal by admission control
(503 or 429 with ``Retry-After``) is counted as shed, and the client waits as the hint says
before its next call, as ``MemoryClient`` does; any other non-200 or transport error is an
error, and the error rate must be 0. p50 / p99 are reported (on this shared 2-core machine
they measure the machine as much as memstream: ``BENCHMARKS.md`` has the isolated figures).
"""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from memstream.client import MAX_RETRY_AFTER_S, retry_delay
from reliability.core import Context, Row
from reliability.shared import KEY_OF, service

NAME = "load"
_SHED_HINTS = {"retry-after", "retry-after-ms"}
CLIENTS = 50
MAX_REQUESTS = 20_000  # the bound on count, whatever the speed
QUERIES = (
    "Where is my order?",
    "what about order Q-12345?",
    "I want a refund for the damaged kettle",
    "change my delivery address",
    "did you get my new phone number?",
)


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    duration_s = 10.0 if ctx.quick else 60.0  # the cap on time, whatever the count
    url = deployment["memory"].url
    latencies: list[float] = []
    errors: list[str] = []
    shed = 0
    deadline = time.monotonic() + duration_s
    sent = 0

    async def client(seed: int) -> None:
        nonlocal sent, shed
        rng = random.Random(seed)
        tenant = rng.choice(sorted(KEY_OF))
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {KEY_OF[tenant]}"},
            timeout=30,
            limits=limits,
        ) as http:
            while time.monotonic() < deadline and sent < MAX_REQUESTS:
                sent += 1
                body = {"user_id": f"iso-u{rng.randrange(6)}", "query": rng.choice(QUERIES)}
                started = time.perf_counter()
                try:
                    answer = await http.post("/v1/retrieve", json=body)
                except httpx.HTTPError as exc:
                    errors.append(repr(exc)[:120])
                    continue
                if answer.status_code in (429, 503) and _SHED_HINTS & answer.headers.keys():
                    shed += 1
                    await asyncio.sleep(retry_delay(0, answer, 0.1, MAX_RETRY_AFTER_S, rng))
                    continue
                latencies.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 200:
                    errors.append(f"{answer.status_code}: {answer.text[:120]}")

    began = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    took = time.monotonic() - began
    latencies.sort()

    def pct(q: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    p50 = pct(0.5)
    # What stopped it, read from what happened, not from the constants.
    stopped = (
        f"the {MAX_REQUESTS:,}-request cap"
        if sent >= MAX_REQUESTS
        else f"the {duration_s:.0f} s cap"
    )
    note = (
        f"{CLIENTS} concurrent clients until {MAX_REQUESTS:,} requests or {duration_s:.0f} s, "
        f"stopped by {stopped}: {sent} requests in {took:.1f} s = {sent / took:.0f}/s, error rate "
        f"{len(errors) / max(sent, 1):.4f}, {shed} shed with Retry-After, "
        f"p50 {p50 or 0:.0f} ms, p99 {pct(0.99) or 0:.0f} ms"
        + (f"; first errors: {errors[:3]}" if errors else "")
        + ". Client and server share the 2 cores."
    )
    return [
        Row(
            f"load: retrieve, {CLIENTS} clients, {sent:,} requests in {took:.1f} s",
            sent,
            errors=len(errors),
            p99_ms=pct(0.99),
            promised=("errors",),
            note=note,
        )
    ]
