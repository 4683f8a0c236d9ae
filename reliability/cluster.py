"""A memstream deployment made of separate processes, for faults to be injected into.

This module owns starting and stopping the pieces the way an operator runs them: the
broker and Valkey as their own processes (``stores.embedded``), and memstream's roles as
processes of ``memstream.launch`` (through ``reliability.roles``, for its Qdrant outage
switch) with settings pointing at them:

- ``stream``: the processors (encode, memorize), the only writer of per-user Redis state;
- ``memory``: the consolidator AND the RPC, in one process because Qdrant Edge (the
  embedded long-term store) is an in-process engine that one process owns. With a Qdrant
  server they would run apart; no Qdrant server installs from a package here.

Each role process has its own data folder, so only ``memory`` ever opens the Edge shard.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from memstream.launch import Process, wait_for, with_overrides
from memstream.roles import ALL_ROLES, Role
from memstream.settings import Settings, hash_api_key
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from memstream.streaming.broker import bootstrap_servers
from reliability.roles import ENTRY, QDRANT_DOWN_ENV

ROLES: dict[str, frozenset[Role]] = {
    "stream": frozenset({"process"}),
    "memory": frozenset({"consolidate", "serve"}),
    "all": ALL_ROLES,
}


class RoleProcess(Process):
    """One memstream process of the deployment, by its name in ``ROLES``; its ``/metrics``
    answer on ``port`` (the RPC's when it serves)."""

    def __init__(self, name: str, settings: Settings, env: dict[str, str]) -> None:
        super().__init__(
            settings,
            ROLES[name],
            log_path=settings.data_dir / f"{name}.log",
            env=env,
            entry=ENTRY,
        )
        self.name = name
        self.restarts = 0

    @property
    def serves(self) -> bool:
        return "serve" in self.roles

    def restart(self, timeout_s: float = 120.0) -> RoleProcess:
        self.restarts += 1
        return self.start(timeout_s)

    def pause(self) -> None:
        self.send(signal.SIGSTOP)

    def resume(self) -> None:
        self.send(signal.SIGCONT)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` matching ``labels`` on this process's /metrics."""
        return self.metrics(timeout_s=10).get(name, **labels)


@dataclass
class Deployment:
    """Broker + Valkey + memstream role processes under one folder, one topic/key prefix."""

    root: Path
    persist_redis: bool = True
    api_keys: dict[str, str] = field(default_factory=dict)  # clear key -> tenant
    overrides: dict[str, Any] = field(default_factory=dict)  # settings of every process
    qdrant_down_file: Path | None = None  # the outage switch (reliability.roles)
    prefix: str = field(default_factory=lambda: f"r{uuid.uuid4().hex[:8]}")
    partitions: int = 4
    broker: EmbeddedBroker | None = None
    redis: EmbeddedRedis | None = None
    processes: dict[str, RoleProcess] = field(default_factory=dict)

    def start_services(self) -> Deployment:
        self.broker = EmbeddedBroker(self.root / "broker").start()
        self.redis = EmbeddedRedis(self.root / "redis", persist=self.persist_redis).start()
        return self

    def settings(self, name: str, port: int) -> Settings:
        """The settings of role process ``name``: the suite's own (``MEMSTREAM_*`` of the
        shell, checked), the services, the prefix, the port, then ``overrides``."""
        assert self.broker is not None
        assert self.redis is not None
        serves = "serve" in ROLES[name]
        ours: dict[str, Any] = {
            "data_dir": self.root / name,
            "kafka": {
                "broker": self.broker.url,
                "topic_prefix": self.prefix,
                "partitions": self.partitions,
            },
            "redis": {"url": self.redis.url, "prefix": self.prefix},
            "rpc": {"port": port},
            "metrics_port": 0 if serves else port,
            "metrics_interval_s": 2.0,
            "log_level": "warning",
        }
        keys = {"rpc": {"api_keys": {hash_api_key(k): t for k, t in self.api_keys.items()}}}
        return with_overrides(Settings(), ours, self.overrides, keys if self.api_keys else {})

    def start(self, name: str) -> RoleProcess:
        down = self.qdrant_down_file
        env = {QDRANT_DOWN_ENV: str(down)} if down is not None else {}
        process = RoleProcess(name, self.settings(name, free_port()), env)
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
        wait_for(lambda: not _listening(port), 60, f"Valkey to leave port {port}")
        time.sleep(outage_s)
        # Safe on the same folder: Valkey runs as this object's own foreground child (no
        # pid file, no daemon), and stop() waited for it to exit.
        self.redis.start()
        wait_for(lambda: _listening(port), 60, f"Valkey back on port {port}")

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
