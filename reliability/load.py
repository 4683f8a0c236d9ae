"""Load and overload: closed-loop clients call retrieve over loopback, each as long as a
request count or a time cap allows; each row's label says what stopped it, how many
requests were sent and in how many seconds (a fast machine reaches the count first).

Each client loops: pick a user of the isolation population and a query, call
``POST /v1/retrieve``, record the latency. A refusal by admission control (503 or 429 with
``Retry-After``) is counted as shed, its answer time apart, and the client waits as the
hint says before its next call, as ``MemoryClient`` does; any other non-200 or transport
error is an error, and the error rate must be 0 at every load. Rows:

- *load*: 50 clients, the RPC's ordinary busy day;
- *overload*: 64 and 256 clients, more than the two cores can answer: admission control
  must refuse the excess quickly (a 503/429 with its hint, never a 5xx, a timeout or a
  dropped connection) and keep serving the rest.

p50 / p99 are reported, not promised: on this shared 2-core machine the clients' own CPU
takes from the server's (``BENCHMARKS.md`` has the isolated figures, with their targets).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import aiohttp

from bench.retrieval_load import SHED_STATUSES, load_session
from memstream.client import MAX_RETRY_AFTER_S, retry_delay
from reliability.core import Context, Row
from reliability.shared import KEY_OF, service

NAME = "load"
_SHED_HINTS = {"retry-after", "retry-after-ms"}
LOAD_CLIENTS = 50
OVERLOAD_CLIENTS = (64, 256)
MAX_REQUESTS = 20_000  # the bound on count, whatever the speed
QUERIES = (
    "Where is my order?",
    "what about order Q-12345?",
    "I want a refund for the damaged kettle",
    "change my delivery address",
    "did you get my new phone number?",
)


@dataclass
class Drive:
    """What ``clients`` closed-loop callers saw in one run."""

    clients: int
    duration_s: float
    sent: int = 0
    took_s: float = 0.0
    answered_ms: list[float] = field(default_factory=list)  # answers other than a refusal
    shed_ms: list[float] = field(default_factory=list)  # refusals with a Retry-After hint
    errors: list[str] = field(default_factory=list)

    def pct(self, values: list[float], q: float) -> float | None:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    @property
    def stopped_by(self) -> str:
        # What stopped it, read from what happened, not from the constants.
        if self.sent >= MAX_REQUESTS:
            return f"the {MAX_REQUESTS:,}-request cap"
        return f"the {self.duration_s:.0f} s cap"

    def summary(self) -> str:
        answered, shed = self.answered_ms, self.shed_ms
        return (
            f"{self.clients} concurrent clients until {MAX_REQUESTS:,} requests or "
            f"{self.duration_s:.0f} s, stopped by {self.stopped_by}: {self.sent} requests in "
            f"{self.took_s:.1f} s = {self.sent / max(self.took_s, 1e-9):.0f}/s, error rate "
            f"{len(self.errors) / max(self.sent, 1):.4f}, {len(answered)} answered (p50 "
            f"{self.pct(answered, 0.5) or 0:.0f} ms, p99 {self.pct(answered, 0.99) or 0:.0f} "
            f"ms), {len(shed)} shed with Retry-After (answer p99 "
            f"{self.pct(shed, 0.99) or 0:.0f} ms)"
            + (f"; first errors: {self.errors[:3]}" if self.errors else "")
            + ". Client and server share the 2 cores."
        )


async def drive(url: str, clients: int, duration_s: float) -> Drive:
    """``clients`` closed-loop callers for ``duration_s`` (or ``MAX_REQUESTS`` in all).

    One session for all of them, as the retrieval benchmark drives the RPC (``load_session``)."""
    run = Drive(clients, duration_s)
    session = load_session(url)

    async def client(seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        headers = {"Authorization": f"Bearer {KEY_OF[rng.choice(sorted(KEY_OF))]}"}
        while time.monotonic() < deadline and run.sent < MAX_REQUESTS:
            run.sent += 1
            body = {"user_id": f"iso-u{rng.randrange(6)}", "query": rng.choice(QUERIES)}
            started = time.perf_counter()
            try:
                # The whole body, a refusal's too: a connection left mid-answer is not reused.
                async with session.post("/v1/retrieve", json=body, headers=headers) as answer:
                    text = await answer.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                run.errors.append(repr(exc)[:120])
                continue
            took_ms = (time.perf_counter() - started) * 1000
            if answer.status in SHED_STATUSES and any(h in answer.headers for h in _SHED_HINTS):
                run.shed_ms.append(took_ms)
                await asyncio.sleep(retry_delay(0, answer.headers, 0.1, MAX_RETRY_AFTER_S, rng))
                continue
            run.answered_ms.append(took_ms)
            if answer.status != 200:
                run.errors.append(f"{answer.status}: {text[:120]}")

    async with session:
        began = time.monotonic()
        deadline = began + duration_s
        await asyncio.gather(*(client(i, deadline) for i in range(clients)))
        run.took_s = time.monotonic() - began
    return run


async def run(ctx: Context) -> list[Row]:
    url = service(ctx)["memory"].url
    load_s, overload_s = (10.0, 5.0) if ctx.quick else (60.0, 20.0)
    rows: list[Row] = []
    load = await drive(url, LOAD_CLIENTS, load_s)
    rows.append(
        Row(
            f"load: retrieve, {load.clients} clients, {load.sent:,} requests in "
            f"{load.took_s:.1f} s",
            load.sent,
            errors=len(load.errors),
            p99_ms=load.pct(load.answered_ms, 0.99),
            promised=("errors",),
            note=load.summary(),
        )
    )
    for clients in OVERLOAD_CLIENTS:
        over = await drive(url, clients, overload_s)
        shed_p99 = over.pct(over.shed_ms, 0.99)
        rows.append(
            Row(
                f"overload: retrieve, {clients} clients, {over.sent:,} requests in "
                f"{over.took_s:.1f} s: {len(over.answered_ms):,} answered, "
                f"{len(over.shed_ms):,} refused with Retry-After"
                + (f" (answer p99 {shed_p99:.0f} ms)" if shed_p99 is not None else ""),
                over.sent,
                errors=len(over.errors),
                p99_ms=over.pct(over.answered_ms, 0.99),
                promised=("errors",),
                note=over.summary(),
            )
        )
    return rows
