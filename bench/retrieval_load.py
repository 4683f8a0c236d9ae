"""Load on a running retrieval RPC: open-loop (Poisson) and closed-loop callers over loopback.

This module owns driving ``POST /v1/retrieve`` with an ``aiohttp`` client and what a run
measures: the caller's latency (open loop: from the request's scheduled arrival, so a late
start counts against the server, not for it), the server's own ``took_ms``, and the
server's phase times (encode, fetch, rank, total) from the
``memstream_retrieval_latency_seconds`` histogram, scraped before and after the run.
Every run is bounded in time and in requests and stops by itself.

The driver shares the server's cores, so its cost per request must stay small and flat in
the number of callers, and a request must be written when it is sent: a wait in the
client counts as the server's latency, a refusal's too. Not ``httpx``: its connection pool
rescans every connection on each request and each release, and it retries a failing
``import sniffio`` per request, so with tens of callers it queues requests itself.

A request the server's admission control refuses (503 / 429) is no error: its answer's
latency is kept apart (``shed_ms``), and a closed-loop caller waits what ``Retry-After-Ms``
asks, jittered up by as much as half, before its next request, as ``memstream.client`` does (a
caller that came back at once would only measure how fast refusals can be made).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil  # type: ignore[import-untyped]  # no stubs in the venv

from bench.retrieval_data import summary
from bench.services import Memstream, Samples, busy_since
from memstream.client import MAX_RETRY_AFTER_S, retry_delay
from memstream.settings import DEMO_API_KEY

HISTOGRAM = "memstream_retrieval_latency_seconds"
PHASES = ("encode", "fetch", "rank", "total")
MAX_IN_FLIGHT = 2000  # an open loop past saturation queues; this bounds how far
SHED_STATUSES = (429, 503)  # the admission control's refusals
# Under uvicorn's 5 s: aiohttp does not resend a POST on a kept-alive connection the server
# closed meanwhile, so one is dropped before the server would drop it.
KEEPALIVE_S = 4.0


def load_session(url: str, headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """The load drivers' HTTP client (this benchmark's and ``make reliability``'s): one
    session for every caller, unbounded kept-alive connections, no cookies. One ``httpx``
    client per caller cost the driver seconds of CPU, taken from the server it measures."""
    return aiohttp.ClientSession(
        url,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=30),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class RetrievalServer(Memstream):
    """``memstream serve``: the API alone, its metrics on the API's port."""

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"


@dataclass
class Run:
    label: str
    mode: str  # "open" or "closed"
    load: float  # arrivals/s (open) or callers (closed)
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    took_ms: list[float] = field(default_factory=list)
    # What each error was (an HTTP status or the client's exception), so a run says why.
    error_kinds: Counter[str] = field(default_factory=Counter)
    shed_ms: list[float] = field(default_factory=list)  # refused answers' latency
    shed_kinds: Counter[str] = field(default_factory=Counter)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    machine_busy: float = float("nan")  # share of the machine's CPU in use, anyone's

    def fail(self, kind: str) -> None:
        self.error_kinds[kind] += 1

    @property
    def errors(self) -> int:
        return sum(self.error_kinds.values())

    @property
    def qps(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0

    def report(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "mode": self.mode,
            "load": self.load,
            "seconds": self.seconds,
            "qps": self.qps,
            "errors": self.errors,
            "error_kinds": dict(self.error_kinds),
            "shed": len(self.shed_ms),
            "shed_kinds": dict(self.shed_kinds),
            "shed_latency": summary(self.shed_ms),
            "latency": summary(self.latencies_ms),
            "took": summary(self.took_ms),
            "phases": self.phases,
            "machine_busy": self.machine_busy,
        }


class Driver:
    """Sends retrieval requests for one user with fresh (uncached) or replayed queries."""

    def __init__(self, server: RetrievalServer, user: str, texts: Iterator[str]) -> None:
        self.server = server
        self.user = user
        self.texts = texts
        self.rng = random.Random(user)  # the jitter of refused callers' waits

    async def __aenter__(self) -> Driver:
        self.client = load_session(self.server.url, {"Authorization": f"Bearer {DEMO_API_KEY}"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def one(self, run: Run, text: str, since: float) -> float:
        """Send one; the seconds the server asked a refused caller to wait (else 0)."""
        body = {"user_id": self.user, "query": text, "top_k": 8, "budget_tokens": 512}
        try:
            # The whole body, a refusal's too: a connection left mid-answer is not reused.
            async with self.client.post("/v1/retrieve", json=body) as response:
                content = await response.read()
            status = response.status
            if status in SHED_STATUSES:
                run.shed_ms.append((time.perf_counter() - since) * 1000)
                run.shed_kinds[f"HTTP {status}"] += 1
                return retry_delay(0, response.headers, 0.1, MAX_RETRY_AFTER_S, self.rng)
            if status != 200:
                run.fail(f"HTTP {status}")
                return 0.0
            took = float(json.loads(content)["took_ms"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as error:
            run.fail(type(error).__name__)
            return 0.0
        run.latencies_ms.append((time.perf_counter() - since) * 1000)
        run.took_ms.append(took)
        return 0.0

    async def open_loop(
        self, label: str, rate: float, arrivals: Sequence[float], texts: Sequence[str]
    ) -> Run:
        """One request per arrival (seconds from the start; `poisson_arrivals`), each with its
        own text, sent at its time whatever the server is doing; latency from that time."""
        run = Run(label, "open", rate)
        tasks: set[asyncio.Task[float]] = set()
        with self._phases(run):
            start = time.perf_counter()
            for at, text in zip(arrivals, texts, strict=True):
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                if len(tasks) >= MAX_IN_FLIGHT:
                    run.fail("shed by the caller")  # the server is far past saturation
                    continue
                task = asyncio.create_task(self.one(run, text, start + at))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
            run.seconds = time.perf_counter() - start
        return run

    async def closed_loop(
        self, label: str, callers: int, seconds: float, texts: Iterator[str] | None = None
    ) -> Run:
        """`callers` callers, each sending its next request when the last one answered,
        until `seconds` are up or `texts` (default: fresh queries) run out."""
        run = Run(label, "closed", callers)
        source = self.texts if texts is None else texts

        async def caller(deadline: float) -> None:
            while time.perf_counter() < deadline and (text := next(source, None)) is not None:
                wait = await self.one(run, text, time.perf_counter())
                if wait:  # refused: back after the server's hint, as memstream.client does
                    await asyncio.sleep(min(wait, max(0.0, deadline - time.perf_counter())))

        with self._phases(run):
            start = time.perf_counter()
            await asyncio.gather(*(caller(start + seconds) for _ in range(callers)))
            run.seconds = time.perf_counter() - start
        return run

    def _phases(self, run: Run) -> _PhaseDelta:
        return _PhaseDelta(self.server, run)


def poisson_arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the start) at `rate`/s within `seconds`: the one
    schedule memstream and its reference are both given."""
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    at = float(rng.exponential(1.0 / rate))
    while at <= seconds:
        arrivals.append(at)
        at += float(rng.exponential(1.0 / rate))
    return arrivals


def serve_open_loop(
    label: str,
    rate: float,
    arrivals: Sequence[float],
    texts: Sequence[str],
    handle: Callable[[str], object],
    *,
    servers: int = 1,
) -> Run:
    """A one-process reference server under the same open-loop arrivals: one FIFO queue and
    ``servers`` workers (this thread when one) running `handle`, each taking the next
    request in arrival order once it is free.

    A request starts at its scheduled arrival or when a worker is free, whichever is later,
    so a reference that falls behind queues, and its latency, like the RPC's, runs from the
    scheduled arrival. No producer thread: its wake-ups would only take the GIL from the
    workers, and the queue it would fill is exactly this order. ``took_ms`` holds the
    service time alone (without the wait in the queue).
    """
    run = Run(label, "open", rate)
    jobs = list(zip(arrivals, texts, strict=True))
    latencies, took = [0.0] * len(jobs), [0.0] * len(jobs)
    taken = iter(range(len(jobs)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(taken, None)
            if i is None:
                return
            due = start + jobs[i][0]
            idle = due - time.perf_counter()
            if idle > 0:
                time.sleep(idle)
            began = time.perf_counter()
            handle(jobs[i][1])
            done = time.perf_counter()
            latencies[i], took[i] = (done - due) * 1000, (done - began) * 1000

    machine = psutil.cpu_times()
    start = time.perf_counter()
    if servers == 1:
        worker()
    else:
        threads = [threading.Thread(target=worker) for _ in range(servers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    run.seconds = time.perf_counter() - start
    run.latencies_ms, run.took_ms = latencies, took
    run.machine_busy = busy_since(machine)
    return run


class _PhaseDelta:
    """Scrapes the phase histogram around a run and stores per-phase stats on it, and how
    busy the machine was meanwhile."""

    def __init__(self, server: RetrievalServer, run: Run) -> None:
        self.server = server
        self.run = run

    def __enter__(self) -> None:
        self.before = self.server.metrics()
        self.machine = psutil.cpu_times()

    def __exit__(self, *exc: object) -> None:
        self.run.machine_busy = busy_since(self.machine)
        after = self.server.metrics()
        self.run.phases = {p: phase_stats(self.before, after, p) for p in PHASES}


def phase_stats(before: Samples, after: Samples, phase: str) -> dict[str, float]:
    """Mean and bucket-interpolated p50/p99 (ms) of one phase between two scrapes."""
    count = after.get(f"{HISTOGRAM}_count", phase=phase) - before.get(
        f"{HISTOGRAM}_count", phase=phase
    )
    total = after.get(f"{HISTOGRAM}_sum", phase=phase) - before.get(f"{HISTOGRAM}_sum", phase=phase)
    if count <= 0:
        return {"n": 0.0}
    buckets = sorted(
        (float(labels["le"]), value - before.get(f"{HISTOGRAM}_bucket", phase=phase, le=le))
        for name, labels, value in after.rows
        if name == f"{HISTOGRAM}_bucket"
        and labels.get("phase") == phase
        and (le := labels["le"]) != "+Inf"
    )
    return {
        "n": count,
        "mean": total / count * 1000,
        "p50": _quantile(buckets, count, 0.50) * 1000,
        "p99": _quantile(buckets, count, 0.99) * 1000,
    }


def _quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th sample."""
    rank, lower, below = q * count, 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, cumulative
    return lower  # in the +Inf bucket: report the largest finite bound


def throughput_plot(
    path: Path,
    series: dict[str, list[Run]],
    title: str,
    target_ms: float | None = None,
    references: dict[str, Run] | None = None,
    factor: float = 2.0,
) -> Path:
    """One panel per data size: caller p50 and p99 against achieved throughput.

    Closed loops are points named by their caller count and joined in caller order (past
    saturation more callers get less through, so the line turns back); the open loop at
    half load is a p50-p99 bar, beside the bar of its reference under the same arrivals,
    whose p99 x ``factor`` is the dotted line the RPC's half-load p99 is held to;
    ``target_ms`` is the dash-dotted absolute target. Every line is named on the plot."""
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    from bench.plotting import _save  # sets the headless backend first

    fig, axes = plt.subplots(
        1, len(series), figsize=(max(7.0, 5.6 * len(series)), 5.2), sharey=True, squeeze=False
    )
    closed_c, open_c, ref_c = "#4c72b0", "#c44e52", "#55a868"
    values = [v for runs in series.values() for r in runs for v in (_pct(r, 50), _pct(r, 99))]
    for reference in (references or {}).values():
        values += [_pct(reference, 50), factor * _pct(reference, 99)]
    if target_ms is not None:
        values.append(target_ms)
    finite = [v for v in values if np.isfinite(v) and v > 0]
    low, high = (min(finite) / 1.6, max(finite) * 1.8) if finite else (1.0, 1000.0)
    for ax, (name, runs) in zip(axes[0], series.items(), strict=True):
        closed = sorted((r for r in runs if r.mode == "closed"), key=lambda r: r.load)
        xs = [r.qps for r in closed]
        ax.plot(xs, [_pct(r, 50) for r in closed], "o-", color=closed_c, label="closed loop p50")
        ax.plot(xs, [_pct(r, 99) for r in closed], "s--", color=closed_c, label="closed loop p99")
        for r in closed:
            callers = f"{r.load:.0f} caller{'s' if r.load != 1 else ''}"
            box = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"}
            ax.annotate(callers, (r.qps, _pct(r, 99)), xytext=(7, 0), textcoords="offset points",
                        ha="left", va="center", fontsize=8, color=closed_c, bbox=box)  # fmt: skip
        bars = [(r, open_c, "memstream, open loop at half load") for r in runs if r.mode == "open"]
        ref = (references or {}).get(name)
        if ref is not None:
            bars.append((ref, ref_c, "reference, same arrivals"))
        for k, (r, color, label) in enumerate(bars):
            # Same arrivals, so about the same x: set the bars 5 points apart.
            shift = offset_copy(
                ax.transData, fig=fig, x=5 * (2 * k - len(bars) + 1), units="points"
            )
            ax.plot([r.qps] * 2, [_pct(r, 50), _pct(r, 99)], "D-", color=color, ms=7, lw=2,
                    transform=shift, label=f"{label}: p50 and p99")  # fmt: skip
        if ref is not None:
            bound = factor * _pct(ref, 99)
            ax.axhline(bound, color=ref_c, ls=":", lw=1.4,
                       label=f"{factor:g} x reference p99 = {bound:.0f} ms")  # fmt: skip
        if target_ms is not None:
            ax.axhline(target_ms, color="#222222", ls="-.", lw=1.2,
                       label=f"target: p99 at half load <= {target_ms:.0f} ms")  # fmt: skip
        # Shifted lines do not count in autoscaling: the x range spans every run by hand.
        xs = [r.qps for r in runs] + [r.qps for r, _, _ in bars]
        span = max(xs) - min(xs) or max(xs) or 1.0
        ax.set_xlim(min(xs) - 0.08 * span, max(xs) + 0.22 * span)  # room for the names
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("achieved queries/s")
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        ax.grid(True, which="both", axis="y", lw=0.3, color="#dddddd")
        ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    axes[0][0].set_ylabel("caller latency, ms (log scale)")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _pct(run: Run, q: int) -> float:
    return float(np.percentile(run.latencies_ms, q)) if run.latencies_ms else float("nan")
