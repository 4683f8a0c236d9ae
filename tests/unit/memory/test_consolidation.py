"""The extractive consolidator and the merge rule: status, supersession, sources, idempotency."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.memory.consolidation import consolidate_extractive, merge_memory, parse_due
from memstream.schemas import ConsolidatedMemory, Fact, MemoryContent, OpenAction, StoredTurn

KEY = "entity:order:A10293"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)  # a Monday


def turn(n: int, session: str, role: str, text: str, hours: float) -> StoredTurn:
    return StoredTurn(
        event_id=f"e{n}", session_id=session, role=role, text=text, ts=T0 + timedelta(hours=hours)
    )


# One order complaint over three sessions: delayed, a promise, then shipped.
SESSION_1 = [
    turn(
        1, "s1", "user", "Hi, my order A10293 hasn't arrived. The delivery is delayed by a week!", 0
    ),
    turn(
        2,
        "s1",
        "assistant",
        "Sorry! Order A10293 is delayed at the warehouse. I will follow up within 24 hours.",
        0.1,
    ),
]
SESSION_2 = [
    turn(3, "s2", "user", "Any news on order A10293? The delivery is still delayed.", 26),
    turn(4, "s2", "assistant", "We will call you back by Friday about the delayed delivery.", 26.2),
]
SESSION_3 = [
    turn(
        5,
        "s3",
        "assistant",
        "Good news: order A10293 has shipped and will arrive on 2026-11-07.",
        50,
    ),
    turn(6, "s3", "user", "thanks", 50.1),
]
ALL = SESSION_1 + SESSION_2 + SESSION_3


def merge(
    existing: ConsolidatedMemory | None,
    fresh: MemoryContent,
    sources: list[str],
    now: datetime,
    strength: float = 1.0,
) -> ConsolidatedMemory:
    return merge_memory(
        existing,
        fresh,
        memory_id="m1",
        tenant_id="t1",
        user_id="u1",
        key=KEY,
        source_event_ids=sources,
        strength=strength,
        now=now,
    )


def ids(turns: list[StoredTurn]) -> list[str]:
    return [t.event_id for t in turns]


def test_order_complaint_over_three_sessions() -> None:
    now1 = T0 + timedelta(hours=27)
    first = merge(
        None,
        consolidate_extractive(KEY, SESSION_1 + SESSION_2, now1),
        ids(SESSION_1 + SESSION_2),
        now1,
    )
    assert first.version == 1
    assert first.created_at == first.updated_at == now1
    assert "delayed" in first.status
    assert first.title == "Order A10293 — delivery"  # the entity and the topic, no filler
    assert len(first.title) <= 80

    now2 = T0 + timedelta(hours=51)
    fresh = consolidate_extractive(KEY, ALL, now2)
    memory = merge(first, fresh, ids(ALL), now2)

    # newest state wins; the old one is kept in history, not lost
    assert "shipped" in memory.status
    assert [h.value for h in memory.history if h.attribute == "status"] == [first.status]
    # superseded when the new state was stated (event time), not when memstream merged
    assert all(h.superseded_at == ALL[4].ts for h in memory.history)
    assert [h.stated_at for h in memory.history] == [ALL[2].ts]
    status_facts = [f for f in memory.facts if f.attribute == "status"]
    assert len(status_facts) == 1
    assert "shipped" in status_facts[0].text
    assert status_facts[0].source_event_ids == ["e5"]
    assert status_facts[0].ts == ALL[4].ts

    assert memory.source_event_ids == ids(ALL)
    assert memory.created_at == now1
    assert memory.updated_at == now2
    assert memory.version == 2
    assert memory.memory_id == "m1"
    assert memory.key == KEY

    due = {a.text: a.due for a in memory.open_actions}
    assert due["I will follow up within 24 hours."] == ALL[1].ts + timedelta(hours=24)
    friday = datetime(2026, 11, 6, 23, 59, 59, tzinfo=UTC)
    assert due["We will call you back by Friday about the delayed delivery."] == friday

    # one entry per turn with a state or an entity (not the bare promise e4, not "thanks")
    assert [e.event_id for e in memory.timeline] == ["e1", "e2", "e3", "e5"]
    assert "order:A10293" in memory.keys
    assert "date:2026-11-07" in memory.keys
    assert len(memory.facts) <= 6
    assert all(f.source_event_ids and f.ts is not None for f in memory.facts)


def test_extractive_is_deterministic_and_order_free() -> None:
    now = T0 + timedelta(days=3)
    assert consolidate_extractive(KEY, ALL, now) == consolidate_extractive(KEY, ALL[::-1], now)


def test_merge_twice_is_idempotent() -> None:
    now = T0 + timedelta(days=3)
    fresh = consolidate_extractive(KEY, ALL, now)
    once = merge(None, fresh, ids(ALL), now)
    twice = merge(once, fresh, ids(ALL), now + timedelta(hours=1))
    assert twice is once  # same version, same updated_at

    grown = merge(once, fresh, [*ids(ALL), "e7"], now + timedelta(hours=2))
    assert grown.version == 2
    assert grown.source_event_ids == [*ids(ALL), "e7"]
    assert merge(grown, fresh, ["e7", "e1"], now + timedelta(hours=3)) is grown


def test_repeated_reconsolidation_is_stable() -> None:
    now1, now2 = T0 + timedelta(hours=27), T0 + timedelta(hours=51)
    first = merge(None, consolidate_extractive(KEY, ALL[:4], now1), ids(ALL[:4]), now1)
    fresh = consolidate_extractive(KEY, ALL, now2)
    second = merge(first, fresh, ids(ALL), now2)
    assert merge(second, fresh, ids(ALL), now2 + timedelta(hours=1)) is second


def test_older_value_does_not_supersede_newer_but_is_kept() -> None:
    now = T0 + timedelta(days=5)
    new = Fact(
        text="Prefers email contact.", attribute="preference:contact", ts=T0 + timedelta(days=2)
    )
    old = Fact(text="Prefers phone calls.", attribute="preference:contact", ts=T0)
    memory = merge(None, MemoryContent(title="Contact", facts=[new]), ["e1"], now)
    memory = merge(
        memory, MemoryContent(title="Contact", facts=[old]), ["e0"], now + timedelta(hours=1)
    )
    assert [f.text for f in memory.facts] == ["Prefers email contact."]
    assert [(h.attribute, h.value) for h in memory.history] == [
        ("preference:contact", "Prefers phone calls.")
    ]
    again = merge(
        memory, MemoryContent(title="Contact", facts=[old]), ["e0"], now + timedelta(hours=2)
    )
    assert again is memory


def test_merge_dedups_facts_by_normalised_text_and_unions_sources() -> None:
    now = T0 + timedelta(days=1)
    a = MemoryContent(
        title="x", facts=[Fact(text="Order A10293 is late.", source_event_ids=["e1"])], keys=["k1"]
    )
    b = MemoryContent(
        title="x",
        facts=[Fact(text="order a10293 is LATE", source_event_ids=["e2"])],
        keys=["k2", "k1"],
    )
    memory = merge(merge(None, a, ["e1"], now), b, ["e2"], now + timedelta(hours=1))
    assert len(memory.facts) == 1
    assert memory.facts[0].source_event_ids == ["e1", "e2"]
    assert memory.keys == ["k1", "k2"]


def test_answered_open_action_moves_to_history() -> None:
    now = T0 + timedelta(days=1)
    promise = MemoryContent(
        title="Refund",
        open_actions=[OpenAction(text="I will process the refund within 2 days.", event_id="e1")],
        facts=[Fact(text="Customer asked for a refund.", source_event_ids=["e1"], ts=T0)],
    )
    memory = merge(None, promise, ["e1"], now)
    assert len(memory.open_actions) == 1
    done = MemoryContent(
        title="Refund",
        facts=[
            Fact(
                text="The refund is completed.", source_event_ids=["e2"], ts=T0 + timedelta(days=1)
            )
        ],
    )
    memory = merge(memory, done, ["e2"], now + timedelta(hours=1))
    assert memory.open_actions == []
    assert ("open_action", "I will process the refund within 2 days.") in [
        (h.attribute, h.value) for h in memory.history
    ]
    # re-extracting the old promise does not reopen it
    assert merge(memory, promise, ["e1"], now + timedelta(hours=2)) is memory


def test_strength_takes_the_max_on_merge() -> None:
    now = T0 + timedelta(days=1)
    fresh = MemoryContent(title="x", summary="s")
    memory = merge(None, fresh, ["e1"], now, strength=0.4)
    assert memory.strength == 0.4
    assert merge(memory, fresh, ["e1"], now, strength=0.2) is memory
    assert merge(memory, fresh, ["e1"], now, strength=0.9).strength == 0.9


def test_chinese_turns() -> None:
    turns = [
        turn(1, "s1", "user", "我的订单A10293还没到，物流延迟了。", 0),
        turn(2, "s1", "assistant", "非常抱歉，我会跟进物流情况，24小时内回电。", 0.2),
        turn(3, "s2", "assistant", "您的订单A10293已发货，预计明天送达。", 30),
    ]
    content = consolidate_extractive(KEY, turns, T0 + timedelta(days=2))
    assert "已发货" in content.status
    assert [a.text for a in content.open_actions] == ["非常抱歉，我会跟进物流情况，24小时内回电。"]
    assert content.open_actions[0].due == turns[1].ts + timedelta(hours=24)
    assert content.open_actions[0].event_id == "e2"
    assert "order:A10293" in content.keys
    assert [e.event_id for e in content.timeline] == ["e1", "e3"]

    first = merge(None, consolidate_extractive(KEY, turns[:2], T0), ids(turns[:2]), T0)
    later = merge(first, content, ids(turns), T0 + timedelta(days=2))
    assert "延迟" in later.history[0].value
    assert later.history[0].attribute == "status"


def test_low_information_turns_give_a_usable_memory() -> None:
    content = consolidate_extractive("topic:c7", [turn(1, "s1", "user", "ok thanks", 0)], T0)
    assert content.title
    assert content.facts == []
    assert content.status == ""
    assert consolidate_extractive("topic:c7", [], T0).title == "topic:c7"


def test_attributes_are_rule_based() -> None:
    turns = [
        turn(1, "s1", "user", "I prefer email over phone calls for updates.", 0),
        turn(2, "s1", "user", "My new address is 12 Baker Street, London.", 0.1),
    ]
    attributes = {f.attribute for f in consolidate_extractive("topic:c1", turns, T0).facts}
    assert attributes == {"preference:contact", "address"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We will reply within 24 hours.", T0 + timedelta(hours=24)),
        ("I'll check again in 3 days.", T0 + timedelta(days=3)),
        ("Expect it within two business days.", T0 + timedelta(days=2)),
        ("We will call you back by tomorrow.", datetime(2026, 11, 3, 23, 59, 59, tzinfo=UTC)),
        ("A refund by Friday.", datetime(2026, 11, 6, 23, 59, 59, tzinfo=UTC)),
        ("Delivery on 2026-11-20.", datetime(2026, 11, 20, 23, 59, 59, tzinfo=UTC)),
        ("Technician at 2026-11-20 14:30.", datetime(2026, 11, 20, 14, 30, tzinfo=UTC)),
        ("我们会在3天内处理。", T0 + timedelta(days=3)),
        ("我会在两个工作日内回电。", T0 + timedelta(days=2)),
        ("周五前给您回复。", datetime(2026, 11, 6, 23, 59, 59, tzinfo=UTC)),
        ("明天联系您。", datetime(2026, 11, 3, 23, 59, 59, tzinfo=UTC)),
        ("We will look into it.", None),
        ("Bad date 2026-13-45.", None),
    ],
)
def test_parse_due(text: str, expected: datetime | None) -> None:
    assert parse_due(text, T0) == expected


POOL = [
    *ALL,
    turn(7, "s4", "user", "我的订单A10293还没到，物流延迟了。", 60),
    turn(8, "s4", "assistant", "订单A10293已退款，我们将在3天内到账。", 61),
    turn(9, "s5", "user", "I prefer phone calls. My address is 1 Main Street.", 70),
    turn(10, "s5", "assistant", "The refund for order A10293 is completed.", 71),
]


@settings(max_examples=60, deadline=None, database=None)
@given(
    first=st.lists(st.sampled_from(POOL), min_size=1, max_size=6, unique_by=lambda t: t.event_id),
    second=st.lists(st.sampled_from(POOL), min_size=1, max_size=6, unique_by=lambda t: t.event_id),
)
def test_merge_loses_nothing_and_is_idempotent(
    first: list[StoredTurn], second: list[StoredTurn]
) -> None:
    now1, now2 = T0 + timedelta(days=4), T0 + timedelta(days=5)
    old = merge(None, consolidate_extractive(KEY, first, now1), ids(first), now1)
    fresh = consolidate_extractive(KEY, second, now2)
    new = merge(old, fresh, ids(second), now2)
    kept = {f.text for f in new.facts} | {h.value for h in new.history}
    # a plain fact may go only when the fresh content re-read all its turns (a newer reading)
    reread = set(ids(second))
    assert all(f.text in kept or set(f.source_event_ids) <= reread for f in old.facts)
    assert all(f.text in kept for f in old.facts if f.attribute)
    assert not old.status or old.status == new.status or old.status in kept
    assert {a.text for a in old.open_actions} <= {a.text for a in new.open_actions} | kept
    assert set(old.source_event_ids) | set(ids(second)) == set(new.source_event_ids)
    assert [(e.ts, e.event_id) for e in new.timeline] == sorted(
        {(e.ts, e.event_id) for e in new.timeline}
    )
    assert merge(new, fresh, ids(second), now2 + timedelta(hours=1)) is new


# --- memories that are right ------------------------------------------------------------


def test_the_latest_statement_wins_whatever_order_the_batches_come_in() -> None:
    late = consolidate_extractive(KEY, SESSION_3, T0)
    early = consolidate_extractive(KEY, SESSION_1, T0)
    memory = merge(merge(None, late, ids(SESSION_3), T0), early, ids(SESSION_1), T0)
    assert "shipped" in memory.status
    [old] = [h for h in memory.history if h.attribute == "status"]
    assert "delayed" in old.value
    assert old.stated_at == SESSION_1[1].ts
    assert old.superseded_at == SESSION_3[0].ts


def test_a_superseded_value_in_one_batch_is_kept_as_history_with_its_time() -> None:
    turns = [
        turn(1, "s1", "user", "Please ship it to my address, Gartenweg 3, Leipzig.", 0),
        turn(2, "s2", "user", "I have moved: my new address is Lindenstrasse 12, Berlin.", 48),
    ]
    memory = merge(None, consolidate_extractive("topic:c1", turns, T0), ids(turns), T0)
    assert [f.text for f in memory.facts if f.attribute == "address"] == [turns[1].text]
    [old] = memory.history
    assert (old.attribute, old.value) == ("address", turns[0].text)
    assert (old.stated_at, old.superseded_at) == (turns[0].ts, turns[1].ts)


def test_small_talk_and_boilerplate_never_become_facts() -> None:
    turns = [
        turn(1, "s1", "user", "hi", 0),
        turn(
            2,
            "s1",
            "assistant",
            "Hi, this is Maria from Brightside Home support. How can I help?",
            0.01,
        ),
        turn(3, "s1", "user", "Thanks maria. My order A10293 is delayed.", 0.02),
        turn(
            4,
            "s1",
            "assistant",
            "Is there anything else I can help with? Stay safe and chat soon!",
            0.03,
        ),
    ]
    content = consolidate_extractive(KEY, turns, T0)
    assert [f.text for f in content.facts] == ["My order A10293 is delayed."]
    assert content.status == "My order A10293 is delayed."
    assert content.open_actions == []
    assert "maria" not in content.keys
    assert "help" not in content.keys


def test_a_later_turn_closes_a_stored_action_at_the_time_it_was_resolved() -> None:
    promise = [
        turn(
            1,
            "s1",
            "assistant",
            "Order A10293 is delayed. I'll email you the tracking number tomorrow.",
            0,
        )
    ]
    memory = merge(None, consolidate_extractive(KEY, promise, T0), ids(promise), T0)
    assert [a.text for a in memory.open_actions] == ["I'll email you the tracking number tomorrow."]
    got = [turn(2, "s2", "user", "I got the tracking email for order A10293, thanks.", 30)]
    later = merge(memory, consolidate_extractive(KEY, got, got[0].ts), ids(got), got[0].ts)
    assert later.open_actions == []
    [closed] = [h for h in later.history if h.attribute == "open_action"]
    assert closed.superseded_at == got[0].ts
    assert closed.stated_at == promise[0].ts


def test_a_delivery_makes_the_older_delivery_promises_moot() -> None:
    first = merge(
        None, consolidate_extractive(KEY, SESSION_1 + SESSION_2, T0), ids(SESSION_1 + SESSION_2), T0
    )
    assert len(first.open_actions) == 2
    arrived = [
        turn(7, "s4", "user", "Order A10293: it finally came, the courier left it at my door.", 80)
    ]
    memory = merge(
        first, consolidate_extractive(KEY, arrived, arrived[0].ts), ids(arrived), arrived[0].ts
    )
    assert memory.status.startswith("delivered — ")
    assert memory.open_actions == []  # a follow-up and a delivery callback: both moot now
    assert {h.superseded_at for h in memory.history if h.attribute == "open_action"} == {
        arrived[0].ts
    }


def test_a_plain_fact_the_fresh_reading_dropped_does_not_outlive_it() -> None:
    stale = MemoryContent(
        title="x", facts=[Fact(text="It still has not moved.", source_event_ids=["e1"], ts=T0)]
    )
    memory = merge(None, stale, ["e1"], T0)
    fresh = MemoryContent(
        title="x", facts=[Fact(text="It moved.", source_event_ids=["e1", "e2"], ts=T0)]
    )
    assert [f.text for f in merge(memory, fresh, ["e1", "e2"], T0).facts] == ["It moved."]
    # a fact from turns this merge did not re-read stays
    assert len(merge(memory, fresh, ["e2"], T0).facts) == 2
