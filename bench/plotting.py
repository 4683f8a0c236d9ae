"""The few chart shapes the benchmarks draw, as PNGs (matplotlib, headless).

This module owns how a figure looks: a latency distribution (histogram and CDF, with its
percentiles and references marked), a bar chart of rates or costs, and a time series
(RSS over a run, with its phases marked). Each function writes one file and returns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: benchmarks run on servers and in CI

import matplotlib.pyplot as plt
import numpy as np

DPI = 110


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def latency_chart(
    path: Path, values_ms: Sequence[float], title: str, refs: dict[str, float] | None = None
) -> Path:
    """Histogram (left axis) and CDF (right axis) of latencies; p50/p95/p99 and refs marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    data = np.asarray(values_ms, dtype=float)
    if data.size:
        ax.hist(data, bins=min(60, max(10, data.size // 10)), color="#4c72b0", alpha=0.75)
        cdf = ax.twinx()
        ordered = np.sort(data)
        cdf.plot(ordered, np.arange(1, data.size + 1) / data.size, color="#222222", lw=1.2)
        cdf.set_ylim(0, 1.02)
        cdf.set_ylabel("CDF")
        for q, style in ((50, ":"), (95, "--"), (99, "-.")):
            x = float(np.percentile(data, q))
            ax.axvline(x, color="#c44e52", ls=style, lw=1.2, label=f"p{q} {x:.0f} ms")
    colors = ("#55a868", "#8172b2", "#937860")
    for (name, x), color in zip((refs or {}).items(), colors, strict=False):
        ax.axvline(x, color=color, lw=1.5, label=f"{name} {x:.0f} ms")
    ax.set_xlabel("ms")
    ax.set_ylabel("events")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    return _save(fig, path)


def bar_chart(path: Path, values: dict[str, float], ylabel: str, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    names = list(values)
    bars = ax.bar(range(len(names)), [values[n] for n in names], color="#4c72b0")
    bars[0].set_color("#55a868")  # the first bar is the reference
    for bar in bars:
        h = bar.get_height()
        ax.annotate(f"{h:,.1f}", (bar.get_x() + bar.get_width() / 2, h), ha="center", va="bottom")
    ax.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
    ax.set_ylim(0, 1.15 * max([values[n] for n in names] + [1e-9]))  # room for the labels
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def series_chart(
    path: Path,
    series: dict[str, Sequence[tuple[float, float]]],
    ylabel: str,
    marks: Sequence[tuple[float, str]] = (),
    limit: tuple[float, str] | None = None,
) -> Path:
    """Lines over time (seconds), phases as labelled vertical lines, a limit as a dashed one."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=name, lw=1.3)
    top = ax.get_ylim()[1]
    for x, label in marks:
        ax.axvline(x, color="#999999", lw=0.8, ls=":")
        ax.text(x, top, label, rotation=90, va="top", ha="right", fontsize=7, color="#555555")
    if limit is not None:
        ax.axhline(limit[0], color="#c44e52", ls="--", lw=1, label=limit[1])
    ax.set_xlabel("seconds")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def scaleout_chart(path: Path, runs: Sequence[dict[str, Any]], target: float, title: str) -> Path:
    """Events/s of each scale-out run, one bar per run split by process (each labelled with
    its pinned core), against one process times ``target`` and times the process count."""
    fig, ax = plt.subplots(figsize=(7.5, 4))
    colors = ("#4c72b0", "#55a868", "#8172b2", "#937860")
    for x, run in enumerate(runs):
        total = max(sum(run["per_worker"]), 1.0)
        bottom = 0.0
        for k, (handled, cores) in enumerate(zip(run["per_worker"], run["cores"], strict=True)):
            share = run["events_per_s"] * handled / total
            label = f"process on core {','.join(map(str, cores))}"
            ax.bar(x, share, bottom=bottom, color=colors[k % len(colors)], label=label)
            bottom += share
        times = f" = {bottom / runs[0]['events_per_s']:.2f}× one" if x else ""
        ax.annotate(f"{bottom:,.0f}/s{times}", (x, bottom), ha="center", va="bottom")
    names = [
        f"{r['workers']} process{'es' if r['workers'] > 1 else ''}, "
        f"core{'s' if len(r['cores']) > 1 else ''} "
        f"{' + '.join(','.join(map(str, c)) for c in r['cores'])}"
        for r in runs
    ]
    ax.set_xticks(range(len(runs)), names, fontsize=8)
    if runs:
        one = runs[0]["events_per_s"]
        most = max(r["workers"] for r in runs)
        ax.axhline(target * one, color="#c44e52", ls="--", lw=1, label=f"target {target}× one")
        ax.axhline(most * one, color="#999999", ls=":", lw=1, label=f"{most}× one (linear)")
        ax.set_ylim(0, 1.2 * max([most * one] + [r["events_per_s"] for r in runs]))
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry per core, not per bar
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left")
    ax.set_ylabel("events per second (to memorized)")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)
