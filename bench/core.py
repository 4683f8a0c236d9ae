"""What every benchmark returns, so one report can put each figure next to its reference.

A benchmark is a module in ``bench/`` with ``NAME`` and ``async def run(ctx) -> Result``.
Each headline figure is measured next to its reference *in the same run* (absolute times
drift on a shared 2-core machine; ratios do not), and the row names are the ones the
issues fix (see HEADLINE_ROWS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Row names of the headline table, in order; benchmarks fill the rows they can measure.
HEADLINE_ROWS: tuple[str, ...] = (
    "ingest events/s vs encoder",
    "encoder texts per event",
    "CPU ms per event beyond the encoder",
    "event to retrievable p95 ms",
    "scale-out events/s, 2 processes / 1",
    "retrieval p99 ms (half load, 10k/user)",
    "retrieval p99 ms (half load, 1k/user)",
    "retrieval server-side p99 ms (10k/user, 1M store)",
    "retrieval p99 ms, admitted, 64 callers (10k/user)",
    "shed answer p99 ms",
    "goodput at 64 callers / peak throughput",
    "one caller p99 ms vs mem0 (1k memories)",
    "one caller p99 ms vs mem0 (10k memories)",
    "LoCoMo-dev R@10 (source turns ranked)",
    "LoCoMo-dev evidence shown @1024 tokens",
    "LoCoMo-dev evidence shown @512 tokens",
    "LoCoMo-dev evidence shown @256 tokens",
    "LoCoMo-dev answer tokens @256 tokens",
    "LoCoMo-dev answer tokens @1024 tokens",
    *(
        f"{row}, {category}"
        for row in (
            "LoCoMo-dev R@10 (source turns ranked)",
            "LoCoMo-dev evidence shown @1024 tokens",
            "LoCoMo-dev evidence shown @512 tokens",
            "LoCoMo-dev evidence shown @256 tokens",
            "LoCoMo-dev answer tokens @256 tokens",
            "LoCoMo-dev answer tokens @1024 tokens",
        )
        for category in ("1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop")
    ),
    "LLM calls per event",
    "consolidator input tokens (recurrence vs eager, LoCoMo-dev)",
    "evidence shown @1024, recurrence vs eager consolidation",
    "memories on vs off, evidence shown @256",
    "LoCoMo-dev contexts @256 holding a memory",
    "cluster ARI (synthetic)",
    "clustering ms/event @500 clusters",
    "peak RSS MiB (100k memories)",
    "worst per-turn CPU ms at the size limit",
    "consolidation CPU ms, 40 turns x 8,000 chars",
    "CS current value first",
    "CS order status current first",
    "CS stale value first",
    "CS promises owed shown open",
    "CS promises kept shown open",
    "CS one-off fact recall",
    "CS small-talk share of context lines",
)


@dataclass(frozen=True)
class Row:
    """One headline figure: memstream's value, the reference's, and what each one is."""

    figure: str  # one of HEADLINE_ROWS
    memstream: float
    reference: float
    reference_name: str  # e.g. "bare encoder, same texts", "BM25 over speaker (date): text"
    higher_is_better: bool = True
    target: str = ""  # e.g. ">= 0.8", "<= 20 ms"; empty when the issue sets none

    @property
    def ratio(self) -> float:
        return self.memstream / self.reference if self.reference else float("nan")


@dataclass
class Result:
    name: str
    rows: list[Row] = field(default_factory=list)
    markdown: str = ""  # the benchmark's own section: tables, the reading of what limits it
    raw: dict[str, Any] = field(default_factory=dict)  # every number, JSON-serialisable
    plots: list[Path] = field(default_factory=list)  # PNGs under ctx.out_dir


@dataclass(frozen=True)
class Context:
    quick: bool  # CI smoke mode: small N, finishes in seconds, same code path
    out_dir: Path  # where plots and raw JSON go (bench/out/ or a temp dir in tests)
    shared_bench: Path  # ../shared/bench (LoCoMo); benchmarks needing it skip when absent
    seed: int = 7
