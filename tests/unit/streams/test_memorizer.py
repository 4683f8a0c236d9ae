"""memorize's handler (``Memorizer.memorize``) on one event at a time over the short-term
state fake: what one event changes, duplicates and forgotten users, recurrence triggers."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memstream.memory.clustering import ClusterParams
from memstream.memory.memorize import decide_event
from memstream.memory.recurrence import RecurrenceParams
from memstream.schemas import EncodedEvent, EventMetadata, InteractionEvent
from memstream.streaming.stage import Received
from memstream.streams import memorize
from memstream.streams.memorize import Decision, Memorizer, OverBudget, Skipped
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT, USER = "acme", "u1"
ORDER_TALK = [
    "Where is my order A-10293? It has not shipped yet",
    "I like hiking in the mountains",
    "Order A-10293 still shows no tracking number",
    "Can you check order A-10293 again please",
]


def event(i: int, text: str, *, user: str = USER, pin: bool = False) -> EncodedEvent:
    e = InteractionEvent(
        event_id=f"e{i}",
        tenant_id=TENANT,
        user_id=user,
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + timedelta(hours=i),
        metadata=EventMetadata(pin=pin),
    )
    return EncodedEvent(event=e, embedding=ENCODER.encode([text])[0].tolist(), model_id="hash")


def memorizer(state: FakeShortTermState) -> Memorizer:
    return Memorizer(
        state=state,
        cluster_params=ClusterParams(),
        recurrence_params=RecurrenceParams(),
        window=50,
    )


class Delivered:
    """The deliver callback: what was delivered, and how many writes had been applied then."""

    def __init__(self, state: FakeShortTermState) -> None:
        self.state = state
        self.applied_at: list[int] = []

    async def __call__(self, decided: Sequence[tuple[Received[EncodedEvent], Decision]]) -> None:
        if decided:
            self.applied_at.append(self.state.applied)


async def memorize_one(
    m: Memorizer, encoded: EncodedEvent, deliver: Delivered | None = None
) -> Decision | Skipped:
    """One event through the batch path alone: decided, delivered, written."""
    deliver = deliver or Delivered(FakeShortTermState())
    [(_, result)] = await m.memorize([[Received(encoded, None, b"")]], deliver)
    assert not isinstance(result, Exception), result
    return result


async def feed(m: Memorizer, texts: list[str]) -> list[Decision]:
    decisions = []
    for i, text in enumerate(texts):
        d = await memorize_one(m, event(i, text))
        assert isinstance(d, Decision)
        decisions.append(d)
    return decisions


async def test_one_event_is_one_turn_written_and_marked_processed() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    delivered = Delivered(state)
    d = await memorize_one(m, event(0, ORDER_TALK[0]), delivered)
    assert isinstance(d, Decision)
    assert (d.tenant_id, d.user_id, d.triggers) == (TENANT, USER, [])
    assert d.update.turn.event_id == "e0"
    assert d.update.turn.entities == ["order:A-10293"]
    assert d.update.turn.ts == T0
    assert d.update.pending_add is not None  # salient: enters the recurrence window
    assert delivered.applied_at == [0]  # delivered before anything was written
    assert state.applied == 1
    assert await state.timeline_ids(TENANT, USER) == ["e0"]
    [stored] = await state.turns(TENANT, USER, ["e0"])
    assert stored.turn == d.update.turn
    assert [p.event_id for p in (await state.load_user(TENANT, USER, "e1")).pending] == ["e0"]
    assert await memorize_one(m, event(0, ORDER_TALK[0])) == "duplicate"  # a redelivery
    assert state.applied == 1  # ... writes nothing


async def test_the_third_mention_of_an_order_triggers_its_consolidation() -> None:
    state = FakeShortTermState()
    decisions = await feed(memorizer(state), ORDER_TALK)
    assert [d.triggers for d in decisions[:3]] == [[], [], []]
    [trigger] = decisions[3].triggers
    assert (trigger.key, trigger.reason) == ("entity:order:A-10293", "entity")
    assert trigger.turn_ids == ["e0", "e2", "e3"]  # not the hiking turn
    assert trigger.ts == T0 + timedelta(hours=3)  # event time, not the clock
    assert (trigger.tenant_id, trigger.user_id) == (TENANT, USER)
    assert await state.turns_written(TENANT, USER) == 4


async def test_a_replay_on_fresh_state_decides_the_same_trigger_ids() -> None:
    first = await feed(memorizer(FakeShortTermState()), ORDER_TALK)
    again = await feed(memorizer(FakeShortTermState()), ORDER_TALK)
    ids = [[t.trigger_id for t in d.triggers] for d in first]
    assert ids == [[t.trigger_id for t in d.triggers] for d in again]
    assert len(ids[3]) == 1


async def test_events_stamped_before_a_forget_are_dropped() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    await state.mark_forgotten(TENANT, USER, (T0 + timedelta(hours=1)).timestamp())
    assert await memorize_one(m, event(0, ORDER_TALK[0])) == "forgotten"
    assert await memorize_one(m, event(1, ORDER_TALK[1])) == "forgotten"  # at the tombstone
    assert state.applied == 0  # dropped: nothing written
    later = await memorize_one(m, event(2, ORDER_TALK[2]))
    assert isinstance(later, Decision)
    assert later.update.turn.event_id == "e2"
    assert await state.timeline_ids(TENANT, USER) == ["e2"]


async def test_a_pinned_turn_is_kept_pinned() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    d = await memorize_one(m, event(0, "My flat's door code is 4417", pin=True))
    assert isinstance(d, Decision)
    assert d.update.turn.pinned
    [stored] = await state.turns(TENANT, USER, ["e0"])
    assert stored.turn.pinned


async def test_users_are_decided_apart() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    await feed(m, ORDER_TALK[:3])
    d = await memorize_one(m, event(3, ORDER_TALK[3], user="u2"))
    assert isinstance(d, Decision)
    assert d.triggers == []
    pending = (await state.load_user(TENANT, "u2", "e4")).pending
    assert [p.event_id for p in pending] == ["e3"]  # its own turn only, none of u1's


async def test_a_decision_runs_off_the_event_loop_and_one_over_its_budget_is_poison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    threads: list[threading.Thread] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return decide_event(*args, **kwargs)

    monkeypatch.setattr(memorize, "decide_event", recording)
    await memorize_one(m, event(0, ORDER_TALK[0]))
    assert threads
    assert threading.main_thread() not in threads  # the loop's thread stays free

    m.decide_budget_s = 1e-6  # no decision fits: the event is poison, the state untouched
    batch = [[Received(event(1, ORDER_TALK[1]), None, b"")]]
    [(_, result)] = await m.memorize(batch, Delivered(state))
    assert isinstance(result, OverBudget)
    assert "budget" in str(result)
    assert await state.timeline_ids(TENANT, USER) == ["e0"]


async def test_an_event_posted_before_a_forget_is_dropped_whatever_its_stamp() -> None:
    """A producer's clock a day ahead must not let a turn outlive the user's forget: the
    record's arrival (its broker timestamp, carried on by encode) is compared too."""
    state = FakeShortTermState()
    m = memorizer(state)
    forget_at = T0 + timedelta(hours=1)
    await state.mark_forgotten(TENANT, USER, forget_at.timestamp())
    ahead = event(5, "my passport number is X1234567")  # stamped 5 h: after the forget
    posted_before = Received(
        ahead, None, b"", arrived=(forget_at - timedelta(seconds=2)).timestamp()
    )
    [(_, result)] = await m.memorize([[posted_before]], Delivered(state))
    assert result == "forgotten"
    posted_after = Received(
        ahead, None, b"", arrived=(forget_at + timedelta(seconds=2)).timestamp()
    )
    [(_, result)] = await m.memorize([[posted_after]], Delivered(state))
    assert isinstance(result, Decision)  # a new conversation after the forget is kept
