"""Faults on the real clusters: a Kafka broker, a worker, a Redis primary, each killed mid-stream.

The services are the ones ``make cluster-up`` runs (deploy/kafka, deploy/redis-cluster): 3
Apache Kafka nodes (topics in 3 copies, min.insync.replicas=2, acks=all) and a Redis Cluster
of 3 primaries with a replica each. memstream's processes are the suite's (``stream`` =
encode + memorize, ``memory`` = consolidator + RPC); each row has its own topic and key
prefix, and every fault fires when a share of the stream's turns is stored:

- one Kafka node SIGKILLed (its partitions' leadership moves to the other two), started
  again later; producers and consumers ride it out without a restart;
- one of two ``stream`` workers SIGKILLed, not restarted: after the session timeout the
  group gives its partitions to the other, which re-reads from the last commits;
- the Redis primary holding the first slot SIGKILLed: its replica is promoted after the
  cluster's node timeout, the writers retry meanwhile (a moved slot is an outage to
  ``streaming/stage``), and the old primary comes back as a replica.

Audited from the stores like every row (reliability/audit.py): each turn stored once, each
trigger consolidated, exactly the memories those triggers make.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from memstream.launch import merge_overrides
from memstream.stores.redis_client import async_redis
from reliability.cluster import ROLES, Deployment
from reliability.core import Context, Row
from reliability.pipeline import faults_label, run_pipeline, stream_file
from reliability.progress import Fault
from tests.real_clusters import (
    ClusterService,
    cluster_settings,
    kafka_cluster,
    redis_cluster,
    redis_primary,
)

NAME = "cluster_faults"
ROLES.setdefault("stream-2", frozenset({"process"}))  # a second worker of the same consumer group


@dataclass
class ClusterDeployment(Deployment):
    """A ``Deployment`` whose broker and Redis are the running clusters (not owned here)."""

    kafka: ClusterService = field(default_factory=kafka_cluster)
    redis_service: ClusterService = field(default_factory=redis_cluster)

    def start_services(self) -> ClusterDeployment:
        # The clusters outlive the row; what it needs of them is only their URLs.
        self.broker = self.kafka.start()  # type: ignore[assignment]
        self.redis = self.redis_service.start()  # type: ignore[assignment]
        self.overrides = merge_overrides(cluster_settings(), self.overrides)
        return self

    def redis_client(self) -> Redis:
        assert self.redis is not None
        return async_redis(self.redis.url)

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()


def _kill_broker(node: int) -> list[Fault]:
    began: dict[str, float] = {}

    async def kill(deployment: Any) -> str:
        await asyncio.to_thread(deployment.kafka.run, "kill", str(node))
        began["at"] = time.monotonic()
        return f"SIGKILL Kafka node {node}"

    async def back(deployment: Any) -> str:
        await asyncio.to_thread(deployment.kafka.run, "start", str(node))
        return f"Kafka node {node} started again after {time.monotonic() - began['at']:.0f} s"

    return [Fault(f"Kafka node {node} SIGKILLed", 0.3, kill, until=0.6, end=back)]


def _kill_worker() -> list[Fault]:
    async def second(deployment: Any) -> str:
        await asyncio.to_thread(deployment.start, "stream-2")
        return "a second worker joined the group"

    async def kill(deployment: Any) -> str:
        deployment["stream-2"].kill()
        return "SIGKILL the second worker (not restarted)"

    return [
        Fault("a second worker joined", 0.0, second),
        Fault("the second worker SIGKILLed", 0.4, kill),
    ]


def _kill_redis_primary() -> list[Fault]:
    victim: dict[str, int] = {}

    async def kill(deployment: Any) -> str:
        victim["port"] = port = await asyncio.to_thread(redis_primary, deployment.redis.url)
        await asyncio.to_thread(deployment.redis_service.run, "kill", str(port))
        return f"SIGKILL the Redis primary on port {port}"

    async def back(deployment: Any) -> str:
        await asyncio.to_thread(deployment.redis_service.run, "start", str(victim["port"]))
        return f"port {victim['port']} started again (it rejoins as a replica)"

    return [Fault("a Redis primary SIGKILLed", 0.4, kill, until=0.8, end=back)]


ROWS = {
    "Kafka cluster: SIGKILL one of 3 brokers, restart it": _kill_broker(2),
    "Kafka cluster: SIGKILL one of 2 workers (group rebalances)": _kill_worker(),
    "Redis Cluster: SIGKILL a primary (replica promoted)": _kill_redis_primary(),
}


async def run_row(ctx: Context, label: str, faults: list[Fault], n: int) -> Row:
    root = ctx.root / NAME / f"row{list(ROWS).index(label)}"
    path, events = stream_file(root, n)
    # Every turn of the row stays in the hot tier (the generated stream spans months), so
    # the faults hit Redis with the whole stream's writes; the audit reads the archive too.
    deployment = ClusterDeployment(
        root, partitions=4, overrides={"redis": {"short_term_ttl_days": 36500.0}}
    )
    try:
        outcome = await run_pipeline(
            deployment, path, events, faults, settle_timeout_s=300 if ctx.quick else 900
        )
    finally:
        deployment.stop()
        # Leave the clusters whole for what runs next, whatever happened here.
        await asyncio.to_thread(deployment.kafka.run, "up")
        await asyncio.to_thread(deployment.redis_service.run, "up")
    note = (
        f"{'; '.join(outcome.log)}. After settling ({outcome.seconds:.0f} s): "
        f"{outcome.verdict.detail}." + ("" if outcome.settled else " NOT SETTLED.")
    )
    return Row(
        f"{label}: {faults_label(outcome.spans)}",
        n,
        lost=outcome.verdict.lost,
        duplicated=outcome.verdict.duplicated,
        errors=0 if outcome.settled else 1,
        note=note,
        spans=tuple(outcome.spans),
    )


async def run(ctx: Context, only: list[str] | None = None) -> list[Row]:
    n = 400 if ctx.quick else 3000
    return [
        await run_row(ctx, label, faults, n)
        for label, faults in ROWS.items()
        if only is None or label in only
    ]
