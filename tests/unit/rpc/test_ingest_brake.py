"""Backpressure on event intake: the pure decision, the 429 the endpoint answers (whole
requests refused, nothing published), and the client sending the same batch again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest
from fastapi import HTTPException
from prometheus_client import CollectorRegistry

from memstream.client import MemoryClient
from memstream.metrics import Metrics
from memstream.rpc.ingest import IngestBrake, IngestGuard
from memstream.rpc.server import ApiDeps, create_api
from memstream.settings import DEMO_API_KEY, DEMO_TENANT, KafkaSettings, RPCSettings
from memstream.streaming.broker import GroupLag


def brake(max_lag: int = 100) -> IngestBrake:
    return IngestBrake(max_lag, retry_after_min_ms=1000, retry_after_max_ms=5000, stale_after_s=5.0)


def test_under_or_at_the_bound_admits_past_it_refuses() -> None:
    b = brake(100)
    b.observe(0.0, GroupLag(100, 0, "g"), mark=0)
    assert b.check(0.1) is None
    b.observe(0.5, GroupLag(101, 0, "g"), mark=0)
    refusal = b.check(0.6)
    assert refusal is not None
    assert (refusal.lag, refusal.bound) == (101, 100)


def test_events_accepted_since_the_read_began_count_at_once() -> None:
    b = brake(100)
    mark = b.reading_begins()
    b.accepted(30)  # accepted while the read was in flight: maybe not in its end offsets
    b.observe(0.0, GroupLag(60, 0, "g"), mark)
    assert b.lag(0.0) == 90
    b.accepted(20)
    assert b.lag(0.1) == 110
    assert b.check(0.1) is not None
    b.observe(0.5, GroupLag(0, 110, "g"), b.reading_begins())  # the group caught up
    assert b.lag(0.5) == 0
    assert b.check(0.5) is None


def test_no_read_or_a_stale_one_admits() -> None:
    b = brake(10)
    b.accepted(1000)
    assert b.lag(0.0) is None
    assert b.check(0.0) is None
    b.observe(0.0, GroupLag(500, 0, "g"), b.reading_begins())
    assert b.check(4.9) is not None
    assert b.check(5.1) is None  # the broker has not answered for a while: not trusted


def test_a_zero_bound_never_refuses() -> None:
    b = brake(0)
    b.observe(0.0, GroupLag(10**6, 0, "g"), 0)
    assert b.check(0.0) is None
    assert b.lag(0.0) == 10**6


def test_the_hint_is_the_time_to_drain_the_excess_at_the_groups_pace() -> None:
    b = brake(100)
    b.observe(0.0, GroupLag(400, 1000, "g"), 0)
    refusal = b.check(0.0)
    assert refusal is not None
    assert refusal.retry_after_ms == 5000
    b.observe(1.0, GroupLag(400, 1100, "g"), 0)  # 100 events/s
    b.observe(2.0, GroupLag(350, 1200, "g"), 0)
    refusal = b.check(2.0)
    assert b.pace() == pytest.approx(100.0)
    assert refusal is not None
    assert refusal.retry_after_ms == pytest.approx(2500)
    b.observe(3.0, GroupLag(120, 1400, "g"), 0)
    refusal = b.check(3.0)
    assert refusal is not None
    assert refusal.retry_after_ms == 1000


def test_another_group_or_offsets_going_back_restart_the_pace() -> None:
    b = brake(100)
    b.observe(0.0, GroupLag(400, 1000, "a"), 0)
    b.observe(1.0, GroupLag(400, 1100, "a"), 0)
    assert b.pace() == pytest.approx(100.0)
    b.observe(2.0, GroupLag(400, 50, "b"), 0)
    assert b.pace() == 0.0
    b.observe(3.0, GroupLag(400, 90, "b"), 0)
    assert b.pace() == pytest.approx(40.0)
    b.observe(4.0, GroupLag(400, 10, "b"), 0)
    assert b.pace() == 0.0


class FakeSource:
    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.closed = False

    async def read(self) -> GroupLag:
        return GroupLag(self.lag, 0, "g")

    async def close(self) -> None:
        self.closed = True


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str | None, bytes]]]] = []

    async def publish_many(self, topic: str, items: list[tuple[str | None, bytes]]) -> None:
        self.sent.append((topic, items))


EVENT = {"user_id": "cust-1", "session_id": "s1", "role": "user", "text": "hello"}


async def test_the_endpoint_refuses_whole_requests_with_retry_after() -> None:
    metrics = Metrics(CollectorRegistry())
    source = FakeSource(lag=50)
    guard = IngestGuard(source, RPCSettings(ingest_max_lag=10), metrics)
    publisher = FakePublisher()
    api = create_api(
        ApiDeps(
            rpc=RPCSettings(),
            kafka=KafkaSettings(),
            retriever=cast(Any, None),
            publisher=cast(Any, publisher),
            metrics=metrics,
            ingest=guard,
        )
    )
    headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
    await guard.refresh()
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        refused = await http.post("/v1/events", json={"events": [EVENT] * 3}, headers=headers)
        assert refused.status_code == 429
        assert "ingest is behind: 50 events" in refused.json()["detail"]
        assert "bound 10" in refused.json()["detail"]
        assert refused.headers["Retry-After"] == "5"
        assert refused.headers["Retry-After-Ms"] == "5000"
        assert publisher.sent == []  # nothing of it accepted
        refused_total = metrics.ingest_refused.labels(DEMO_TENANT)._value.get()
        assert refused_total == 1
        assert metrics.ingest_lag._value.get() == 50

        source.lag = 0
        await guard.refresh()
        accepted = await http.post("/v1/events", json={"events": [EVENT] * 3}, headers=headers)
        assert accepted.status_code == 202
        assert len(publisher.sent) == 1
        assert len(publisher.sent[0][1]) == 3
        assert guard.lag() == 3  # counted before the next read shows them
    await guard.close()
    assert source.closed


def test_the_documented_responses_of_add_events_include_the_429() -> None:
    api = create_api(
        ApiDeps(
            rpc=RPCSettings(),
            kafka=KafkaSettings(),
            retriever=cast(Any, None),
            publisher=cast(Any, None),
            metrics=Metrics(CollectorRegistry()),
        )
    )
    spec = api.openapi()
    assert "429" in spec["paths"]["/v1/events"]["post"]["responses"]


def test_the_client_sends_the_same_batch_again_after_a_429() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            return httpx.Response(
                429, headers={"Retry-After-Ms": "10"}, json={"detail": "ingest is behind"}
            )
        ids = [e["event_id"] for e in bodies[-1]["events"]]
        return httpx.Response(202, json={"accepted": len(ids), "event_ids": ids})

    with MemoryClient("http://t", "k", transport=httpx.MockTransport(handler)) as client:
        answer = client.add("cust-1", "hello", session_id="s1")
    assert answer.accepted == 1
    assert len(bodies) == 2
    assert bodies[0] == bodies[1]  # same event id: the pipeline would drop a repeat


class FlakySource(FakeSource):
    def __init__(self) -> None:
        super().__init__(lag=0)
        self.failing = True
        self.reads = 0

    async def read(self) -> GroupLag:
        self.reads += 1
        if self.failing:
            raise ConnectionError("broker down")
        return GroupLag(500, 0, "g")


async def until(done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_reads_go_on_in_the_background_and_a_failing_broker_refuses_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics(CollectorRegistry())
    source = FlakySource()
    guard = IngestGuard(source, RPCSettings(ingest_max_lag=10, ingest_lag_interval_s=0.01), metrics)
    guard.start()
    try:
        await until(lambda: source.reads >= 3)
        assert guard.lag() is None
        guard.admit(DEMO_TENANT)  # unknown lag: admitted (publishing fails by itself)
        assert sum("reading the ingest lag failed" in r.message for r in caplog.records) == 1
        source.failing = False
        await until(lambda: guard.lag() is not None)
        with pytest.raises(HTTPException) as refused:
            guard.admit(DEMO_TENANT)
        assert refused.value.status_code == 429
    finally:
        await guard.close()
