"""A ``memstream up`` on its own embedded broker, Valkey and Qdrant Edge, as ``make run`` starts
it: in a session of its own, so a test can Ctrl-C it the way a terminal does (SIGINT to the
whole foreground process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration.process import wait_for

ROOT = Path(__file__).resolve().parents[2]


def clean_env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    """No MEMSTREAM_* of the caller's: empty broker / Redis URLs start the embedded ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    return {
        **env,
        "MEMSTREAM_DATA_DIR": str(data_dir),
        "MEMSTREAM_RPC__PORT": str(port),
        "COLUMNS": "200",
        **extra,
    }


@dataclass
class Stack:
    data_dir: Path
    port: int
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Stack:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "up", *self.args],
            cwd=ROOT,
            env=clean_env(self.data_dir, self.port, **self.env),
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float = 150.0) -> None:
        wait_for(self._ready, timeout_s, f"memstream up (log: {self.log_path})")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"memstream exited {self.proc.returncode}: {self.output()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """Pids of the processes this stack started (the broker and Valkey)."""
        assert self.proc is not None
        return child_pids(self.proc.pid)

    def ctrl_c(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGINT to the process group, as a terminal's Ctrl-C; (exit code, seconds)."""
        assert self.proc is not None
        started = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code: int | None = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - started

    def kill(self) -> None:
        """Everything of ours, whatever state it is in (teardown)."""
        if self.proc is not None and self.proc.poll() is None:
            pids = self.children()
            self.proc.kill()
            self.proc.wait()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def child_pids(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
