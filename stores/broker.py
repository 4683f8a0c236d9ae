"""The broker: the faust app and its topics, built from settings, and the RPC's producer.

No module-level app anywhere: ``create_app`` builds one per process (``memstream.wiring``).
Every stage reaches the broker through here, so the processors (``streams/``), the workers
(``workers/``) and the RPC (``rpc/``) share the plumbing without importing each other.

faust hard-codes ``fetch_max_wait_ms=1500``. Kafka answers a fetch as soon as data arrives,
but Tansu (the embedded broker) holds every empty fetch for the full wait, which adds up to
1.5 s per hop — three hops from a bot's event to a retrievable turn. ``ShortFetchTransport``
makes the wait a setting: a short one costs an idle consumer a few small requests a second
and makes every hop fast on either broker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import aiokafka
import faust
from aiokafka import AIOKafkaProducer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import EventT, TransportT

from memstream.settings import Settings
from schemas import TOPICS

# -- the consumer transport ---------------------------------------------------------------


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    fetch_max_wait_ms: ClassVar[int] = 100

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when the consumer starts (pinned aiokafka==0.14.0).
        assert hasattr(consumer, "_fetch_max_wait_ms"), "aiokafka changed: revisit fetch wait"
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer


class ShortFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ShortFetchTransport(faust_aiokafka.Transport):
    Consumer = ShortFetchConsumer


# -- the app and its topics ---------------------------------------------------------------


@dataclass(frozen=True)
class Topics:
    events: faust.TopicT
    encoded: faust.TopicT
    triggers: faust.TopicT
    consolidated: faust.TopicT
    feedback: faust.TopicT
    control: faust.TopicT
    reminders: faust.TopicT
    dlq: faust.TopicT

    def all(self) -> list[faust.TopicT]:
        return [getattr(self, t.name) for t in TOPICS]


class MemstreamApp(faust.App):
    """A faust app whose consumers use ``ShortFetchTransport`` (above)."""

    def _new_transport(self) -> TransportT:
        return ShortFetchTransport(self.conf.broker_consumer, self)


def create_app(settings: Settings, *, app_id: str, broker_url: str) -> faust.App:
    """A faust app with broker settings that suit both Kafka and the embedded Tansu broker.

    Tansu answers group joins in about half the session timeout, so the timeout is short;
    per-user state lives in Redis, so the app declares no tables (no changelog recovery).
    """
    datadir = settings.data_dir / "faust" / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    ShortFetchConsumerThread.fetch_max_wait_ms = settings.kafka.fetch_max_wait_ms
    return MemstreamApp(
        app_id,
        broker=broker_url,
        broker_session_timeout=settings.kafka.session_timeout_s,
        broker_heartbeat_interval=max(settings.kafka.session_timeout_s / 3, 0.5),
        broker_commit_every=100,
        broker_commit_interval=1.0,
        stream_wait_empty=False,
        topic_partitions=settings.kafka.partitions,
        topic_replication_factor=settings.kafka.replication_factor,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
        producer_acks=-1,
        processing_guarantee=settings.kafka.processing_guarantee,
    )


def create_topics(app: faust.App, settings: Settings) -> Topics:
    """Raw-bytes topics: values are decoded by the stages so that bad input reaches the DLQ."""
    made = {
        t.name: app.topic(
            settings.topic(t.name),
            key_serializer="raw",
            value_serializer="raw",
            partitions=t.partitions or settings.kafka.partitions,
            # "internal": faust declares the topic before it subscribes. Kafka does not
            # create a topic for a consumer, and a group that joined before its topics
            # existed is assigned nothing until its next metadata refresh (5 minutes).
            internal=True,
        )
        for t in TOPICS
    }
    return Topics(**made)


# -- typed doors to faust's untyped decorators ---------------------------------------------

Job = Callable[[], Awaitable[None]]


def on_start(app: faust.App, job: Job) -> None:
    """Run ``job`` once when the worker is ready (``@app.task``)."""
    app.task(job)


def every(
    app: faust.App, interval_s: float, job: Job, *, name: str | None = None, on_leader: bool = False
) -> None:
    """Run ``job`` every ``interval_s`` seconds while the worker runs (``@app.timer``)."""
    app.timer(interval_s, on_leader=on_leader, name=name)(job)


def take_events(
    stream: faust.StreamT[bytes], size: int, within_s: float
) -> AsyncIterator[Sequence[EventT[bytes]]]:
    """Batches of up to ``size`` events, each flushed after ``within_s`` at the latest.

    faust declares ``take_events`` on its ``Stream`` but not on the ``StreamT`` an agent gets.
    """
    return cast(faust.Stream[bytes], stream).take_events(size, within=within_s)


# -- the RPC's producer -------------------------------------------------------------------


def bootstrap_servers(broker_url: str) -> str:
    """faust-style ``kafka://h1:9092;kafka://h2:9092`` -> aiokafka's ``h1:9092,h2:9092``."""
    hosts = [
        part.removeprefix("kafka://").strip("/") for part in broker_url.replace(";", ",").split(",")
    ]
    return ",".join(h for h in hosts if h)


class EventPublisher:
    """Publishing from the RPC (and the operator tools) to Kafka: one pooled producer."""

    def __init__(self, broker_url: str) -> None:
        # Idempotent producers are not supported by every Kafka-protocol broker (Tansu):
        # at-least-once delivery plus idempotent consumers instead.
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers(broker_url),
            acks="all",
            enable_idempotence=False,
            linger_ms=2,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def publish(self, topic: str, key: str, value: bytes) -> None:
        await self._producer.send_and_wait(topic, value=value, key=key.encode())

    async def publish_many(self, topic: str, items: list[tuple[str, bytes]]) -> None:
        futures = [await self._producer.send(topic, value=v, key=k.encode()) for k, v in items]
        for future in futures:
            await future

    async def ping(self) -> bool:
        try:
            await self._producer.client.fetch_all_metadata()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self._producer.stop()
