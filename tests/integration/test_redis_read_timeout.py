"""``TimedReadConnection``: redis' timeout per socket read, against a real Valkey.

A server that stops answering must still time out (the stages retry it as an outage, the
RPC answers 503), the client must work again once it is back, and pub/sub's blocking reads,
which wait as long as they must, must not time out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.redis_client import POOL_MAX_CONNECTIONS, TimedReadConnection, async_redis

TIMEOUT_S = 0.3


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Valkey of this test's own: it is stopped with SIGSTOP."""
    server = EmbeddedRedis(tmp_path / "valkey", persist=False).start()
    yield server
    if server.pid is not None:
        os.kill(server.pid, signal.SIGCONT)
    server.stop()


async def test_a_stalled_server_times_out_and_the_client_recovers(
    own_valkey: EmbeddedRedis,
) -> None:
    client = async_redis(f"{own_valkey.url}?socket_timeout={TIMEOUT_S}")
    try:
        pipe = client.pipeline(transaction=True)
        for i in range(10):
            pipe.hset("h", f"f{i}", i)
        pipe.hgetall("h")
        replies = await pipe.execute()
        assert replies[:10] == [1] * 10
        assert replies[10] == {f"f{i}".encode(): str(i).encode() for i in range(10)}
        connection = await client.connection_pool.get_connection()
        assert isinstance(connection, TimedReadConnection)
        await client.connection_pool.release(connection)

        assert own_valkey.pid is not None
        os.kill(own_valkey.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await client.hgetall("h")
        waited = time.monotonic() - started
        assert TIMEOUT_S * 0.9 <= waited < TIMEOUT_S + 2.0

        os.kill(own_valkey.pid, signal.SIGCONT)
        assert await client.hget("h", "f3") == b"3"
    finally:
        await client.aclose()


async def test_pubsub_waits_longer_than_the_read_timeout(own_valkey: EmbeddedRedis) -> None:
    client = async_redis(f"{own_valkey.url}?socket_timeout={TIMEOUT_S}")
    publisher = async_redis(own_valkey.url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe("news")

        async def publish_late() -> None:
            await asyncio.sleep(TIMEOUT_S * 3)
            await publisher.publish("news", "late")

        late = asyncio.create_task(publish_late())
        async with asyncio.timeout(10):
            async for message in pubsub.listen():
                if message["type"] == "message":
                    assert message["data"] == b"late"
                    break
        await late
    finally:
        await pubsub.aclose()
        await client.aclose()
        await publisher.aclose()


async def test_commands_past_the_pool_cap_wait_for_a_connection(own_valkey: EmbeddedRedis) -> None:
    """More commands at once than the pool holds connections (an overloaded RPC): the rest
    wait for a connection rather than fail with redis-py's MaxConnectionsError."""
    client = async_redis(own_valkey.url)
    at_once = POOL_MAX_CONNECTIONS + 30
    try:
        started = time.monotonic()
        replies = await asyncio.gather(*(client.blpop([f"empty{i}"], 0.3) for i in range(at_once)))
        assert replies == [None] * at_once
        assert time.monotonic() - started >= 0.55  # the last 30 waited for a first one's end
    finally:
        await client.aclose()
