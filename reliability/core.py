"""What every fault family reports, and the table the runner prints and writes.

A fault family is a module with ``NAME`` and ``async def run(ctx) -> list[Row]``. A row
names the fault, how much was sent at the system, and what came out wrong: lost,
duplicated, errors (server errors, crashes, events that blocked). ``promised`` lists the
columns that must be zero; any that is not fails the run. A row that injects faults into a
stream carries their spans: the turn counts each began and ended at (reliability/progress.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reliability.progress import Span

ZERO_COLUMNS = ("lost", "duplicated", "errors")


@dataclass(frozen=True)
class Row:
    fault: str
    sent: int
    lost: int | None = None
    duplicated: int | None = None
    errors: int | None = None
    p99_ms: float | None = None
    promised: tuple[str, ...] = ZERO_COLUMNS
    note: str = ""
    spans: tuple[Span, ...] = ()  # the faults as they ran: turns stored at begin and end

    @property
    def broken(self) -> list[str]:
        """The promised-zero columns that are not zero (a column not measured is broken too)."""
        return [c for c in self.promised if getattr(self, c) != 0]

    @property
    def ok(self) -> bool:
        return not self.broken


@dataclass
class Context:
    root: Path  # scratch space for this run: services, data, logs
    quick: bool  # the smoke sizes (pytest), not the full suite
    console: Console = field(default_factory=Console)
    shared: dict[str, object] = field(default_factory=dict)  # what families share (one deployment)
    on_exit: list[Callable[[], None]] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/]")


def _cell(value: int | float | None, promised: bool) -> str:
    if value is None:
        return "—" if not promised else "not measured"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def table(rows: list[Row]) -> Table:
    out = Table(title="memstream reliability", show_lines=False)
    for name, justify in (
        ("fault", "left"),
        ("events sent", "right"),
        ("lost", "right"),
        ("duplicated", "right"),
        ("errors", "right"),
        ("p99 ms", "right"),
        ("", "left"),
    ):
        out.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        out.add_row(
            row.fault,
            str(row.sent),
            *(_cell(getattr(row, c), c in row.promised) for c in ZERO_COLUMNS),
            _cell(row.p99_ms, False),
            "[green]ok[/]" if row.ok else f"[bold red]FAIL {', '.join(row.broken)}[/]",
        )
    return out


def markdown(rows: list[Row], *, header: str, footer: str) -> str:
    lines = [
        header,
        "",
        "| fault | events sent | lost | duplicated | errors | p99 ms | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        cells = [_cell(getattr(row, c), c in row.promised) for c in ZERO_COLUMNS]
        verdict = "ok" if row.ok else "**FAIL** " + ", ".join(row.broken)
        lines.append(
            f"| {row.fault} | {row.sent} | {' | '.join(cells)} | "
            f"{_cell(row.p99_ms, False)} | {verdict} |"
        )
    windows = [(i, span) for i, row in enumerate(rows, 1) for span in row.spans]
    if windows:
        lines += [
            "",
            "When each fault ran, in turns stored of the row's stream (row = its line above):",
            "",
            "| row | fault | began at (turns stored) | over at (turns stored) | of | seconds |",
            "| ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for i, span in windows:
            over = "—" if span.ended_at is None else str(span.ended_at)
            took = "—" if span.seconds is None else f"{span.seconds:.1f}"
            lines.append(
                f"| {i} | {span.what} | {span.started_at} | {over} | {span.total} | {took} |"
            )
    notes = [f"- **{row.fault}**: {row.note}" for row in rows if row.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join([*lines, "", footer, ""])
