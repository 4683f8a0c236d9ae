"""The Makefile's cluster targets check their tools before they start anything: a machine
without redis-server gets one line, not three Kafka JVMs left running."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> subprocess.CompletedProcess[str]:
    # -o: never rebuild the venv here, whatever its stamp's age.
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_tool_is_named_in_one_line() -> None:
    done = make("-s", "cluster-tools", "CLUSTER_TOOLS=sh no-such-tool-xyz")
    assert done.returncode != 0
    assert done.stdout.strip().splitlines() == [
        "the clusters need: no-such-tool-xyz (Debian: apt-get install openjdk-17-jre-headless "
        "maven redis-server redis-tools)"
    ]


@pytest.mark.parametrize("target", ["cluster-test", "cluster-up"])
def test_the_clusters_start_only_once_their_tools_are_there(target: str) -> None:
    done = make(target, "CLUSTER_TOOLS=no-such-tool-xyz")
    assert done.returncode != 0
    assert "no-such-tool-xyz" in done.stdout
    assert "cluster.sh" not in done.stdout + done.stderr  # nothing was started (or wiped)
