"""``python -m reliability [--quick] [--only NAME]... [--out RELIABILITY.md]``.

Runs the fault families one after another (they share the machine's two cores: running
them at once would measure contention, not faults), prints the table, writes the markdown,
and exits 1 when a promised zero is not zero (or a family could not run at all).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import platform
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from reliability.core import Context, Row, markdown, table
from reliability.shared import close_all

# adversarial last: the backlog its attacker leaves behind must not slow another row.
FAMILIES = (
    "bad_input",
    "poison",
    "isolation",
    "fuzz",
    "load",
    "burst",
    "crashes",
    "intake",
    "outages",
    "adversarial",
)
# Needs the real clusters of deploy/ (make cluster-up; java, maven, redis-server): only with
# --only, as ``make cluster-test`` runs it.
ON_CLUSTERS = ("cluster_faults",)

HEADER = """# memstream reliability

`make reliability` (`python -m reliability`) injects faults into a real memstream made of
separate processes — the processors (encode, memorize) in one, the consolidator and the RPC
in another (they share it because Qdrant Edge, the embedded long-term store, is an
in-process engine one process owns) — against a Tansu broker and a Valkey server that run
as their own processes. Every count below is read back from the stores themselves (Redis
timelines and `trig:` markers, the Edge shard, the topics), not from the processes'
own counters. Zeros are promised in every lost / duplicated / errors cell that is filled;
a dash is a column that does not apply.

How to read it. *Lost* is what was sent and is not where it belongs (a turn missing from
short-term memory, a trigger emitted and never consolidated, a memory a trigger asked for
and missing, a bad message neither dead-lettered nor answered 4xx); *duplicated* is
anything stored twice or stored without a trigger asking for it; *errors* are 5xx
answers, crashes, blocked partitions, checks that did not settle, and an outage the
metrics did not show. The outages row also compares with an undisturbed run of the same
file; that comparison is reported, not promised, because two undisturbed runs can already
differ by a trigger key or two (see its note). p99 is the client-side latency of the
RPC calls of that row, measured on the same two cores the service runs on. A fault in a
stream row fires at a share of that stream's turns stored, never at a second
(`reliability/progress.py`): the row's label gives the shares it actually ran between, and
the table under this one the turn counts each fault began and ended at. Every fault
is real (SIGKILL, SIGSTOP, a Valkey or broker process stopped and started) except one:
no Qdrant server installs here, so "Qdrant does not answer" is a switch in the suite's
process launcher (`reliability/roles.py`) that fails every long-term call the way
qdrant-client fails against a dead server; the consolidator's retry path and its
`memstream_retries_total` are the real ones."""


def kept_sections(out: Path) -> str:
    """The ``## `` sections of ``out`` as it was (the cluster rows of ``make cluster-test``,
    written apart): a run of this table does not erase another's."""
    if not out.exists():
        return ""
    text = out.read_text()
    at = text.find("\n## ")
    return "" if at < 0 else "\n" + text[at:].lstrip("\n")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke sizes (seconds, not minutes)")
    parser.add_argument(
        "--only", action="append", choices=FAMILIES + ON_CLUSTERS, help="run only this family"
    )
    parser.add_argument("--out", type=Path, default=None, help="markdown path (default: none)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    return parser.parse_args(argv)


async def run_all(ctx: Context, names: list[str]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        module = importlib.import_module(f"reliability.{name}")
        began = time.monotonic()
        ctx.console.rule(f"{name}")
        try:
            found = await module.run(ctx)
        except Exception as exc:  # a family that cannot run is a failure, not a crash
            traceback.print_exc()
            found = [Row(f"{name}: could not run", 0, errors=1, note=repr(exc)[:300])]
        for row in found:
            ctx.say(f"{row.fault}: {'ok' if row.ok else 'FAIL'} — {row.note[:300]}")
        ctx.say(f"{name} took {time.monotonic() - began:.0f} s")
        rows.extend(found)
    return rows


def main(argv: list[str]) -> int:
    args = parse(argv)
    names = list(args.only or FAMILIES)
    root = Path(tempfile.mkdtemp(prefix="memstream-reliability-"))
    ctx = Context(root=root, quick=args.quick)
    began = time.monotonic()
    try:
        rows = asyncio.run(run_all(ctx, names))
    finally:
        close_all(ctx)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    minutes = (time.monotonic() - began) / 60
    ctx.console.print(table(rows))
    failed = [row for row in rows if not row.ok]
    footer = (
        f"{'Quick' if args.quick else 'Full'} run, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {minutes:.1f} min on "
        f"{platform.machine()} ({len(names)} families), "
        f"{'all promised zeros hold' if not failed else f'{len(failed)} rows FAIL'}."
    )
    if args.out is not None:
        args.out.write_text(markdown(rows, header=HEADER, footer=footer) + kept_sections(args.out))
        ctx.console.print(f"wrote {args.out}")
    ctx.console.print(footer)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
