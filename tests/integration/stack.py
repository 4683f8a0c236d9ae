"""A ``memstream up`` on its own embedded broker, Valkey and Qdrant Edge, as ``make run`` starts
it: in a session of its own, so a test can Ctrl-C it the way a terminal does (SIGINT to the
whole foreground process group)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from memstream.launch import Process, child_pids, defaults
from memstream.roles import ALL_ROLES

ROOT = Path(__file__).resolve().parents[2]


class Stack(Process):
    """Default settings but the folder and the port (none of the caller's ``MEMSTREAM_*``):
    empty broker / Redis URLs start the embedded ones."""

    def __init__(self, data_dir: Path, port: int, log_path: Path, args: Sequence[str] = ()) -> None:
        settings = defaults({"data_dir": data_dir, "rpc": {"port": port}})
        super().__init__(
            settings,
            ALL_ROLES,
            log_path=log_path,
            args=args,
            env={"COLUMNS": "200"},  # the banner's curl on one line
            cwd=ROOT,
            new_session=True,
        )

    def wait_ready(self, timeout_s: float = 150.0) -> None:
        self.ready(timeout_s, "/readyz")

    def children(self) -> list[int]:
        """Pids of the processes this stack started (the broker and Valkey)."""
        return child_pids(self.pid)

    def ctrl_c(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGINT to the process group, as a terminal's Ctrl-C; (exit code, seconds)."""
        started = time.monotonic()
        self.signal_group(signal.SIGINT)
        try:
            code: int | None = self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - started


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
