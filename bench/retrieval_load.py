"""Load on a running retrieval RPC: open-loop (Poisson) and closed-loop callers over loopback.

This module owns driving ``POST /v1/retrieve`` with an ``httpx`` async client and what a
run measures: the caller's latency (open loop: from the request's scheduled arrival, so
a late start counts against the server, not for it), the server's own ``took_ms``, and
the server's phase times (encode, fetch, rank, total) from the
``memstream_retrieval_latency_seconds`` histogram, scraped before and after the run.
Every run is bounded in time and in requests and stops by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.retrieval_data import summary
from bench.services import Memstream, Samples
from memstream.settings import DEMO_API_KEY

HISTOGRAM = "memstream_retrieval_latency_seconds"
PHASES = ("encode", "fetch", "rank", "total")
MAX_IN_FLIGHT = 2000  # an open loop past saturation queues; this bounds how far


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
    errors: int = 0
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

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
            "latency": summary(self.latencies_ms),
            "took": summary(self.took_ms),
            "phases": self.phases,
        }


class Driver:
    """Sends retrieval requests for one user with fresh (uncached) or replayed queries."""

    def __init__(self, server: RetrievalServer, user: str, texts: Iterator[str]) -> None:
        self.server = server
        self.user = user
        self.texts = texts

    async def __aenter__(self) -> Driver:
        self.client = httpx.AsyncClient(
            base_url=self.server.url,
            headers={"Authorization": f"Bearer {DEMO_API_KEY}"},
            timeout=30,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def one(self, run: Run, text: str, since: float) -> None:
        body = {"user_id": self.user, "query": text, "top_k": 8, "budget_tokens": 512}
        try:
            response = await self.client.post("/v1/retrieve", json=body)
            response.raise_for_status()
            took = float(response.json()["took_ms"])
        except (httpx.HTTPError, KeyError, ValueError):
            run.errors += 1
            return
        run.latencies_ms.append((time.perf_counter() - since) * 1000)
        run.took_ms.append(took)

    async def open_loop(self, label: str, rate: float, seconds: float, seed: int) -> Run:
        """Poisson arrivals at `rate`/s for `seconds` (at most rate x seconds x 1.5)."""
        run = Run(label, "open", rate)
        rng = np.random.default_rng(seed)
        tasks: set[asyncio.Task[None]] = set()
        limit = int(rate * seconds * 1.5) + 1
        with self._phases(run):
            start = time.perf_counter()
            at = 0.0
            for _ in range(limit):
                at += float(rng.exponential(1.0 / rate))
                if at > seconds:
                    break
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                if len(tasks) >= MAX_IN_FLIGHT:
                    run.errors += 1  # shed: the server is far past saturation
                    continue
                task = asyncio.create_task(self.one(run, next(self.texts), start + at))
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
                await self.one(run, text, time.perf_counter())

        with self._phases(run):
            start = time.perf_counter()
            await asyncio.gather(*(caller(start + seconds) for _ in range(callers)))
            run.seconds = time.perf_counter() - start
        return run

    def _phases(self, run: Run) -> _PhaseDelta:
        return _PhaseDelta(self.server, run)


class _PhaseDelta:
    """Scrapes the phase histogram around a run and stores per-phase stats on it."""

    def __init__(self, server: RetrievalServer, run: Run) -> None:
        self.server = server
        self.run = run

    def __enter__(self) -> None:
        self.before = self.server.metrics()

    def __exit__(self, *exc: object) -> None:
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
    refs_ms: dict[str, float] | None = None,
) -> Path:
    """Caller p50 and p99 against achieved throughput: closed loops joined by caller count,
    open-loop runs as separate markers; one colour per data size. ``target_ms`` is drawn
    as the p99 target, ``refs_ms`` (by data size) as dotted lines in that size's colour."""
    import matplotlib.pyplot as plt

    from bench.plotting import _save  # sets the headless backend first

    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    colors = ("#4c72b0", "#c44e52", "#55a868")
    for (name, runs), color in zip(series.items(), colors, strict=False):
        closed = sorted((r for r in runs if r.mode == "closed"), key=lambda r: r.load)
        for q, style in ((50, "o-"), (99, "s--")):
            ax.plot([r.qps for r in closed], [_pct(r, q) for r in closed], style, color=color,
                    label=f"{name} closed loop p{q}")  # fmt: skip
        for r in runs:
            if r.mode == "open":
                ax.plot([r.qps] * 2, [_pct(r, 50), _pct(r, 99)], "D:", color=color, ms=7,
                        label=f"{name} open loop p50 / p99")  # fmt: skip
            # Each run named once, at its p99 point, offset and boxed so lines stay legible.
            ax.annotate(
                r.label.replace(", half load", " (half load)"),
                (r.qps, _pct(r, 99)),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=7,
                color=color,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color, "lw": 0.5},
            )
        ref = (refs_ms or {}).get(name)
        if ref is not None:
            ax.axhline(
                ref, color=color, ls=":", lw=1, label=f"{name} reference p99 x 2 ({ref:.0f} ms)"
            )
    if target_ms is not None:
        ax.axhline(target_ms, color="#222222", ls="-.", lw=1.2,
                   label=f"target: p99 at half load <= {target_ms:.0f} ms")  # fmt: skip
    ax.set_xlabel("achieved queries/s")
    ax.set_ylabel("caller latency, ms (log scale)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", axis="y", lw=0.3, color="#cccccc")
    # Outside the axes: inside, the legend hid the 64-caller points.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def _pct(run: Run, q: int) -> float:
    return float(np.percentile(run.latencies_ms, q)) if run.latencies_ms else float("nan")
