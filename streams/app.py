"""Build the faust app and its topics from settings; no module-level app anywhere."""

from __future__ import annotations

from dataclasses import dataclass

import faust
from faust.types import TransportT

from memstream.settings import Settings
from schemas import TOPICS
from streams.transport import ShortFetchConsumerThread, ShortFetchTransport


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
    """A faust app whose consumers use ``ShortFetchTransport`` (see streams/transport.py)."""

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
    )


def create_topics(app: faust.App, settings: Settings) -> Topics:
    """Raw-bytes topics: values are decoded by the processors so that bad input reaches the DLQ."""
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
