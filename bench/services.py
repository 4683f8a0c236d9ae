"""The processes a benchmark measures: broker, Valkey and memstream processes, watched apart.

This module owns starting them the way an operator would (the broker and Valkey from
``stores.embedded``, memstream as a real ``memstream up`` / ``memstream worker`` subprocess
pointed at them by environment variables), reading a process's Prometheus ``/metrics``,
and sampling each process's CPU time and RSS. The broker and Valkey are started here, not
inside memstream, so their cost is reported apart from memstream's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from memstream.replay import handled_events, unsettled_work
from memstream.settings import DEMO_API_KEY
from stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port

MIB = 1024 * 1024


def listening_process(port: int) -> psutil.Process:
    """The process listening on 127.0.0.1:``port`` (the embedded services do not expose it)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise RuntimeError(f"no process listens on port {port}")


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def busy_since(start: Any) -> float:
    """Share of the whole machine's CPU (anyone's) in use since ``psutil.cpu_times()`` was
    ``start``: on a shared machine, what else ran beside the benchmark."""
    now = psutil.cpu_times()
    total = sum(now) - sum(start)
    idle = now.idle - start.idle + getattr(now, "iowait", 0.0) - getattr(start, "iowait", 0.0)
    return float(1 - idle / total) if total > 0 else float("nan")


@dataclass
class Services:
    """A broker and a Valkey for one benchmark, each its own process."""

    broker: EmbeddedBroker
    redis: EmbeddedRedis
    broker_proc: psutil.Process
    redis_proc: psutil.Process


@contextmanager
def services(root: Path) -> Iterator[Services]:
    broker = EmbeddedBroker(root / "broker").start()
    redis: EmbeddedRedis | None = None
    try:
        # No persistence: an AOF fsync every second would bill the disk to the benchmark.
        redis = EmbeddedRedis(root / "redis", persist=False).start()
        yield Services(broker, redis, listening_process(broker.port), listening_process(redis.port))
    finally:
        if redis is not None:
            redis.stop()
        broker.stop()


class Samples:
    """One scrape of a ``/metrics`` page: sums of the samples that match some labels."""

    def __init__(self, text: str) -> None:
        # A plain line parser: the full prometheus parser costs the driver ~20 ms a scrape,
        # CPU taken from the process being measured on a 2-core machine.
        self.rows: list[tuple[str, dict[str, str], float]] = []
        for line in text.splitlines():
            if not line.startswith("memstream_"):
                continue
            head, _, value = line.rpartition(" ")
            name, _, labels = head.partition("{")
            pairs = (p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
            self.rows.append((name, {k: v.strip('"') for k, v in pairs}, float(value)))

    def get(self, name: str, **labels: str) -> float:
        wanted = labels.items()
        return sum(
            v for n, lab, v in self.rows if n == name and all(lab.get(k) == x for k, x in wanted)
        )

    def handled(self) -> float:
        return handled_events(self.get)

    def unsettled_work(self) -> float:
        return unsettled_work(self.get)


@dataclass
class Memstream:
    """One memstream process (``up`` or ``worker``) against the benchmark's services."""

    command: str
    services: Services
    data_dir: Path
    prefix: str = field(default_factory=lambda: f"b{uuid.uuid4().hex[:8]}")
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def ps(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MEMSTREAM_DATA_DIR": str(self.data_dir),
            "MEMSTREAM_KAFKA__BROKER": self.services.broker.url,
            "MEMSTREAM_KAFKA__TOPIC_PREFIX": self.prefix,
            "MEMSTREAM_REDIS__URL": self.services.redis.url,
            "MEMSTREAM_REDIS__PREFIX": self.prefix,
            "MEMSTREAM_RPC__PORT": str(self.port),
            # A worker has no API: its metrics get their own listener on the same port.
            "MEMSTREAM_METRICS_PORT": str(self.port if self.command == "worker" else 0),
            "MEMSTREAM_LOG_LEVEL": "warning",
            **self.extra_env,
        }

    def start(self, timeout_s: float = 120.0) -> Memstream:
        return self.spawn().wait_ready(timeout_s)

    def spawn(self) -> Memstream:
        """Start the process without waiting (so a sampler can watch its start-up too)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / f"memstream-{self.command}-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", self.command],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> Memstream:
        wait_until(self._answers, timeout_s, f"memstream {self.command} to answer")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"memstream {self.command} exited {self.proc.returncode}")
        try:
            return httpx.get(self.metrics_url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> Samples:
        # Generous: a process busy with a replay on two shared cores can take seconds.
        return Samples(httpx.get(self.metrics_url, timeout=60).text)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {DEMO_API_KEY}"},
            timeout=30,
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1
) -> float:
    """Poll ``check`` until true; returns the monotonic time it first was. Raises on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def rss_breakdown(proc: psutil.Process, data_dir: Path) -> dict[str, float]:
    """Where a process's resident memory is, MiB: its own heap, the data files it maps
    (Qdrant Edge maps its segments; the kernel can drop those pages under pressure), and
    the libraries and other files it maps."""
    groups = {"heap and other anonymous memory": 0.0, "mapped data files": 0.0, "libraries": 0.0}
    for region in proc.memory_maps(grouped=True):
        if region.path.startswith(str(data_dir)):
            groups["mapped data files"] += region.rss / MIB
        elif region.path.startswith("/"):
            groups["libraries"] += region.rss / MIB
        else:  # [heap], [stack], [anon:...] and unnamed mappings
            groups["heap and other anonymous memory"] += region.rss / MIB
    return groups


class RssSampler:
    """Samples the RSS of named processes every ``interval_s`` in a thread; keeps the peaks."""

    def __init__(self, procs: dict[str, psutil.Process], interval_s: float = 0.2) -> None:
        self.procs = procs
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.series: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
        self.peak_mib: dict[str, float] = dict.fromkeys(procs, 0.0)
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def mark(self, label: str) -> None:
        self.marks.append((time.monotonic() - self.t0, label))

    def sample(self) -> None:
        now = time.monotonic() - self.t0
        for name, proc in self.procs.items():
            try:
                rss = proc.memory_info().rss / MIB
            except psutil.Error:  # the process ended: keep what was seen
                continue
            self.series[name].append((now, rss))
            self.peak_mib[name] = max(self.peak_mib[name], rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
