"""Shared fixtures: one real broker and one real Valkey per test session, settings per test.

The Tansu broker keeps every record in memory, so a session gets a fresh one; tests keep
out of each other's way with their own topic prefix (and so their own consumer groups).

``MEMSTREAM_TEST_STACK=cluster`` runs the same tests on a 3-node Apache Kafka cluster and a
Redis Cluster instead (``make cluster-test``; tests/real_clusters.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstream.settings import Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from tests.real_clusters import (
    cluster_environment,
    kafka_cluster,
    on_clusters,
    redis_cluster,
)

ON_CLUSTERS = on_clusters()
if ON_CLUSTERS:  # every Settings made here, and every child process, gets them
    for _name, _value in cluster_environment().items():
        os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    # Tests read only ``.url`` (and ``.stop``); the cluster service has both.
    service: Any = (
        kafka_cluster() if ON_CLUSTERS else EmbeddedBroker(tmp_path_factory.mktemp("broker"))
    ).start()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    service: Any = (
        redis_cluster()
        if ON_CLUSTERS
        else EmbeddedRedis(tmp_path_factory.mktemp("redis"), persist=False)
    ).start()
    yield service
    service.stop()


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def settings_factory(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path: Path
) -> SettingsFactory:
    """Settings wired to the session's services, with a unique topic and key prefix."""

    def make(**sections: Any) -> Settings:
        unique = uuid.uuid4().hex[:8]
        base: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "kafka": {"broker": broker.url, "topic_prefix": f"t{unique}", "partitions": 2},
            "redis": {"url": redis_server.url, "prefix": f"t{unique}"},
        }
        for name, values in sections.items():
            base[name] = {**base.get(name, {}), **values} if isinstance(values, dict) else values
        return Settings(**base)

    return make
