"""On Apache Kafka the log is durable: the whole cluster and memstream restart, the events are
all still there, memstream goes on where it stopped (nothing read twice into the stores), and
``memstream rebuild`` re-derives the same state from the log.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from memstream.ops.demo import SAMPLE_STREAM
from memstream.ops.replay import handled_events
from memstream.schemas import InteractionEvent
from memstream.settings import QdrantSettings, Settings
from memstream.streaming.broker import bootstrap_servers
from tests.integration.process import MemstreamProcess, with_free_port
from tests.integration.test_rebuild import (
    finish,
    memstream,
    replay_and_settle,
    scraped_counts,
    snapshot,
)
from tests.real_clusters import on_clusters

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not on_clusters(), reason="needs the real clusters: make cluster-test"),
]


def test_the_log_survives_a_cluster_restart_and_rebuilds(
    settings_factory: Any, broker: Any, tmp_path: Path
) -> None:
    events = [
        InteractionEvent.model_validate_json(line)
        for line in SAMPLE_STREAM.read_text().splitlines()
        if line.strip()
    ]
    base: Settings = with_free_port(settings_factory(metrics_interval_s=0.5))
    qdrant = (base.qdrant, base.data_dir)
    live = MemstreamProcess(base, tmp_path / "live.log").start()
    try:
        replay_and_settle(live, len(events))
    finally:
        assert live.stop() == 0
    before = snapshot(base.redis.url, base.redis.prefix, qdrant)
    assert sum(len(u["memories"]) for u in before.values()) > 0

    # Every node stopped at once, then started on the same data folders.
    broker.run("down")
    broker.run("up")
    records = asyncio.run(read_topic(base.kafka.broker, base.kafka.topic("events")))
    logged = sorted(InteractionEvent.model_validate_json(v).event_id for v in records)
    assert logged == sorted(e.event_id for e in events)

    # memstream restarted: it resumes at its committed offsets; the stores are unchanged.
    again = MemstreamProcess(base, tmp_path / "again.log").start()
    try:
        # Offsets committed at the graceful stop survived the cluster's restart too.
        assert caught_up_with_nothing_new(again, base.kafka.topic("events")) == 0
    finally:
        assert again.stop() == 0
    assert snapshot(base.redis.url, base.redis.prefix, qdrant) == before

    # A new generation, same settings, read from the restarted cluster's log: the same state.
    finish(memstream("rebuild", "v2", "--no-switch", settings=base), timeout=400)
    rebuilt_qdrant = QdrantSettings(collection=f"{base.qdrant.collection}_v2")
    rebuilt = snapshot(base.redis.url, f"{base.redis.prefix}.v2", (rebuilt_qdrant, base.data_dir))
    assert rebuilt == before


def caught_up_with_nothing_new(process: MemstreamProcess, events_topic: str) -> float:
    """Wait until the restarted process reports its lag on the events topic, all 0; return
    how many events it handled meanwhile (re-read past its committed offsets)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        text = httpx.get(f"{process.url}/metrics", timeout=5).text
        lags = [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "memstream_consumer_lag" and s.labels.get("topic") == events_topic
        ]
        if lags and sum(lags) == 0:
            return handled_events(scraped_counts(f"{process.url}/metrics"))
        time.sleep(1.0)
    raise TimeoutError("the restarted process did not report a zero lag on the events topic")


async def read_topic(broker_url: str, topic: str) -> list[bytes]:
    """Every record value now in ``topic``, all partitions, from the first offset."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers(broker_url))
    await consumer.start()
    try:
        await consumer._client.add_topic(topic)  # Kafka's metadata lists only topics asked for
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        values: list[bytes] = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(*tps, timeout_ms=1000)).values():
                values += [r.value for r in records if r.value is not None]
        return values
    finally:
        await consumer.stop()
