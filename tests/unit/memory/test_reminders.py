"""Reminders: open actions due now, not long overdue, with stable ids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstream.memory.reminders import due_reminders, reminder_id
from memstream.schemas import ConsolidatedMemory, OpenAction

T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
WEEK = timedelta(days=7)


def memory_with(*actions: OpenAction) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        title="Order A-1",
        memory_id="m1",
        tenant_id="acme",
        user_id="u1",
        key="entity:order:A-1",
        open_actions=list(actions),
        created_at=T0,
        updated_at=T0,
    )


def test_only_actions_due_within_the_window_are_reminded() -> None:
    due_now = OpenAction(text="Email the label", due=T0 - timedelta(minutes=5))
    later = OpenAction(text="Call back", due=T0 + timedelta(hours=1))
    undated = OpenAction(text="Follow up")
    ancient = OpenAction(text="Old promise", due=T0 - 2 * WEEK)
    reminders = due_reminders(memory_with(due_now, later, undated, ancient), T0, WEEK)
    assert [r.action for r in reminders] == [due_now]
    assert reminders[0].due == due_now.due
    assert (reminders[0].tenant_id, reminders[0].user_id, reminders[0].memory_id) == (
        "acme",
        "u1",
        "m1",
    )


def test_reminder_ids_are_stable_and_distinct() -> None:
    a = OpenAction(text="Email the label", due=T0)
    b = OpenAction(text="Email the label", due=T0 + timedelta(days=1))
    assert reminder_id("m1", a) == reminder_id("m1", a.model_copy())
    assert len({reminder_id("m1", a), reminder_id("m1", b), reminder_id("m2", a)}) == 3
    first = due_reminders(memory_with(a), T0, WEEK)[0]
    again = due_reminders(memory_with(a), T0 + timedelta(hours=1), WEEK)[0]
    assert first.reminder_id == again.reminder_id
