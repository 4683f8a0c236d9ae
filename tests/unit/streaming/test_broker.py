"""The broker plumbing of the latency-bound stages: ``take_ready`` hands an idle consumer what
has arrived at once and gathers the next batch while it works, acking a batch once it is
done; the consumer's fetch wait (``ShortFetchConsumerThread``) is short while records flow,
the idle wait once none came for ``IDLE_AFTER_S`` or while a stage is backlogged."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any, cast

import faust
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from memstream.streaming import broker
from memstream.streaming.broker import (
    ShortFetchConsumerThread,
    Taken,
    backlogged,
    take_ready,
    take_ready_deferred,
)


async def turns(n: int = 30) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_an_idle_consumer_gets_what_arrived_and_the_next_batch_forms_while_it_works() -> None:
    app = faust.App("take-ready-test", web_enabled=False, autodiscover=False)
    batches: list[list[bytes]] = []
    acked_before: list[bool] = []  # when a batch was handed over: was the previous one acked?
    handed: list[Any] = []
    go_on = asyncio.Event()

    @app.agent(app.channel())
    async def consume(stream: faust.StreamT[bytes]) -> None:
        async for batch in take_ready(stream, 4, 1.0):
            acked_before.append(all(e.message.acked for e in handed))
            handed[:] = batch
            batches.append([e.value for e in batch])
            await go_on.wait()

    async with consume.test_context() as agent:
        puts = [asyncio.ensure_future(agent.put(b"a"))]
        await turns()
        assert batches == [[b"a"]]  # at once: no waiting for the batch to fill
        assert not any(e.message.acked for e in handed)  # in hand: not acked
        puts += [asyncio.ensure_future(agent.put(v)) for v in (b"b", b"c", b"d", b"e", b"f")]
        await turns()
        assert batches == [[b"a"]]  # the consumer is busy: the next batch gathers
        assert backlogged(app)  # ... and is full: short fetch waits would buy nothing
        go_on.set()
        await turns(100)
        assert not backlogged(app)
        # At most 4 gathered while it worked; the rest right after.
        assert batches == [[b"a"], [b"b", b"c", b"d", b"e"], [b"f"]]
        assert acked_before == [True, True, True]
        for put in puts:
            put.cancel()


async def test_deferred_batches_are_handed_over_unacked_until_their_consumer_acks() -> None:
    app = faust.App("take-ready-deferred-test", web_enabled=False, autodiscover=False)
    taken: list[Taken] = []

    @app.agent(app.channel())
    async def consume(stream: faust.StreamT[bytes]) -> None:
        async for batch in take_ready_deferred(stream, 4, 1.0):
            taken.append(batch)  # and asks for the next one at once, acking nothing

    async with consume.test_context() as agent:
        puts = [asyncio.ensure_future(agent.put(b"a"))]
        await turns()
        puts += [asyncio.ensure_future(agent.put(v)) for v in (b"b", b"c")]
        await turns()
        assert [[e.value for e in t.events] for t in taken] == [[b"a"], [b"b", b"c"]]
        # The second batch was handed over while the first was still in hand.
        assert not any(e.message.acked for t in taken for e in t.events)
        await taken[1].ack()  # acks are the consumer's: out of order is its own choice
        assert [e.message.acked for t in taken for e in t.events] == [False, True, True]
        await taken[0].ack()
        assert all(e.message.acked for t in taken for e in t.events)
        for put in puts:
            put.cancel()


async def test_a_batch_whose_handler_did_not_finish_is_never_acked() -> None:
    app = faust.App("take-ready-close-test", web_enabled=False, autodiscover=False)
    handed: list[Any] = []

    @app.agent(app.channel())
    async def consume(stream: faust.StreamT[bytes]) -> None:
        async with contextlib.aclosing(take_ready(stream, 4, 1.0)) as batches:
            async for batch in batches:
                handed.extend(batch)
                break  # the handler failed (or was cancelled): the generator is closed

    async with consume.test_context() as agent:
        put = asyncio.ensure_future(agent.put(b"a"))
        await turns()
        assert [e.value for e in handed] == [b"a"]
        assert not handed[0].message.acked  # redelivered after a restart, not skipped
        put.cancel()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


async def test_the_fetch_wait_is_short_while_records_flow_and_long_once_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[dict[str, list[int]]] = []

    async def fetched(self: Any, consumer: Any, partitions: Any, **kw: Any) -> Any:
        return answers.pop(0)

    clock = Clock()
    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "_fetch_records", fetched)
    monkeypatch.setattr(broker, "time", clock)
    thread = object.__new__(ShortFetchConsumerThread)  # no consumer thread started
    consumer = SimpleNamespace(_fetcher=SimpleNamespace(_fetch_max_wait_ms=0))
    waits = []
    for records, later_s in (({"tp": [1]}, 0.5), ({}, 0.4), ({}, 0.7), ({}, 0.1), ({"tp": [2]}, 0)):
        answers.append(records)
        await thread._fetch_records(cast(Any, consumer), set(), timeout=1.0)
        waits.append(consumer._fetcher._fetch_max_wait_ms)
        clock.now += later_s
    short, idle = (
        ShortFetchConsumerThread.fetch_max_wait_ms,
        ShortFetchConsumerThread.fetch_idle_wait_ms,
    )
    # records; 0.5 s quiet; 0.9 s; 1.6 s (idle); a record again
    assert waits == [short, short, short, idle, short]
    assert short < idle
    # Records flowing, but a stage of the app has a full batch waiting: the long wait.
    app = faust.App("fetch-wait-test", web_enabled=False, autodiscover=False)
    thread.app = app
    broker._BACKLOGGED[app] = {1}
    answers.append({"tp": [3]})
    await thread._fetch_records(cast(Any, consumer), set(), timeout=1.0)
    assert consumer._fetcher._fetch_max_wait_ms == idle
