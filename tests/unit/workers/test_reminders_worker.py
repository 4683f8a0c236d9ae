"""The reminders worker reads only the memories its due-time index names, over fakes (the
short-term state fake and qdrant-client's in-process ``:memory:`` store), and still sends
each due reminder once; ``due_times`` is the one place the index is derived from."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memstream.memory.reminders import due_times
from memstream.schemas import ConsolidatedMemory, OpenAction, Reminder
from memstream.stores.longterm import LongTermStore, memory_point_id
from memstream.workers.reminders import ReminderWorker
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"
HOUR = timedelta(hours=1)


class NoScan:
    """The store, except that a full scan fails and what ``due_between`` hands out is
    counted: the worker must never read every memory."""

    def __init__(self, store: LongTermStore) -> None:
        self._store = store
        self.read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def scan(self, limit: int, offset: str | None = None) -> Any:
        raise AssertionError("the reminders worker scanned every memory")

    async def due_between(
        self, since: datetime, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        page, next_offset = await self._store.due_between(since, until, limit, offset)
        self.read += len(page)
        return page, next_offset


def memory(user: str, key: str, actions: Sequence[OpenAction]) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        memory_id=memory_point_id(TENANT, user, key),
        tenant_id=TENANT,
        user_id=user,
        key=key,
        title=key,
        open_actions=list(actions),
        created_at=T0,
        updated_at=T0,
    )


async def put(store: LongTermStore, *memories: ConsolidatedMemory) -> None:
    await store.upsert([(m, ENCODER.encode([m.title])[0]) for m in memories])


class Outbox:
    def __init__(self) -> None:
        self.sent: list[Reminder] = []

    async def __call__(self, reminder: Reminder) -> None:
        self.sent.append(reminder)


def test_due_times_are_the_open_actions_dates_ascending_and_distinct() -> None:
    actions = [
        OpenAction(text="b", due=T0 + HOUR),
        OpenAction(text="undated"),
        OpenAction(text="a", due=T0),
        OpenAction(text="again", due=T0 + HOUR),
    ]
    assert due_times(memory("u1", "k", actions)) == [T0.timestamp(), (T0 + HOUR).timestamp()]
    assert due_times(memory("u1", "k", [OpenAction(text="undated")])) == []


async def test_a_pass_reads_only_the_memories_with_something_due(longterm: LongTermStore) -> None:
    undated = [memory(f"u{i}", f"k{i}", [OpenAction(text="some day")]) for i in range(30)]
    future = [
        memory(f"f{i}", "k", [OpenAction(text="later", due=T0 + 48 * HOUR)]) for i in range(5)
    ]
    due = memory("u-due", "k", [OpenAction(text="Call back", due=T0 - HOUR)])
    await put(longterm, *undated, *future, due)
    store = NoScan(longterm)
    worker = ReminderWorker(longterm=store, state=FakeShortTermState(), max_late=timedelta(days=1))
    outbox = Outbox()
    assert await worker.emit_due(T0, outbox) == 1
    assert store.read == 1  # of 36 memories
    assert [(r.user_id, r.action.text) for r in outbox.sent] == [("u-due", "Call back")]
    assert await worker.emit_due(T0 + HOUR, outbox) == 0  # claimed once, never again
    assert await worker.emit_due(T0 + 48 * HOUR, outbox) == 5


async def test_a_later_action_is_found_after_an_earlier_one_went_stale(
    longterm: LongTermStore,
) -> None:
    m = memory(
        "u1",
        "k",
        [OpenAction(text="long ago", due=T0 - 30 * 24 * HOUR), OpenAction(text="now", due=T0)],
    )
    await put(longterm, m)
    worker = ReminderWorker(longterm, FakeShortTermState(), max_late=timedelta(days=7))
    outbox = Outbox()
    assert await worker.emit_due(T0, outbox) == 1
    assert [r.action.text for r in outbox.sent] == ["now"]


async def test_a_redated_or_done_action_is_reindexed_by_its_upsert(
    longterm: LongTermStore,
) -> None:
    refund = OpenAction(text="Refund", due=T0)
    label = OpenAction(text="Email the label", due=T0 + HOUR)
    m = memory("u1", "k", [refund, label])
    await put(longterm, m)
    # Re-consolidated before either fell due: the refund moved a day on, the label is done.
    moved = refund.model_copy(update={"due": T0 + 24 * HOUR})
    await put(longterm, m.model_copy(update={"open_actions": [moved]}))
    worker = ReminderWorker(longterm, FakeShortTermState(), max_late=timedelta(days=1))
    outbox = Outbox()
    assert await worker.emit_due(T0 + 2 * HOUR, outbox) == 0
    assert await worker.emit_due(T0 + 24 * HOUR, outbox) == 1
    assert [(r.action.text, r.due) for r in outbox.sent] == [("Refund", T0 + 24 * HOUR)]
    # A new dated action on a memory that had none is found too.
    await put(longterm, memory("u2", "k", [OpenAction(text="Ship", due=T0 + 25 * HOUR)]))
    assert await worker.emit_due(T0 + 25 * HOUR, outbox) == 1
    assert outbox.sent[-1].user_id == "u2"
