"""A memory as context text: current state first, history after it newest first, every
time an event time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstream.memory.render import memory_text
from memstream.schemas import ConsolidatedMemory, Fact, HistoryEntry, OpenAction

T0 = datetime(2026, 11, 3, 14, 5, tzinfo=UTC)
DAY = timedelta(days=1)


def memory(**fields: object) -> ConsolidatedMemory:
    base: dict[str, object] = {
        "title": "Order A10293 — delivery",
        "memory_id": "m1",
        "tenant_id": "t",
        "user_id": "u",
        "key": "entity:order:A10293",
        "created_at": T0,
        "updated_at": T0,
    }
    return ConsolidatedMemory.model_validate(base | fields)


def test_one_line_each_in_reading_order() -> None:
    m = memory(
        status="Order A10293 has shipped.",
        facts=[
            Fact(text="Customer waited\na week.", ts=T0 - 2 * DAY),
            Fact(text="Prefers email.", attribute="preference:contact", ts=T0 - 3 * DAY),
            Fact(text="Order A10293 has shipped.", attribute="status", ts=T0 - DAY),
            Fact(text="Ordered a lamp.", ts=T0 - DAY),
        ],
        open_actions=[
            OpenAction(text="Call back about the refund.", due=T0 + DAY),
            OpenAction(text="Send the invoice."),
        ],
        history=[
            HistoryEntry(
                attribute="status", value="Delayed.", superseded_at=T0 - DAY, stated_at=T0 - 4 * DAY
            ),
            HistoryEntry(
                attribute="status",
                value="On hold.",
                superseded_at=T0 - 4 * DAY,
                stated_at=T0 - 5 * DAY,
            ),
            HistoryEntry(attribute="open_action", value="I will check.", superseded_at=T0 - DAY),
        ],
    )
    assert memory_text(m).splitlines() == [
        "Order A10293 — delivery (updated 2026-11-03 14:05)",
        "Status (2026-11-02): Order A10293 has shipped.",  # dated by the statement
        "- Prefers email. (2026-10-31)",  # current attribute values first
        "- Open: Call back about the refund. (due 2026-11-04 14:05)",
        "- Open: Send the invoice.",
        "- Ordered a lamp. (2026-11-02)",  # then facts, newest first
        "- Customer waited a week. (2026-11-01)",
        "- Closed (2026-11-02): I will check.",  # history last, newest first
        "- Earlier (2026-10-30): Delayed.",
        "- Earlier (2026-10-29): On hold.",
    ]


def test_what_was_said_after_the_state_goes_above_it() -> None:
    m = memory(
        status="Order A10293 arrived with a cracked handle.",
        facts=[
            Fact(text="Order A10293 arrived with a cracked handle.", attribute="status", ts=T0),
            Fact(text="My kettle turned up at last.", ts=T0 + 9 * DAY),
            Fact(text="A replacement went out on Monday.", ts=T0 + 4 * DAY),
            Fact(text="Ordered a kettle.", ts=T0 - DAY),
        ],
    )
    assert memory_text(m).splitlines()[1:] == [
        "- My kettle turned up at last. (2026-11-12)",  # whatever its words: newer, so first
        "- A replacement went out on Monday. (2026-11-07)",
        "Status (2026-11-03): Order A10293 arrived with a cracked handle.",
        "- Ordered a kettle. (2026-11-02)",
    ]


def test_facts_without_times_and_a_memory_without_status() -> None:
    m = memory(facts=[Fact(text="Customer waited a week.")])
    assert memory_text(m).splitlines() == [
        "Order A10293 — delivery (updated 2026-11-03 14:05)",
        "- Customer waited a week.",
    ]


def test_history_is_capped_to_the_newest() -> None:
    history = [
        HistoryEntry(attribute="status", value=f"state {i}", superseded_at=T0 - i * DAY)
        for i in range(1, 7)
    ]
    lines = memory_text(memory(history=history)).splitlines()
    assert [x for x in lines if x.startswith("- Earlier")] == [
        "- Earlier (2026-11-02): state 1",
        "- Earlier (2026-11-01): state 2",
        "- Earlier (2026-10-31): state 3",
    ]
