"""Redis clients from a URL: one server (``redis://``) or a Redis Cluster (``redis+cluster://``).

``redis+cluster://h1:6379,h2:6379/0`` names seed nodes of a cluster (any of them is enough
to discover the rest; more seeds survive one being down at start). redis-py's cluster client
then routes each command to the primary of its key's slot and follows failovers. memstream
keeps every key of one user under the hash tag ``{tenant:user}`` (one slot), so the
per-user MULTI/EXEC transactions stay valid on a cluster; no command spans two slots.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
from redis._parsers import _AsyncHiredisParser
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool, Connection
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ExecAbortError,
    MovedError,
    ReadOnlyError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# redis-py 8's default socket timeout, kept: a server that stops answering is an outage
# (the stages retry it, the RPC answers 503), not a hang.
READ_TIMEOUT_S = 5.0


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def _seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """The first seed as a plain redis URL (credentials, options kept), and every seed."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"Redis Cluster URL {url!r}: seed {host!r} is not host:port")
        seeds.append((name, int(port)))
    first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    plain = urlunsplit(
        (CLUSTER_SCHEMES[parts.scheme], first, parts.path, parts.query, parts.fragment)
    )
    return plain, seeds


class _TimedReadParser(_AsyncHiredisParser):
    """hiredis's parser with the read timeout around each socket read, when one is set."""

    timeout_s: float | None = None

    async def read_from_socket(self) -> bool:
        read = super().read_from_socket()  # type: ignore[no-untyped-call]  # unannotated there
        if self.timeout_s is None:
            return bool(await read)
        try:
            async with asyncio.timeout(self.timeout_s):
                return bool(await read)
        except TimeoutError:
            raise RedisTimeoutError(f"Redis sent nothing for {self.timeout_s:g} s") from None


class TimedReadConnection(Connection):
    """A connection whose socket timeout is armed per socket read, not per reply.

    redis-py arms an asyncio timer around every reply it reads and runs every send under
    ``wait_for`` (a task each): a user's transaction of ten commands read twelve replies
    under twelve timers, though one socket read brings them all. Here a reply already
    buffered costs no timer: 210 -> 135 us of client CPU per such transaction, measured
    against Valkey on loopback (the Redis client is ~12% of the event loop during a
    replay, issue 14). A stalled server still raises redis' ``TimeoutError`` after
    ``socket_timeout`` without a byte; a send is not timed, as a small one lands in the
    kernel's socket buffer at once, and the read after it times out. A caller's own
    per-read timeout (pub/sub's) is redis-py's, unchanged.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.read_timeout_s: float | None = kwargs.pop("socket_timeout", READ_TIMEOUT_S)
        kwargs.setdefault("socket_connect_timeout", self.read_timeout_s)
        super().__init__(socket_timeout=None, parser_class=_TimedReadParser, **kwargs)

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 (redis-py's signature)
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        parser = cast(_TimedReadParser, self._parser)
        parser.timeout_s = self.read_timeout_s if timeout is None else None
        try:
            return await super().read_response(
                disable_decoding,
                timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        finally:
            parser.timeout_s = None


# redis-py 8 caps a client's pool at 100 connections and raises MaxConnectionsError past
# it: overloaded by 256 callers, the RPC's admitted retrievals (several reads at once each)
# passed it and answered 500. Past the cap a command now waits for a free connection, at
# most POOL_WAIT_S (then a ConnectionError: an outage, retried or answered 503).
POOL_MAX_CONNECTIONS = 100
POOL_WAIT_S = 5.0


def async_redis(url: str) -> Redis:
    """An asyncio client; typed as ``Redis`` because the cluster client speaks the same verbs
    for single-slot commands, the only ones memstream sends."""
    if not is_cluster_url(url):
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=POOL_MAX_CONNECTIONS,
            timeout=POOL_WAIT_S,
            decode_responses=False,
            connection_class=TimedReadConnection,
        )
        return Redis.from_pool(pool)
    plain, seeds = _seeds(url)
    client = RedisCluster.from_url(
        plain,
        decode_responses=False,
        startup_nodes=[ClusterNode(h, p) for h, p in seeds],
    )  # redis-py's default retry (10 tries, backoff) covers a replica's promotion
    return cast(Redis, client)


def sync_redis(url: str) -> redis.Redis:
    """A blocking client (small, rare reads and writes: generations, tests)."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url)
    plain, seeds = _seeds(url)
    client = redis.cluster.RedisCluster.from_url(
        plain,
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],  # type: ignore[no-untyped-call]
    )
    return cast(redis.Redis, client)


# Answers that mean "this slot lives elsewhere now" (a failover, a resharding): nothing of
# the transaction ran, the topology is re-read, and the caller retries it as an outage.
_MOVED = (MovedError, AskError, ClusterDownError, TryAgainError, ExecAbortError, ReadOnlyError)


class SlotTransactions:
    """MULTI/EXEC pipelines over the keys of one slot (one user's ``{tenant:user}`` keys).

    On one server: the client's own transaction pipeline. On a Redis Cluster: a plain client
    to the slot's primary (redis-py 8.1's cluster transaction pipeline runs every queued
    command through a thread and a new event loop: ~10 ms a transaction, 20x a plain one).
    """

    def __init__(self, client: Redis, url: str = "") -> None:
        self.client = client
        self._cluster = client if isinstance(client, RedisCluster) else None
        self._url = url
        self._nodes: dict[str, Redis] = {}

    async def pipeline(self, key: str) -> Pipeline:
        if self._cluster is None:
            return self.client.pipeline(transaction=True)
        if self._cluster._initialize:  # never asked yet: learn the slot table first
            await self._cluster.initialize()
        node = self._cluster.get_node_from_key(key)
        primary = self._nodes.get(node.name)
        if primary is None:
            primary = self._nodes[node.name] = Redis.from_url(
                _with_host(self._url, node.host, node.port),
                decode_responses=False,
                connection_class=TimedReadConnection,
            )
        return primary.pipeline(transaction=True)

    async def execute(self, pipe: Pipeline) -> list[Any]:
        try:
            return await pipe.execute()
        except _MOVED as exc:
            await self._refresh()
            raise RedisConnectionError(f"Redis Cluster slot moved: {exc}") from exc
        except (RedisConnectionError, RedisTimeoutError, OSError):
            await self._refresh()
            raise

    async def _refresh(self) -> None:
        if self._cluster is not None:
            await self._cluster.nodes_manager.initialize()

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.aclose()
        self._nodes.clear()


def _with_host(url: str, host: str, port: int) -> str:
    """``url`` (a plain or cluster Redis URL) aimed at one node."""
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    scheme = CLUSTER_SCHEMES.get(parts.scheme, parts.scheme or "redis")
    return urlunsplit((scheme, netloc, parts.path, parts.query, parts.fragment))
