"""Redis URLs: ``redis://`` is one server, ``redis+cluster://`` a Redis Cluster's seed nodes."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from memstream.stores.redis_client import _seeds, _with_host, async_redis, is_cluster_url


def test_the_scheme_selects_the_cluster_client() -> None:
    assert not is_cluster_url("redis://127.0.0.1:6379/0")
    assert is_cluster_url("redis+cluster://127.0.0.1:7001/0")
    assert is_cluster_url("rediss+cluster://r1:7001")
    assert isinstance(async_redis("redis+cluster://127.0.0.1:7001,127.0.0.1:7002/0"), RedisCluster)
    single = async_redis("redis://127.0.0.1:6379/0")
    assert isinstance(single, Redis)
    assert not isinstance(single, RedisCluster)


def test_seeds_keep_credentials_and_options() -> None:
    plain, seeds = _seeds("redis+cluster://user:pw@r1:7001,r2:7002/0?socket_timeout=2")
    assert plain == "redis://user:pw@r1:7001/0?socket_timeout=2"
    assert seeds == [("r1", 7001), ("r2", 7002)]
    assert _with_host("rediss+cluster://u:p@r1:1,r2:2/0", "r9", 9) == "rediss://u:p@r9:9/0"


def test_a_seed_without_a_port_is_refused() -> None:
    with pytest.raises(ValueError, match="not host:port"):
        _seeds("redis+cluster://r1,r2:7002")
