"""Ingest burst: bots post turns at 3x the rate the pipeline memorizes them.

A deployment of its own with ``rpc.ingest_max_lag`` at ``BOUND``. First the pipeline's
ingest throughput is measured (``WARMUP`` events posted at once, timed until every one is
memorized), then ``BOTS`` bots post batches at 3x that rate for ``BURST_S`` seconds through
``AsyncMemoryClient``, which honours each 429 (``Retry-After-Ms``) and sends the same batch
(same event ids) again. A bot gives a batch up after the client's retries, as a bot would
surface the error: a given-up batch was never accepted, so it is not lost.

Read back from Redis once the pipeline settled: *lost* is an accepted event (a 202) that is
not in its user's timeline, *duplicated* a turn stored twice or an event stored that was
never accepted (a refused request must leave nothing behind); *errors* are answers other
than 202 / 429 and transport failures. p99 is of single HTTP requests, 429s included.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from typing import Any

import httpx

from memstream.client import AsyncMemoryClient, MemstreamError
from memstream.schemas import EventIn
from reliability.audit import read_turns
from reliability.cluster import Deployment
from reliability.core import Context, Row
from reliability.shared import API_KEYS, KEY_OF

NAME = "burst"
BOUND = 300  # rpc.ingest_max_lag of this deployment: a few seconds of the pipeline's work
FACTOR = 3.0
BOTS = 24
BATCH = 5
RETRIES = 10  # the client's; each waits the server's hint, capped at 5 s
USERS = [("acme", f"burst-u{i}") for i in range(20)]
TEXTS = (
    "my order {n} has not arrived, it was due on Monday",
    "can you check the refund for order {n}?",
    "the kettle from order {n} stopped heating",
    "please change the delivery address of order {n}",
)


class Counting(httpx.AsyncBaseTransport):
    """The real transport, counting answers by status and timing each request."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=BOTS))
        self.statuses: dict[int, int] = {}
        self.latencies_ms: list[float] = []
        self.transport_errors = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError:
            self.transport_errors += 1
            raise
        self.latencies_ms.append((time.perf_counter() - started) * 1000)
        self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def events(rng: random.Random, n: int) -> list[EventIn]:
    out = []
    for _ in range(n):
        tenant, user = rng.choice(USERS)
        assert tenant == "acme"
        out.append(
            EventIn(
                event_id=uuid.uuid4().hex,
                user_id=user,
                session_id=f"{user}-s1",
                role="user",
                text=rng.choice(TEXTS).format(n=f"B-{rng.randrange(10000, 99999)}"),
            )
        )
    return out


async def stored_ids(deployment: Deployment) -> list[str]:
    turns = await read_turns(deployment, USERS)
    return [i for ids in turns.values() for i in ids]


async def wait_stored(deployment: Deployment, count: int, timeout_s: float) -> float | None:
    """Seconds until ``count`` distinct turns are stored, or None at the timeout."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if len(set(await stored_ids(deployment))) >= count:
            return time.monotonic() - began
        await asyncio.sleep(0.2)
    return None


async def run(ctx: Context) -> list[Row]:
    deployment = Deployment(
        ctx.root / "burst", api_keys=API_KEYS, overrides={"rpc": {"ingest_max_lag": BOUND}}
    )
    warmup = 60 if ctx.quick else 250
    burst_s = 8.0 if ctx.quick else 30.0
    rng = random.Random(11)
    counting = Counting()
    accepted: set[str] = set()
    given_up = 0
    errors: list[str] = []
    client: AsyncMemoryClient | None = None

    async def send(batch: list[EventIn]) -> None:
        nonlocal given_up
        assert client is not None
        try:
            answer = await client.add_many(batch)
        except MemstreamError as exc:
            if exc.status == 429:
                given_up += 1
            else:
                errors.append(f"{exc.status}: {str(exc)[:120]}")
            return
        except httpx.HTTPError as exc:
            errors.append(repr(exc)[:120])
            return
        accepted.update(answer.event_ids)

    try:
        deployment.start_services()
        deployment.start("stream")
        deployment.start("memory")
        client = AsyncMemoryClient(
            deployment["memory"].url,
            KEY_OF["acme"],
            timeout_s=30,
            retries=RETRIES,
            transport=counting,
        )
        # The throughput: a backlog of ``warmup`` events, timed until all are memorized.
        began = time.monotonic()
        first = events(rng, warmup)
        await asyncio.gather(*(send(first[i : i + BATCH]) for i in range(0, warmup, BATCH)))
        took = await wait_stored(deployment, len(accepted), 120)
        if took is None:
            return [Row("ingest burst: the warm-up never settled", warmup, errors=1)]
        throughput = len(accepted) / (time.monotonic() - began)
        rate = FACTOR * throughput
        ctx.say(f"burst: throughput {throughput:.0f} events/s, bursting at {rate:.0f}/s")

        # The burst: each bot keeps its share of the rate, open loop, for ``burst_s``.
        statuses_before = dict(counting.statuses)
        accepted_before = len(accepted)
        posted = 0
        held_back = 0  # turns the burst's schedule had for a bot still waiting out a 429
        interval = BOTS * BATCH / rate
        burst_began = time.monotonic()
        stop = burst_began + burst_s

        async def bot(index: int) -> None:
            nonlocal posted, held_back
            bot_rng = random.Random(index)
            due = burst_began + index * interval / BOTS
            while due < stop:
                if time.monotonic() >= stop:  # still waiting out 429s when the burst ended
                    held_back += BATCH * math.ceil((stop - due) / interval)
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                batch = events(bot_rng, BATCH)
                posted += len(batch)
                await send(batch)
                due += interval  # behind after a 429: the next goes at once (3x persists)

        await asyncio.gather(*(bot(i) for i in range(BOTS)))
        burst_took = time.monotonic() - burst_began
        settle = await wait_stored(deployment, len(accepted), 180)
        found = await stored_ids(deployment)
    finally:
        if client is not None:
            await client.close()
        deployment.stop()
    refused = counting.statuses.get(429, 0) - statuses_before.get(429, 0)
    lost = len(accepted - set(found))
    duplicated = (len(found) - len(set(found))) + len(set(found) - accepted)
    others = {s: n for s, n in counting.statuses.items() if s not in (202, 429)}
    errors += [f"{n} answers {s}" for s, n in others.items()]
    errors += [f"{counting.transport_errors} transport errors"] if counting.transport_errors else []
    if errors:
        ctx.say(f"burst errors: {errors[:5]}")
    latencies = sorted(counting.latencies_ms)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    burst_accepted = len(accepted) - accepted_before
    note = (
        f"rpc.ingest_max_lag={BOUND}; measured ingest throughput {throughput:.0f} events/s "
        f"({len(first)} events posted at once, memorized in {took:.1f} s); {BOTS} bots at "
        f"{rate:.0f} events/s in batches of {BATCH} for {burst_s:.0f} s (took {burst_took:.1f} "
        f"s with the clients' retries): {posted} events posted and {held_back} more held back "
        f"by bots still waiting out a 429 when it ended, {burst_accepted} accepted "
        f"({burst_accepted / burst_took:.0f}/s), {refused} answers 429 honoured "
        f"(AsyncMemoryClient, {RETRIES} retries), {given_up} batches given up after them "
        f"(never accepted, so not lost); every accepted event memorized "
        + (f"{settle:.1f} s after the burst" if settle is not None else "NOT within 180 s")
        + (f"; errors: {errors[:3]}" if errors else "")
        + ". Client and server share the 2 cores."
    )
    label = (
        f"ingest burst at 3x throughput ({rate:.0f} events/s for {burst_s:.0f} s): "
        f"{burst_accepted} accepted, {refused} refused with 429"
    )
    fields: dict[str, Any] = {"lost": lost, "duplicated": duplicated, "errors": len(errors)}
    return [Row(label, posted, p99_ms=p99, note=note, **fields)]
