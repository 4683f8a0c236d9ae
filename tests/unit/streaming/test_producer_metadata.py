"""The producer's metadata updates are bounded (``broker.bound_metadata_updates``): one the
broker never answers gives up, drops the connections and reports failure, so the next
update starts over on fresh ones, instead of holding every send for the request timeout.

Run on aiokafka's real client: the hook is its private ``_metadata_update`` and ``_conns``,
and a version that renames them fails here rather than in production."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiokafka
from aiokafka.conn import CloseReason
from aiokafka.protocol.metadata import MetadataResponse_v0

from memstream.streaming.broker import (
    BoundedMetadataProducer,
    EventPublisher,
    ShortFetchTransport,
    bound_metadata_updates,
    track_sent_topics,
    warn_leaderless,
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


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_partition_without_a_leader_is_named_once_after_the_wait(caplog: Any) -> None:
    """The producer's own metadata says no leader for a partition that has batches waiting:
    after ``after_s`` the log names it, once, with what the metadata holds."""

    async def answered(cluster: Any, topics: Any) -> bool:
        return True

    client, _ = client_with(answered)
    stuck = aiokafka.TopicPartition("memstream.triggers", 2)
    clock = Clock()
    warn_leaderless(client, lambda: [stuck], after_s=20.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="memstream.streams")
    for now in (100.0, 110.0, 119.0):
        clock.now = now
        assert await client._metadata_update(client.cluster, {"memstream.triggers"}) is True
    assert not caplog.records
    for now in (121.0, 130.0, 200.0):
        clock.now = now
        await client._metadata_update(client.cluster, {"memstream.triggers"})
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith(
        "memstream.triggers[2] has had batches waiting and no leader for 21 s"
    )
    assert "last update answered" in message


async def test_a_partition_whose_leader_is_known_again_starts_a_new_episode(caplog: Any) -> None:
    waiting: list[aiokafka.TopicPartition] = [aiokafka.TopicPartition("memstream.dlq", 0)]

    async def answered(cluster: Any, topics: Any) -> bool:
        return True

    client, _ = client_with(answered)
    clock = Clock()
    warn_leaderless(client, lambda: waiting, after_s=20.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="memstream.streams")
    await client._metadata_update(client.cluster, set())
    clock.now += 15.0
    waiting.clear()  # sent: nothing waits any more
    await client._metadata_update(client.cluster, set())
    waiting.append(aiokafka.TopicPartition("memstream.dlq", 0))
    clock.now += 15.0
    await client._metadata_update(client.cluster, set())
    assert not caplog.records  # 15 s, then 0 s: never 20 in a row
    clock.now += 20.0
    await client._metadata_update(client.cluster, set())
    assert len(caplog.records) == 1


async def test_the_producer_holds_its_batches_where_the_warning_reads_them() -> None:
    producer: Any = aiokafka.AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")
    try:
        assert isinstance(producer._message_accumulator._batches, dict)
        assert hasattr(producer.client, "_metadata_update")
    finally:
        await producer.stop()


def metadata_naming(*topics: str) -> Any:
    """A metadata answer from one broker naming ``topics``, one partition each, led by it."""
    return MetadataResponse_v0(
        brokers=[(1, "127.0.0.1", 9)],
        topics=[(0, topic, [(0, 0, 1, [1], [1])]) for topic in topics],
    )


async def test_aiokafka_forgets_a_topic_it_learnt_from_an_all_topics_answer() -> None:
    """Why ``track_sent_topics`` exists: a topic whose partitions are known is never added to
    the tracked set, so an answer naming only another topic drops it from the metadata."""
    client: Any = aiokafka.AIOKafkaClient(bootstrap_servers="127.0.0.1:9")
    client.cluster.update_metadata(metadata_naming("encoded", "dlq"))  # all topics
    assert await client._wait_on_metadata("encoded") == {0}
    assert "encoded" not in client._topics
    client.add_topic("dlq")
    client.cluster.update_metadata(metadata_naming(*client._topics))  # what it now asks for
    assert client.cluster.partitions_for_topic("encoded") is None


async def test_a_topic_sent_to_stays_in_the_metadata_requests() -> None:
    client: Any = aiokafka.AIOKafkaClient(bootstrap_servers="127.0.0.1:9")
    track_sent_topics(client)
    client.cluster.update_metadata(metadata_naming("encoded", "dlq"))
    assert await client._wait_on_metadata("encoded") == {0}
    client.add_topic("dlq")
    assert client._topics == {"encoded", "dlq"}
    client.cluster.update_metadata(metadata_naming(*client._topics))
    assert client.cluster.partitions_for_topic("encoded") == {0}


async def test_the_rpc_producer_tracks_the_topics_it_sends_to() -> None:
    publisher = EventPublisher("kafka://127.0.0.1:9")
    client: Any = publisher._producer.client
    try:
        client.cluster.update_metadata(metadata_naming("events", "dlq"))
        await client._wait_on_metadata("events")
        assert client._topics == {"events"}
    finally:
        await publisher._producer.stop()
