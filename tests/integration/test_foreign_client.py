"""A bot in another language: librdkafka (confluent-kafka) against the embedded broker.

confluent-kafka is not what memstream uses (aiokafka), so this checks the broker and the
topic contract from the outside: keyed ``InteractionEvent`` JSON produced by librdkafka is
remembered (retrieve finds it), an invalid one comes back on ``memstream.dlq`` with its
reason, and a pinned one is consolidated onto ``memstream.consolidated``. The consumers
assign partitions by hand: a consumer-group join takes 20-60 s against the embedded broker,
and reading a topic needs no group.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from memstream.schemas import ConsolidatedMemory, DeadLetter
from memstream.settings import DEMO_TENANT
from memstream.streaming.broker import bootstrap_servers
from tests.integration.process import MemstreamProcess, wait_for

pytestmark = pytest.mark.integration

T0 = "2026-11-02T10:00:00Z"


def event(user: str, event_id: str, text: str, *, pin: bool = False) -> bytes:
    body: dict[str, Any] = {
        "event_id": event_id,
        "tenant_id": DEMO_TENANT,
        "user_id": user,
        "session_id": "s1",
        "role": "user",
        "text": text,
        "ts": T0,
        "metadata": {"pin": pin},
    }
    return json.dumps(body).encode()


def produce(servers: str, topic: str, records: list[tuple[str, bytes | None]]) -> None:
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": False})
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
    assert producer.flush(30) == 0, "librdkafka did not deliver every record within 30 s"
    assert not failures, failures


def read_until(
    servers: str, topic: str, done: Callable[[list[bytes]], bool], timeout_s: float
) -> list[bytes]:
    """Every value of ``topic`` from its start, until ``done(values)`` or the timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"foreign-{uuid.uuid4().hex[:6]}",  # required, never joined: assign()
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    values: list[bytes] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout_s
        while not done(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def test_confluent_kafka_bot_is_remembered_dead_lettered_and_consolidated(
    running: MemstreamProcess,
) -> None:
    settings = running.settings
    servers = bootstrap_servers(settings.kafka.broker)
    user = f"u-{uuid.uuid4().hex[:6]}"
    key = f"{DEMO_TENANT}:{user}"
    remembered = f"{user}-turn"
    pinned = f"{user}-pin"
    produce(
        servers,
        settings.kafka.topic("events"),
        [
            (key, b""),  # invalid events: dead-lettered, the stream goes on
            (key, None),  # a null value (a Kafka tombstone), not even empty bytes
            (key, event(user, remembered, "The espresso machine leaks water from the base.")),
            (key, event(user, pinned, "My loyalty card number is LC-88213.", pin=True)),
        ],
    )

    def found() -> bool:
        with running.client() as http:
            answer = http.post(
                "/v1/retrieve", json={"user_id": user, "query": "Which machine is leaking?"}
            )
        assert answer.status_code == 200, answer.text
        return any(remembered in item["source_event_ids"] for item in answer.json()["items"])

    wait_for(found, 60, "the turn produced by confluent-kafka in retrieval")

    def ours(letters: list[bytes]) -> list[DeadLetter]:
        parsed = (DeadLetter.model_validate_json(v) for v in letters)
        return [d for d in parsed if d.key == key]

    letters = ours(
        read_until(servers, settings.kafka.topic("dlq"), lambda vs: len(ours(vs)) > 1, 60)
    )
    reasons = sorted(letter.reason for letter in letters)
    assert reasons == ["empty value", "empty value (null record)"], letters
    assert {letter.stage for letter in letters} == {"encode"}

    def consolidated(values: list[bytes]) -> list[ConsolidatedMemory]:
        memories = (ConsolidatedMemory.model_validate_json(v) for v in values)
        return [m for m in memories if m.user_id == user and pinned in m.source_event_ids]

    values = read_until(
        servers, settings.kafka.topic("consolidated"), lambda vs: bool(consolidated(vs)), 120
    )
    memory = consolidated(values)[0]
    assert memory.tenant_id == DEMO_TENANT
    assert "LC-88213" in json.dumps(memory.model_dump(mode="json"))
