"""The TypeScript client (``clients/typescript``) against a real ``memstream up``.

``npm ci``, then the package's own checks: ``build`` (tsc, strict), ``check-types`` (the
types generated from ``docs/openapi.json`` have not drifted), ``lint`` (prettier) and
``test`` (node's test runner: the retry rules against a local server, then add / retrieve /
memories / forget against this one, through ``MEMSTREAM_URL`` and ``MEMSTREAM_API_KEY``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memstream.settings import DEMO_API_KEY
from tests.integration.process import MemstreamProcess

MISSING = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"{' and '.join(MISSING)} not on PATH: the TypeScript client is not tested",
    ),
]

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"
SKIPPED = "MEMSTREAM_URL is not set"  # what the server suite says when it is skipped


def npm(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> str:
    """``npm <args>`` in the package; its output, or a failure that shows it."""
    done = subprocess.run(
        ["npm", *args],
        cwd=PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"npm {' '.join(args)} exited {done.returncode}:\n{output}"
    return output


def test_the_typescript_client_builds_matches_the_openapi_and_passes_against_a_server(
    running: MemstreamProcess,
) -> None:
    npm("ci", "--no-audit", "--no-fund", timeout_s=120)
    npm("run", "build")
    npm("run", "check-types")
    npm("run", "lint")
    env = {**os.environ, "MEMSTREAM_URL": running.url, "MEMSTREAM_API_KEY": DEMO_API_KEY}
    output = npm("test", env=env, timeout_s=120)
    # The summary of node's test runner (TAP "# pass 11", spec "ℹ pass 11").
    counts = {k: int(v) for k, v in re.findall(r"^\S+ (pass|fail) (\d+)$", output, re.M)}
    assert counts.get("fail") == 0, output
    assert counts.get("pass", 0) > 0, output
    assert SKIPPED not in output, output  # the server suite ran
