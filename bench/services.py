"""The processes a benchmark measures: broker, Valkey and memstream processes, watched apart.

This module owns starting them the way an operator would (the broker and Valkey from
``stores.embedded``, memstream as a real ``memstream up`` / ``memstream worker`` subprocess
started by ``memstream.launch`` with settings pointing at them), reading a process's
Prometheus ``/metrics``, and sampling each process's CPU time and RSS. The broker and
Valkey are started here, not inside memstream, so their cost is reported apart from
memstream's own.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import psutil

from memstream import launch
from memstream.ops.replay import handled_events, unsettled_work
from memstream.roles import ROLE_SETS
from memstream.settings import DEMO_API_KEY, Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port

MIB = 1024 * 1024
TASKSET = "taskset"  # util-linux: pins a command to cores before it runs


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


class Samples(launch.Samples):
    """One scrape of a ``/metrics`` page, with the pipeline's progress counts."""

    def handled(self) -> float:
        return handled_events(self.get)

    def unsettled_work(self) -> float:
        return unsettled_work(self.get)


class Memstream(launch.Process):
    """One memstream process (``up`` or ``worker``) against the benchmark's services.

    Its settings are the bench's own (``MEMSTREAM_*`` of the shell, checked) with the
    services, a unique topic / key prefix, the port and ``overrides`` applied. ``cpus``
    pins it (every thread it will ever start) to those cores: it is started under
    ``taskset``, which sets the affinity before Python runs, so no thread escapes it.
    """

    def __init__(
        self,
        command: str,
        services: Services,
        data_dir: Path,
        *,
        prefix: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        cpus: Sequence[int] | None = None,
    ) -> None:
        roles = ROLE_SETS[command]
        # Every run starts on an empty data dir: an Edge store left by an earlier run holds
        # that run's memories, and consolidating the same log again would find nothing new
        # (no LLM calls, a faster pipeline than a fresh deployment's).
        shutil.rmtree(data_dir, ignore_errors=True)
        self.cpus = tuple(cpus) if cpus else ()
        self._scraper: httpx.Client | None = None
        self.services = services
        self.data_dir = data_dir
        self.prefix = prefix or f"b{uuid.uuid4().hex[:8]}"
        port = free_port()
        ours = {
            "data_dir": data_dir,
            "kafka": {"broker": services.broker.url, "topic_prefix": self.prefix},
            "redis": {"url": services.redis.url, "prefix": self.prefix},
            "rpc": {"port": port},
            # A worker has no API: its metrics get their own listener on the same port.
            "metrics_port": 0 if "serve" in roles else port,
            "log_level": "warning",
        }
        settings = launch.with_overrides(launch.with_overrides(Settings(), ours), overrides or {})
        log_path = data_dir / f"memstream-{command}-{port}.log"
        super().__init__(settings, roles, log_path=log_path)

    @property
    def command(self) -> list[str]:
        if not self.cpus:
            return super().command
        return [TASKSET, "--cpu-list", ",".join(map(str, self.cpus)), *super().command]

    def ready(self, timeout_s: float = 120.0, path: str = "/healthz") -> Self:
        super().ready(timeout_s, path)
        if self.cpus:  # taskset execs the process: the pid is Python's, its mask the cores
            pinned = sorted(self.ps.cpu_affinity() or [])
            if pinned != sorted(self.cpus):
                raise RuntimeError(f"{self.describe()} runs on cores {pinned}, not {self.cpus}")
        return self

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.pid)

    def scrape(self, timeout_s: float = 60.0) -> str:
        # One kept-alive client: ``httpx.get`` builds a client (and its TLS context) per
        # call, ~30 ms of this process's CPU a scrape, taken from the cores it measures.
        if self._scraper is None:
            self._scraper = httpx.Client()
        return self._scraper.get(self.metrics_url, timeout=timeout_s).text

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self._scraper is not None:
            self._scraper.close()
            self._scraper = None
        return super().stop(timeout_s)

    def metrics(self, timeout_s: float = 60.0) -> Samples:
        return Samples(self.scrape(timeout_s))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {DEMO_API_KEY}"},
            timeout=30,
        )


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
