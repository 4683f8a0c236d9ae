"""A memstream deployment made of separate processes, for faults to be injected into.

This module owns starting and stopping the pieces the way an operator runs them: the
broker and Valkey as their own processes (``stores.embedded``), and memstream's roles as
subprocesses pointed at them by environment variables:

- ``stream``: the processors (encode, memorize), the only writer of per-user Redis state;
- ``memory``: the consolidator AND the RPC, in one process because Qdrant Edge (the
  embedded long-term store) is an in-process engine that one process owns. With a Qdrant
  server they would run apart; no Qdrant server installs from a package here.

Each role process has its own data folder, so only ``memory`` ever opens the Edge shard.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from memstream.settings import hash_api_key
from stores.broker import bootstrap_servers
from stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port

ROLES = {
    "stream": ("process",),
    "memory": ("consolidate", "serve"),
    "all": ("process", "consolidate", "serve"),
}


def wait_until(
    check: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@dataclass
class RoleProcess:
    """One memstream subprocess; its /metrics answers on ``port`` (the RPC's when it serves)."""

    name: str
    env: dict[str, str]
    data_dir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def serves(self) -> bool:
        return "serve" in ROLES[self.name]

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def start(self, timeout_s: float = 120.0) -> RoleProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reliability.roles", *ROLES[self.name]],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._answers, timeout_s, f"the {self.name} process (log: {log.name})")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            tail = (self.data_dir / f"{self.name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {tail}")
        try:
            return httpx.get(self.metrics_url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no drain, no offset commit, no flush — the crash a power cut is."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self, timeout_s: float = 120.0) -> RoleProcess:
        self.restarts += 1
        return self.start(timeout_s)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` matching ``labels`` on this process's /metrics."""
        total = 0.0
        for line in httpx.get(self.metrics_url, timeout=10).text.splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, raw = head.partition("{")
            if metric != name:
                continue
            pairs = dict(p.split("=", 1) for p in raw.rstrip("}").split(",") if "=" in p)
            if all(pairs.get(k, "").strip('"') == v for k, v in labels.items()):
                total += float(value)
        return total


@dataclass
class Deployment:
    """Broker + Valkey + memstream role processes under one folder, one topic/key prefix."""

    root: Path
    persist_redis: bool = True
    api_keys: dict[str, str] = field(default_factory=dict)  # clear key -> tenant
    extra_env: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: f"r{uuid.uuid4().hex[:8]}")
    partitions: int = 4
    broker: EmbeddedBroker | None = None
    redis: EmbeddedRedis | None = None
    processes: dict[str, RoleProcess] = field(default_factory=dict)

    def start_services(self) -> Deployment:
        self.broker = EmbeddedBroker(self.root / "broker").start()
        self.redis = EmbeddedRedis(self.root / "redis", persist=self.persist_redis).start()
        return self

    def env(self, name: str, port: int) -> dict[str, str]:
        assert self.broker is not None
        assert self.redis is not None
        env = {
            **os.environ,
            "MEMSTREAM_DATA_DIR": str(self.root / name),
            "MEMSTREAM_KAFKA__BROKER": self.broker.url,
            "MEMSTREAM_KAFKA__TOPIC_PREFIX": self.prefix,
            "MEMSTREAM_KAFKA__PARTITIONS": str(self.partitions),
            "MEMSTREAM_REDIS__URL": self.redis.url,
            "MEMSTREAM_REDIS__PREFIX": self.prefix,
            "MEMSTREAM_RPC__PORT": str(port),
            "MEMSTREAM_METRICS_PORT": "0" if "serve" in ROLES[name] else str(port),
            "MEMSTREAM_METRICS_INTERVAL_S": "2",
            "MEMSTREAM_LOG_LEVEL": "warning",
            **self.extra_env,
        }
        if self.api_keys:
            keys = {hash_api_key(k): t for k, t in self.api_keys.items()}
            env["MEMSTREAM_RPC__API_KEYS"] = json.dumps(keys)
        return env

    def start(self, name: str) -> RoleProcess:
        port = free_port()
        process = RoleProcess(name, self.env(name, port), self.root / name, port)
        self.processes[name] = process
        return process.start()

    def __getitem__(self, name: str) -> RoleProcess:
        return self.processes[name]

    def topic(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def redis_client(self) -> Redis:
        assert self.redis is not None
        return Redis.from_url(self.redis.url, decode_responses=False)

    def restart_redis(self, outage_s: float = 0.0) -> None:
        """Stop Valkey (it writes its AOF on the way down), wait until it is really gone, and
        start it on the same port from the same folder."""
        assert self.redis is not None
        port = self.redis.port
        self.redis.stop()
        # stop() may return before a slow shutdown ends; a start then would see it running.
        wait_until(lambda: not _listening(port), 60, f"Valkey to leave port {port}")
        time.sleep(outage_s)
        # Safe on the same folder: Valkey runs as this object's own foreground child (no
        # pid file, no daemon), and stop() waited for it to exit.
        self.redis.start()
        wait_until(lambda: _listening(port), 60, f"Valkey back on port {port}")

    def restart_broker(self, port: int | None = None) -> None:
        """Stop the in-memory broker (it forgets every topic) and start it on the same port
        (``port``: it was stopped already, on that port)."""
        assert self.broker is not None
        if port is None:
            port = self.broker.port
            self.broker.stop()
        self.broker = EmbeddedBroker(self.root / "broker", port=port).start()

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.broker is not None:
            self.broker.stop()


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


async def read_topic(
    broker_url: str, topic: str, *, committed_only: bool = False
) -> list[tuple[bytes | None, bytes]]:
    """Every record now in ``topic`` (all partitions, from the start), as (key, value).

    ``committed_only``: what a ``read_committed`` consumer sees (Kafka only: records of
    aborted transactions left out); otherwise every record in the log, aborted or not."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(broker_url),
        enable_auto_commit=False,
        isolation_level="read_committed" if committed_only else "read_uncommitted",
    )
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        await consumer._client.add_topic(topic)  # Kafka's metadata lists only topics asked for
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[bytes | None, bytes]] = []
        remaining = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batch.items():
                out.extend((r.key, r.value) for r in records)
                if records and records[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
            if committed_only:
                # A transaction's commit marker takes the log's last offset and is never
                # returned as a record: the position, past it, says a partition is read.
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
        return out
    finally:
        await consumer.stop()
