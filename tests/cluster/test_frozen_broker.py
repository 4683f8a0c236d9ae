"""A broker that is up and connected but answers nothing (SIGSTOP: a long GC pause, a hung
disk) does not hold the producer's sends for its 20-minute request timeout: a metadata
request it leaves unanswered is given up after ``METADATA_TIMEOUT_S`` and asked again over
fresh connections (``broker.bound_metadata_updates``, on the faust producer the stages
send with; the RPC's own producer keeps aiokafka's 40 s request timeout).

The topics' leaders are never the frozen node, so only a metadata request can reach it;
acks=1, so no send waits for the frozen follower to leave the in-sync replicas. Without the
bound, the first metadata request that lands on the frozen node stalls every later send
(measured here: 6 of 6 sends to new topics timed out at 40 s; with it, one 10 s wait)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.streaming.broker import bootstrap_servers, bound_metadata_updates
from tests.real_clusters import kafka_cluster, on_clusters

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not on_clusters(), reason="needs the real clusters: make cluster-test"),
]

FROZEN = 2
BOUND_S = 3.0
TOPICS = 20  # metadata requests go to a random node: 20 miss the frozen one 3 in 10,000


async def sends_while_frozen(servers: str) -> list[float]:
    kafka = kafka_cluster()
    topics = [f"frozen-{uuid.uuid4().hex[:8]}-{i}" for i in range(TOPICS)]
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:  # leaders on nodes 1 and 3, the frozen node a follower
        await admin.create_topics(
            [NewTopic(t, -1, -1, replica_assignments={0: [1, 3, FROZEN]}) for t in topics]
        )
    finally:
        await admin.close()
    await asyncio.sleep(2.0)  # every broker learns the new topics
    producer = AIOKafkaProducer(bootstrap_servers=servers, request_timeout_ms=1_200_000, acks=1)
    await producer.start()
    bound_metadata_updates(producer.client, BOUND_S)
    took: list[float] = []
    try:
        for node in (1, 2, 3):  # connected to every node before one freezes
            assert await producer.client.ready(node)
        kafka.run("freeze", str(FROZEN))
        try:
            for topic in topics:
                started = time.monotonic()
                await asyncio.wait_for(producer.send_and_wait(topic, b"x"), 30.0)
                took.append(time.monotonic() - started)
        finally:
            kafka.run("thaw", str(FROZEN))
    finally:
        await asyncio.wait_for(producer.stop(), 30.0)
    return took


def test_a_frozen_broker_does_not_hold_the_producer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="memstream.streams")
    servers = bootstrap_servers(kafka_cluster().start().url)
    took = asyncio.run(sends_while_frozen(servers))
    assert len(took) == TOPICS
    # Each send waits at most for a bounded metadata request or two, never for the broker.
    assert max(took) < 4 * BOUND_S, took
    gave_up = [r for r in caplog.records if "no metadata answer" in r.getMessage()]
    assert gave_up, "no metadata request reached the frozen node: the bound was not exercised"
