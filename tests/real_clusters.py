"""The real clusters: Apache Kafka (3 KRaft nodes) and a Redis Cluster (3 primaries, 3
replicas), run by the operator scripts in ``deploy/``, for the tests of
``MEMSTREAM_TEST_STACK=cluster`` and the cluster fault rows (reliability/cluster_faults.py).

A user of these takes the clusters that are up (``make cluster-test`` starts them once) or
starts them and stops them at its end. Tests share them the way they share the embedded
broker: each test has its own topic and key prefix.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstream.settings import ENV_NESTED, ENV_PREFIX

ROOT = Path(__file__).resolve().parents[1]
KAFKA = ROOT / "deploy" / "kafka" / "cluster.sh"
REDIS = ROOT / "deploy" / "redis-cluster" / "cluster.sh"
STACK_ENV = "MEMSTREAM_TEST_STACK"


def cluster_settings() -> dict[str, Any]:
    """What memstream is set to on the clusters (README, operator section), besides the
    URLs, as settings overrides: every topic in 3 copies (the brokers have
    min.insync.replicas=2), a session timeout within a stock broker's bounds
    (group.min.session.timeout.ms = 6 s), and at-least-once processing: faust's
    exactly_once measured slower, a second more per hop and still duplicating records after
    a crash (bench/delivery.py, BENCHMARKS.md)."""
    return {
        "kafka": {
            "replication_factor": 3,
            "session_timeout_s": 6.0,
            "processing_guarantee": "at_least_once",
        }
    }


def cluster_environment() -> dict[str, str]:
    """``cluster_settings`` as the variables that set them (the test session's, which every
    Settings made in tests/conftest.py reads)."""
    return {
        f"{ENV_PREFIX}{section}{ENV_NESTED}{name}".upper(): str(value)
        for section, fields in cluster_settings().items()
        for name, value in fields.items()
    }


def on_clusters() -> bool:
    stack = os.environ.get(STACK_ENV, "embedded")
    if stack not in ("embedded", "cluster"):
        raise ValueError(f"{STACK_ENV}={stack!r}: use 'embedded' or 'cluster'")
    return stack == "cluster"


def _script(script: Path, *args: str, timeout_s: float = 300) -> str:
    done = subprocess.run(
        [str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout.strip()


@dataclass
class ClusterService:
    """One of the two clusters; ``url`` is what memstream's settings take."""

    script: Path
    url: str = ""
    started_here: bool = False

    def start(self) -> ClusterService:
        status = _script(self.script, "status")
        if "stopped" in status or "down" in status:
            _script(self.script, "up")
            self.started_here = True
        self.url = _script(self.script, "url")
        return self

    def stop(self) -> None:
        if self.started_here:
            _script(self.script, "down")

    def run(self, *args: str, timeout_s: float = 300) -> str:
        """A script verb (``kill N``, ``start N``, ``down``, ``up``): for fault tests."""
        return _script(self.script, *args, timeout_s=timeout_s)


def kafka_cluster() -> ClusterService:
    return ClusterService(KAFKA)


def redis_cluster() -> ClusterService:
    return ClusterService(REDIS)


def redis_primary(url: str) -> int:
    """The port of one primary of the Redis Cluster at ``url`` (the first by port)."""
    from memstream.stores.redis_client import sync_redis

    with sync_redis(url) as client:
        nodes = client.cluster_nodes()
    primaries = sorted(
        int(address.split(":")[1].split("@")[0])
        for address, node in nodes.items()
        if "master" in node["flags"] and node["connected"]
    )
    return primaries[0]
