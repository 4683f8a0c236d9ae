"""Backpressure on ``POST /v1/events`` against the real broker and Valkey.

The RPC runs alone (``--roles serve``) with a tiny ``rpc.ingest_max_lag`` and no stream
processor, so nothing is memorized: posting goes on until the lag, read from the broker,
passes the bound and the RPC answers 429 with ``Retry-After`` and what to do. Then the
processors start: every accepted event is memorized exactly once (none of a refused
request is), the lag drains, and posting is accepted again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from memstream.launch import Process, on_free_port, wait_for, with_overrides
from memstream.roles import Role
from memstream.settings import DEMO_API_KEY, Settings
from memstream.stores.embedded import EmbeddedBroker
from memstream.streaming.broker import ConsumerGroupLag, EventPublisher, GroupLag, bootstrap_servers
from memstream.wiring import open_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BOUND = 20
USERS = [f"bp-u{i}" for i in range(4)]
SERVE: frozenset[Role] = frozenset({"serve"})
PROCESS: frozenset[Role] = frozenset({"process"})


def batch(n: int, round_: int) -> list[dict[str, str]]:
    return [
        {
            "event_id": uuid.uuid4().hex,
            "user_id": USERS[(round_ + i) % len(USERS)],
            "session_id": "bp-s1",
            "role": "user",
            "text": f"order B-{round_:03d}{i} has not arrived yet, round {round_}",
        }
        for i in range(n)
    ]


def stored(settings: Settings) -> dict[str, list[str]]:
    async def read() -> dict[str, list[str]]:
        state = open_state(
            settings.redis, settings.redis.url, cluster_cache_users=settings.cluster.cache_users
        )
        try:
            return {u: await state.timeline_ids("demo", u) for u in USERS}
        finally:
            await state.close()

    return asyncio.run(read())


def test_events_past_the_lag_bound_get_429_and_no_accepted_event_is_lost(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    # Reads every 0.5 s (trusted for 5 s): on a loaded 2-core machine a read of the broker
    # can take over a second, and a stale reading admits rather than refuses.
    settings = settings_factory(rpc={"ingest_max_lag": BOUND, "ingest_lag_interval_s": 0.5})
    serve = Process(
        on_free_port(with_overrides(settings, {"data_dir": tmp_path / "serve"}), SERVE), SERVE
    ).start()
    worker: Process | None = None
    try:
        http = httpx.Client(
            base_url=serve.url, headers={"Authorization": f"Bearer {DEMO_API_KEY}"}, timeout=10
        )
        accepted: dict[str, str] = {}  # event id -> user
        refused: httpx.Response | None = None
        for round_ in range(200):
            events = batch(5, round_)
            answer = http.post("/v1/events", json={"events": events})
            if answer.status_code == 429:
                refused = answer
                break
            assert answer.status_code == 202, answer.text
            accepted.update((e["event_id"], e["user_id"]) for e in events)
            time.sleep(0.02)
        assert refused is not None, f"no 429 after {len(accepted)} events"
        # Refused at the bound, not much later (this process counts its own) and at most a
        # batch early (an event landing while a read is under way is counted twice).
        assert BOUND - 5 <= len(accepted) <= BOUND + 5
        assert int(refused.headers["Retry-After"]) >= 1
        assert int(refused.headers["Retry-After-Ms"]) >= 1000
        detail = refused.json()["detail"]
        assert "ingest is behind" in detail
        assert f"bound {BOUND}" in detail
        assert "none of this request's events were accepted" in detail
        ready = http.get("/readyz").json()
        assert ready["ready"] is True  # lag refuses intake, never readiness
        assert ready["ingest_lag"] >= BOUND
        assert ready["ingest_max_lag"] == BOUND
        page = http.get("/metrics").text
        assert 'memstream_rpc_ingest_refused_total{tenant="demo"} 1.0' in page
        # The bound is read from the broker, not only this process's count: still refused.
        time.sleep(1.0)
        assert http.post("/v1/events", json={"events": batch(1, 999)}).status_code == 429

        worker_settings = with_overrides(settings, {"data_dir": tmp_path / "worker"})
        worker = Process(on_free_port(worker_settings, PROCESS), PROCESS).start()
        expected: dict[str, set[str]] = defaultdict(set)
        for event_id, user in accepted.items():
            expected[user].add(event_id)

        def memorized() -> bool:
            return sum(len(ids) for ids in stored(settings).values()) >= len(accepted)

        wait_for(memorized, 120, "every accepted event to be memorized")

        def drained() -> bool:
            lag = http.get("/readyz").json()["ingest_lag"]
            return lag is not None and lag <= BOUND

        wait_for(drained, 60, "the ingest lag read from the processors' group to drain")
        more = batch(3, 1000)
        answer = http.post("/v1/events", json={"events": more})
        assert answer.status_code == 202, answer.text
        for e in more:
            expected[e["user_id"]].add(e["event_id"])
        total = len(accepted) + len(more)
        wait_for(
            lambda: sum(len(ids) for ids in stored(settings).values()) >= total,
            60,
            "the events posted after the drain to be memorized",
        )
        time.sleep(1.0)  # a duplicate would show up late
        found = stored(settings)
        for user in USERS:
            assert len(found[user]) == len(set(found[user])), f"{user}: a turn stored twice"
            assert set(found[user]) == expected[user], f"{user}: lost or unexpected turns"
        http.close()
    finally:
        if worker is not None:
            worker.stop()
        serve.stop()


async def test_the_group_lag_is_read_from_the_broker_without_joining(
    broker: EmbeddedBroker,
) -> None:
    topic, other = f"lag-{uuid.uuid4().hex[:8]}", f"lag-{uuid.uuid4().hex[:8]}"
    live, stale = f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    reader = ConsumerGroupLag(broker.url, [stale, live], [topic, other])
    publisher = EventPublisher(broker.url)
    await publisher.start()
    await reader.start()
    try:
        assert (await reader.read()).lag == 0  # no topic yet: nothing behind
        await publisher.publish_many(topic, [(f"k{i}", b"x") for i in range(10)])
        # No group yet: all of it (once the tail consumer's first fetch brought the
        # watermarks: Tansu's ListOffsets says less).
        first = await settled(reader, lambda r: r.lag == 10)
        assert first.group is None
        await commit(broker, stale, topic, 2)
        await commit(broker, live, topic, 7)
        read = await settled(reader, lambda r: r.group is not None)
        assert read.group == live  # the group that lags least is the one reading
        assert read.lag == 3
        assert read.committed == 7
    finally:
        await reader.close()
        await publisher.close()


async def settled(reader: ConsumerGroupLag, done: Callable[[GroupLag], bool]) -> GroupLag:
    for _ in range(50):
        read = await reader.read()
        if done(read):
            return read
        await asyncio.sleep(0.1)
    return read


async def commit(broker: EmbeddedBroker, group: str, topic: str, records: int) -> None:
    """A member of ``group`` that reads ``records`` records of ``topic`` and commits them."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(broker.url),
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not tps:
            await consumer._client.add_topic(topic)
            tps = [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])
            ]
        consumer.assign(tps)
        taken = 0
        offsets: dict[TopicPartition, int] = {}
        while taken < records:
            batch = await consumer.getmany(timeout_ms=1000, max_records=records - taken)
            for tp, messages in batch.items():
                taken += len(messages)
                offsets[tp] = messages[-1].offset + 1
        await consumer.commit(offsets)
    finally:
        await consumer.stop()
