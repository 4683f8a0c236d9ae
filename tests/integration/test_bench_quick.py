"""Smoke test of the benchmark suite: ``python -m bench --quick`` completes and writes its files.

It asserts nothing about the figures or the time taken (they depend on the machine and on
what else runs on it); only that every benchmark that exists ran, and that the report,
the raw JSON and the plots are where they should be.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core import HEADLINE_ROWS

pytestmark = pytest.mark.integration

HEADLINE_HEADER = "| figure | memstream | reference | ratio |"
REPO = Path(__file__).resolve().parents[2]


# The quick suite starts its own broker, Valkey and memstream processes; a loaded CI
# machine can take several times its nominal 3 minutes.
@pytest.mark.timeout(1200)
def test_quick_suite_writes_report_json_and_plots(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(report)],
        cwd=REPO,  # the harness is not installed: it runs from the checkout
        capture_output=True,
        text=True,
        timeout=1150,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    text = report.read_text()
    first_table_line = next(line for line in text.splitlines() if line.startswith("|"))
    assert first_table_line.startswith(HEADLINE_HEADER)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "quick"
    assert results["machine"]["cores"] >= 1
    assert results["machine"]["cpu_model"]
    assert {row["figure"] for row in results["headline"]} <= set(HEADLINE_ROWS)
    ran = {name: b for name, b in results["benchmarks"].items() if b["status"] == "ok"}
    assert "ingest" in ran
    assert "resources" in ran
    plots = [Path(plot) for bench in ran.values() for plot in bench["plots"]]
    assert plots
    assert all(plot.is_file() and plot.stat().st_size > 0 for plot in plots)
    assert {plot.parent for plot in plots} == {tmp_path / "plots"}
