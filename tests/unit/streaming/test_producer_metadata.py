"""The producer's metadata updates are bounded (``broker.bound_metadata_updates``): one the
broker never answers gives up, drops the connections and reports failure, so the next
update starts over on fresh ones, instead of holding every send for the request timeout.

Run on aiokafka's real client: the hook is its private ``_metadata_update`` and ``_conns``,
and a version that renames them fails here rather than in production."""

from __future__ import annotations

import asyncio
from typing import Any

import aiokafka
from aiokafka.conn import CloseReason

from memstream.streaming.broker import (
    BoundedMetadataProducer,
    ShortFetchTransport,
    bound_metadata_updates,
)


class RecordingConn:
    def __init__(self) -> None:
        self.closed: list[Any] = []

    def close(self, reason: Any = None, exc: Any = None) -> None:
        self.closed.append(reason)


def client_with(update: Any) -> tuple[Any, list[RecordingConn]]:
    client: Any = aiokafka.AIOKafkaClient(bootstrap_servers="127.0.0.1:9")
    assert hasattr(client, "_metadata_update")
    assert isinstance(client._conns, dict)
    conns = [RecordingConn(), RecordingConn()]
    client._conns.update({(1, 0): conns[0], (2, 0): conns[1]})
    client._metadata_update = update
    return client, conns


async def test_an_unanswered_update_gives_up_and_drops_the_connections() -> None:
    async def never_answered(cluster: Any, topics: Any) -> bool:
        await asyncio.Event().wait()
        return True

    client, conns = client_with(never_answered)
    bound_metadata_updates(client, timeout_s=0.05)
    updated = await asyncio.wait_for(client._metadata_update(client.cluster, {"t"}), 2.0)
    assert updated is False
    assert [c.closed for c in conns] == [[CloseReason.CONNECTION_TIMEOUT]] * 2


async def test_an_answered_update_passes_through_untouched() -> None:
    asked: list[Any] = []

    async def answered(cluster: Any, topics: Any) -> bool:
        asked.append(topics)
        return True

    client, conns = client_with(answered)
    bound_metadata_updates(client, timeout_s=5.0)
    assert await client._metadata_update(client.cluster, {"t"}) is True
    assert asked == [{"t"}]
    assert [c.closed for c in conns] == [[], []]


def test_the_app_transport_builds_the_bounded_producer() -> None:
    assert ShortFetchTransport.Producer is BoundedMetadataProducer
