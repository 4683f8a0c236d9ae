"""``Topics.declare`` and the stages' wait on it: no stage produces before every topic is
declared, and a failed declaration does not keep the stages waiting for good."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.schemas import TOPICS
from memstream.streaming.broker import Topics
from memstream.streaming.stage import Stage
from tests.unit.test_dead_letter_reasons import FakeTopic


class DeclaredTopic(FakeTopic):
    """A topic whose declaration is logged, takes one loop turn, and may fail."""

    def __init__(self, name: str, log: list[str], *, fails: bool = False) -> None:
        super().__init__(name)
        self.log, self.fails = log, fails

    async def maybe_declare(self) -> None:
        await asyncio.sleep(0)
        if self.fails:
            raise ConnectionError(f"{self.name}: broker went away")
        self.log.append(self.name)


def topics(log: list[str], failing: str | None = None) -> Topics:
    made = {t.name: DeclaredTopic(t.name, log, fails=t.name == failing) for t in TOPICS}
    return Topics(**cast(dict[str, Any], made))


async def test_the_stages_wait_until_every_topic_is_declared() -> None:
    declared: list[str] = []
    all_topics = topics(declared)
    stage = Stage(
        "encode",
        all_topics.events,
        all_topics.dlq,
        Metrics(CollectorRegistry()),
        declared=all_topics.declared,
    )
    waiting = asyncio.ensure_future(stage.wait_declared())
    await asyncio.sleep(0)
    assert not waiting.done()
    await all_topics.declare()
    await asyncio.wait_for(waiting, 1.0)
    assert declared == [t.name for t in TOPICS]


async def test_a_failed_declaration_still_lets_the_stages_go_on() -> None:
    declared: list[str] = []
    all_topics = topics(declared, failing="dlq")
    with pytest.raises(ConnectionError, match="broker went away"):
        await all_topics.declare()
    assert all_topics.declared.is_set()
    assert "dlq" not in declared


async def test_a_stage_without_the_event_starts_at_once() -> None:
    topic = FakeTopic("memstream.feedback")
    stage = Stage("feedback", cast(Any, topic), cast(Any, topic), Metrics(CollectorRegistry()))
    await asyncio.wait_for(stage.wait_declared(), 1.0)
