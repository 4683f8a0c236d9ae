"""``memstream top``: a live terminal view of rates and latencies read from ``/metrics``.

Each frame scrapes the URL, and shows the process's roles, uptime and the frame's time; per
stage the rate of handled messages (by outcome) and latency quantiles over the last interval
(since start on the first frame); HTTP requests and errors per route; retrieval latency by
phase; consumer lag, dead letters and the sampled gauges.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    at: float  # monotonic, for rates
    values: dict[str, dict[Labels, float]] = field(default_factory=dict)

    wall: float = field(default_factory=time.time)  # for the timestamp and uptime

    def series(self, name: str) -> dict[Labels, float]:
        return self.values.get(name, {})


def scrape(url: str, timeout_s: float = 5.0) -> Scrape:
    text = httpx.get(url, timeout=timeout_s).text
    result = Scrape(time.monotonic())
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            result.values.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return result


def _delta(now: dict[Labels, float], before: dict[Labels, float] | None) -> dict[Labels, float]:
    if before is None:
        return dict(now)
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Histogram quantile from cumulative bucket counts (upper bound -> count), as PromQL."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            width = count - below
            return lower + (bound - lower) * ((rank - below) / width if width else 0.0)
        lower, below = bound, count
    return lower


def quantiles_by(
    now: Scrape, before: Scrape | None, metric: str, label: str
) -> dict[str, tuple[float, float, float]]:
    buckets: dict[str, dict[float, float]] = defaultdict(dict)
    delta = _delta(
        now.series(f"{metric}_bucket"), before.series(f"{metric}_bucket") if before else None
    )
    for labels, count in delta.items():
        d = dict(labels)
        buckets[d.get(label, "")][float(d["le"])] = count
    return {k: (quantile(0.5, b), quantile(0.95, b), quantile(0.99, b)) for k, b in buckets.items()}


def _ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def _duration(seconds: float) -> str:
    if math.isnan(seconds) or seconds < 0:
        return "—"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def heading(now: Scrape, url: str) -> str:
    """Where, which roles, how long up and when: ``memstream top — URL — roles … — up … — …``."""
    roles = sorted(dict(k).get("role", "") for k, v in now.series("memstream_role").items() if v)
    started = now.series("memstream_start_time_seconds").get(())
    if started is None:  # an older process: the client library's own process metric
        started = now.series("process_start_time_seconds").get((), math.nan)
    stamp = datetime.fromtimestamp(now.wall, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"memstream top — {url} — roles: {', '.join(roles) or '—'}"
        f" — up {_duration(now.wall - started)} — {stamp}"
    )


def http_rates(now: Scrape, before: Scrape | None) -> dict[str, tuple[float, float, float]]:
    """Per route: requests, 4xx and 5xx per second over the interval (totals on a first frame)."""
    dt = max(now.at - before.at, 1e-9) if before else None
    delta = _delta(
        now.series("memstream_http_requests_total"),
        before.series("memstream_http_requests_total") if before else None,
    )
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for labels, count in delta.items():
        d = dict(labels)
        row = rows[d.get("route", "")]
        rate = count / dt if dt else count
        row[0] += rate
        status = d.get("status", "")
        if status.startswith("4"):
            row[1] += rate
        elif status.startswith("5"):
            row[2] += rate
    return {route: (r[0], r[1], r[2]) for route, r in rows.items()}


def render(now: Scrape, before: Scrape | None, url: str) -> Group:
    dt = max(now.at - before.at, 1e-9) if before else None
    events = _delta(
        now.series("memstream_events_total"),
        before.series("memstream_events_total") if before else None,
    )
    rates: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, count in events.items():
        d = dict(labels)
        rates[d["stage"]][d["outcome"]] = count / dt if dt else count
    latency = quantiles_by(now, before, "memstream_stage_latency_seconds", "stage")
    stages = Table(title=heading(now, url), expand=True)
    unit = "/s" if dt else " (total)"
    for column in ("stage", f"ok{unit}", f"dup{unit}", f"dlq{unit}", "p50 ms", "p95 ms", "p99 ms"):
        stages.add_column(column, justify="left" if column == "stage" else "right")
    for stage in sorted(set(rates) | set(latency)):
        r = rates.get(stage, {})
        p50, p95, p99 = latency.get(stage, (math.nan,) * 3)
        stages.add_row(
            stage,
            *(f"{r.get(o, 0.0):.1f}" for o in ("ok", "duplicate", "dlq")),
            _ms(p50),
            _ms(p95),
            _ms(p99),
        )
    http = Table(title="HTTP requests", expand=True)
    for column in ("route", f"requests{unit}", f"4xx{unit}", f"5xx{unit}"):
        http.add_column(column, justify="left" if column == "route" else "right")
    for route, (total, client, server) in sorted(http_rates(now, before).items()):
        http.add_row(route, f"{total:.1f}", f"{client:.1f}", f"{server:.1f}")
    retrieval = Table(title="retrieval latency", expand=True)
    for column in ("phase", "p50 ms", "p95 ms", "p99 ms"):
        retrieval.add_column(column, justify="left" if column == "phase" else "right")
    for phase, (p50, p95, p99) in sorted(
        quantiles_by(now, before, "memstream_retrieval_latency_seconds", "phase").items()
    ):
        retrieval.add_row(phase, _ms(p50), _ms(p95), _ms(p99))
    gauges = Table(title="state", expand=True)
    gauges.add_column("what")
    gauges.add_column("value", justify="right")
    lag = sum(now.series("memstream_consumer_lag").values())
    gauges.add_row("consumer lag (messages)", f"{lag:.0f}")
    gauges.add_row("dead letters (total)", f"{sum(now.series('memstream_dlq_total').values()):.0f}")
    for name, what in (
        ("memstream_users", "users"),
        ("memstream_clusters", "clusters"),
        ("memstream_shortterm_turns", "short-term turns"),
        ("memstream_longterm_memories", "long-term memories"),
    ):
        value = now.series(name).get((), math.nan)
        gauges.add_row(what, "—" if math.isnan(value) else f"{value:.0f}")
    tables = [stages, http, retrieval, gauges] if http.row_count else [stages, retrieval, gauges]
    return Group(*tables)


def run_top(url: str, *, interval_s: float, frames: int | None, console: Console) -> int:
    """Refresh every ``interval_s``; stop after ``frames`` frames (None = until Ctrl-C)."""
    before: Scrape | None = None
    shown = 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        try:
            while frames is None or shown < frames:
                now = scrape(url)
                live.update(render(now, before, url), refresh=True)
                before, shown = now, shown + 1
                if frames is None or shown < frames:
                    time.sleep(interval_s)
        except KeyboardInterrupt:
            pass
    return 0
