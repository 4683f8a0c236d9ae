"""The pipelined loop (``Stage.run_pipelined``, the encode stage's): batch N+1 is prepared
while batch N is published, and at least once still holds. A batch is acked only after its
publish returned, batches are published and acked in order, and a batch whose publish had
not finished when the stage stopped is never acked (it is redelivered).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.schemas import Feedback
from memstream.streaming.stage import Received, Stage
from tests.unit.streams.stage_fakes import Feed
from tests.unit.test_dead_letter_reasons import FakeTopic
from tests.unit.test_stage import feedback, value


class Gates:
    """One event per name: a prepare or publish waits at its gate until the test opens it."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}

    def __getitem__(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def ids(items: list[Received[Feedback]]) -> str:
    return ",".join(i.value.feedback_id or "" for i in items)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def pipeline(metrics: Metrics, log: list[str], gates: Gates) -> tuple[Stage, Any, Any]:
    s = Stage(
        "encode", cast(Any, FakeTopic("memstream.events")), cast(Any, FakeTopic("dlq")), metrics
    )

    async def prepare(items: list[Received[Feedback]]) -> str:
        log.append(f"prepare {ids(items)}")
        await gates[f"prepare {ids(items)}"].wait()
        log.append(f"prepared {ids(items)}")
        return ids(items).upper()

    async def publish(items: list[Received[Feedback]], prepared: str) -> int:
        log.append(f"publish {prepared}")
        await gates[f"publish {ids(items)}"].wait()
        log.append(f"published {prepared}")
        return len(items)

    return s, prepare, publish


def started(metrics: Metrics) -> tuple[list[str], Gates, Feed, asyncio.Future[None]]:
    """The pipelined loop running over a feed: (what happened, in order; the gates; the
    feed; the loop)."""
    log: list[str] = []
    gates, feed = Gates(), Feed(log)
    s, prepare, publish = pipeline(metrics, log, gates)
    loop = asyncio.ensure_future(s.run_pipelined(Feedback, prepare, publish, feed.batches()))
    return log, gates, feed, loop


async def test_the_next_batch_is_prepared_while_one_is_published_and_acks_wait(
    metrics: Metrics,
) -> None:
    log, gates, feed, loop = started(metrics)

    feed.put("a", feedback(1), feedback(2))
    gates["prepare f1,f2"].set()
    await turns()
    assert log[-1] == "publish F1,F2"  # batch a is being published ...
    feed.put("b", feedback(3))
    await turns()
    assert log[-1] == "prepare f3"  # ... while batch b is prepared
    gates["prepare f3"].set()
    await turns()
    # b is ready, but a's publish has not returned: a is not acked, b not published.
    assert "ack a0" not in log
    assert "publish F3" not in log
    gates["publish f1,f2"].set()
    await turns()
    gates["publish f3"].set()
    feed.end()
    await asyncio.wait_for(loop, 1.0)
    assert log == [
        "prepare f1,f2",
        "prepared f1,f2",
        "publish F1,F2",
        "prepare f3",
        "prepared f3",
        "published F1,F2",
        "ack a0",
        "ack a1",
        "publish F3",  # only after a's publish returned and a was acked
        "published F3",
        "ack b0",
    ]
    assert value(metrics, "memstream_events_total", stage="encode", outcome="ok") == 3
    assert value(metrics, "memstream_batch_size_count", stage="encode") == 2


async def test_an_idle_stage_publishes_and_acks_without_waiting_for_the_next_batch(
    metrics: Metrics,
) -> None:
    log, gates, feed, loop = started(metrics)
    gates["prepare f1"].set()
    gates["publish f1"].set()
    feed.put("a", feedback(1))
    await turns()
    assert log[-1] == "ack a0"  # no batch b needed to push batch a out
    feed.end()
    await asyncio.wait_for(loop, 1.0)


async def test_a_batch_with_nothing_valid_is_acked_after_the_batch_before_it(
    metrics: Metrics,
) -> None:
    log, gates, feed, loop = started(metrics)
    gates["prepare f1"].set()
    feed.put("a", feedback(1))
    await turns()
    feed.put("b", b"{")  # dead-lettered at decode
    await turns()
    assert "ack b0" not in log  # a is still being published
    gates["publish f1"].set()
    feed.end()
    await asyncio.wait_for(loop, 1.0)
    assert log[-3:] == ["published F1", "ack a0", "ack b0"]


async def test_a_batch_whose_publish_had_not_finished_at_a_stop_is_never_acked(
    metrics: Metrics,
) -> None:
    log, gates, feed, loop = started(metrics)
    gates["prepare f1"].set()
    feed.put("a", feedback(1))
    feed.put("b", feedback(2))
    await turns()
    assert log[-1] == "prepare f2"  # a is being published, b prepared
    loop.cancel()  # the agent stops
    with pytest.raises(asyncio.CancelledError):
        await loop
    gates["publish f1"].set()
    gates["prepare f2"].set()
    await turns()
    assert not [line for line in log if line.startswith(("ack", "published"))]
