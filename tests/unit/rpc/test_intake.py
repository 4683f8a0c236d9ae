"""The RPC's intake journal over the fake state: a start re-publishes exactly the journaled
events not memorized, pruning deletes a segment once its events are memorized (or stamped
before their user's forget), and the metrics say what the journal holds."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from memstream.memory.turns import stored_turn
from memstream.metrics import Metrics
from memstream.rpc.intake import Intake, journal_folder, settled
from memstream.schemas import InteractionEvent
from memstream.settings import Settings
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import put_hot

TS = datetime(2026, 12, 1, tzinfo=UTC)


def event(i: int, user: str = "u1") -> InteractionEvent:
    return InteractionEvent(
        event_id=f"e{i}",
        tenant_id="acme",
        user_id=user,
        session_id="s1",
        role="user",
        text=f"order A-{i} is late",
        ts=TS,
    )


async def memorize(state: FakeShortTermState, e: InteractionEvent) -> None:
    await put_hot(state, e.tenant_id, e.user_id, stored_turn(e))


class Publisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, bytes]] = []

    async def partitions(self, topic: str) -> int:
        return 2

    async def publish_many(self, topic: str, items: list[tuple[str | None, bytes]]) -> None:
        self.sent += [(topic, k, v) for k, v in items]


def intake(tmp_path: Path, state: FakeShortTermState, publisher: Publisher) -> Intake:
    settings = Settings(
        data_dir=tmp_path,
        rpc={"journal_settle_s": 0, "journal_segment_age_s": 0.001},  # type: ignore[arg-type]
    )
    publisher_: Any = publisher
    metrics = Metrics(CollectorRegistry())
    return Intake(
        settings.rpc,
        data_dir=settings.data_dir,
        topic=settings.kafka.topic("events"),
        state=lambda: state,
        publisher=publisher_,
        metrics=metrics,
    )


async def test_a_start_republishes_the_journaled_events_not_memorized(tmp_path: Path) -> None:
    state = FakeShortTermState()
    first = intake(tmp_path, state, Publisher())
    assert await first.start() == 0
    events = [event(1), event(2, "u2"), event(3)]
    await first.append([e.model_dump_json().encode() for e in events])
    await first.append([events[0].model_dump_json().encode()])  # a retried request
    assert first.metrics.journal_segments._value.get() >= 1
    assert first.metrics.journal_bytes._value.get() > 0
    await first.close()  # or a SIGKILL: the lines were fsynced before the 202
    await memorize(state, events[1])

    publisher = Publisher()
    second = intake(tmp_path, state, publisher)
    assert await second.start() == 2
    topic = Settings().kafka.topic("events")
    assert [(t, k) for t, k, _ in publisher.sent] == [(topic, "acme:u1"), (topic, "acme:u1")]
    assert [InteractionEvent.model_validate_json(v) for _, _, v in publisher.sent] == [
        events[0],
        events[2],
    ]
    assert second.metrics.journal_recovered._value.get() == 2
    await second.close()


async def test_pruning_deletes_segments_once_their_events_are_memorized(tmp_path: Path) -> None:
    state = FakeShortTermState()
    journal = intake(tmp_path, state, Publisher())
    await journal.start()
    events = [event(1), event(2)]
    await journal.append([e.model_dump_json().encode() for e in events])
    await journal.prune()  # closes the segment (older than its age); e1, e2 not memorized
    assert journal.journal.segments == 1
    await memorize(state, events[0])
    await memorize(state, events[1])
    await journal.prune()  # the first settled look
    assert journal.journal.segments == 1
    await journal.prune()  # the second (journal_settle_s 0)
    assert journal.journal.segments == 0
    assert list(journal_folder(tmp_path).glob("*.jsonl")) == []
    assert journal.metrics.journal_bytes._value.get() == 0
    await journal.close()


async def test_a_forgotten_users_events_are_settled_when_looked_at_thoroughly() -> None:
    state = FakeShortTermState()
    events = [event(1), event(2, "u2"), event(3, "u3")]
    await memorize(state, events[2])
    await state.mark_forgotten("acme", "u1", TS.timestamp())  # at the event's time: dropped
    await state.mark_forgotten("acme", "u2", TS.timestamp() - 1)  # before it: memorized later
    assert await settled(state, events, thorough=False) == [False, False, True]
    assert await settled(state, events, thorough=True) == [True, False, True]
