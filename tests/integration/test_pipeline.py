"""The whole path on real services: events -> broker -> faust -> Redis -> Qdrant -> RPC."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from memstream.ops.demo import DEMO_QUESTIONS, SAMPLE_STREAM
from memstream.ops.replay import replay_file
from memstream.schemas import DeadLetter
from memstream.settings import Settings
from memstream.streaming.broker import EventPublisher, bootstrap_servers
from tests.integration.process import MemstreamProcess, wait_for

pytestmark = pytest.mark.integration


def retrieve(process: MemstreamProcess, user_id: str, query: str) -> dict:
    with process.client() as http:
        response = http.post("/v1/retrieve", json={"user_id": user_id, "query": query})
    assert response.status_code == 200, response.text
    return response.json()


def test_recurring_order_is_consolidated_and_retrieved(running: MemstreamProcess) -> None:
    settings = running.settings
    sent = asyncio.run(
        replay_file(
            SAMPLE_STREAM, settings.kafka.broker, settings.kafka.topic("events"), progress=False
        )
    )
    assert sent > 100
    question = json.loads(DEMO_QUESTIONS.read_text())[0]
    expected = set(question["expect_event_ids"])

    def memory_about_order() -> dict | None:
        answer = retrieve(running, question["user_id"], question["question"])
        for item in answer["items"]:
            if item["kind"] == "memory" and expected & set(item["source_event_ids"]):
                return item
        return None

    memory = wait_for(memory_about_order, 120, "a consolidated memory about the recurring order")
    assert "A10293" in memory["text"].replace("-", "").upper()
    with running.client() as http:
        metrics = http.get("/metrics").text
    assert "memstream_events_total" in metrics
    assert 'memstream_retrieval_latency_seconds_count{phase="total"}' in metrics


def test_event_posted_to_rpc_becomes_retrievable(running: MemstreamProcess) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    text = "My new address is 42 Juniper Lane, Springfield; please ship the replacement there."
    with running.client() as http:
        response = http.post(
            "/v1/events",
            json={"events": [{"user_id": user, "session_id": "s1", "role": "user", "text": text}]},
        )
    assert response.status_code == 202, response.text
    event_id = response.json()["event_ids"][0]
    started = time.monotonic()

    def found() -> bool:
        items = retrieve(running, user, "Where should the replacement be shipped?")["items"]
        return any(event_id in i["source_event_ids"] for i in items)

    wait_for(found, 30, "the posted event in retrieval")
    assert time.monotonic() - started < 30


async def _dead_letters(settings: Settings, want: int) -> list[DeadLetter]:
    consumer = AIOKafkaConsumer(
        settings.kafka.topic("dlq"),
        bootstrap_servers=bootstrap_servers(settings.kafka.broker),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    letters: list[DeadLetter] = []
    try:
        deadline = time.monotonic() + 60
        while len(letters) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                letters.extend(DeadLetter.model_validate_json(r.value) for r in records)
    finally:
        await consumer.stop()
    return letters


def test_invalid_events_go_to_dlq_and_the_stream_goes_on(running: MemstreamProcess) -> None:
    settings = running.settings
    user = f"u-{uuid.uuid4().hex[:6]}"
    valid = {
        "event_id": f"{user}-ok",
        "tenant_id": "demo",
        "user_id": user,
        "session_id": "s1",
        "role": "user",
        "text": "The blender I bought last week makes a grinding noise.",
        "ts": "2026-11-02T10:00:00Z",
    }
    bad_json = b"{this is not json"
    bad_role = json.dumps({**valid, "event_id": f"{user}-bad", "role": "robot"}).encode()

    async def publish() -> None:
        publisher = EventPublisher(settings.kafka.broker)
        await publisher.start()
        try:
            key = f"demo:{user}"
            await publisher.publish_many(
                settings.kafka.topic("events"),
                [(key, bad_json), (key, bad_role), (key, json.dumps(valid).encode())],
            )
        finally:
            await publisher.close()

    asyncio.run(publish())
    letters = asyncio.run(_dead_letters(settings, 2))
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 2, reasons
    assert any("role" in r for r in reasons), reasons
    assert all(letter.stage == "encode" for letter in letters)

    def processed() -> bool:
        items = retrieve(running, user, "blender noise")["items"]
        return any(valid["event_id"] in i["source_event_ids"] for i in items)

    wait_for(processed, 30, "the valid event after the invalid ones")
