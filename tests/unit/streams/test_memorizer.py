"""memorize's decision handler (``Memorizer.decide`` / ``apply``) over the short-term state
fake: what one event changes, duplicates and forgotten users, recurrence triggers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memory.clustering import ClusterParams
from memory.recurrence import RecurrenceParams
from schemas import EncodedEvent, EventMetadata, InteractionEvent
from stores.fakes import FakeShortTermState
from streams.memorize import Decision, Memorizer
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


async def feed(m: Memorizer, texts: list[str]) -> list[Decision]:
    decisions = []
    for i, text in enumerate(texts):
        d = await m.decide(event(i, text))
        assert d is not None
        await m.apply(d)
        decisions.append(d)
    return decisions


async def test_one_event_is_one_turn_written_and_marked_processed() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    d = await m.decide(event(0, ORDER_TALK[0]))
    assert d is not None
    assert (d.tenant_id, d.user_id, d.triggers) == (TENANT, USER, [])
    assert d.update.turn.event_id == "e0"
    assert d.update.turn.entities == ["order:A-10293"]
    assert d.update.turn.ts == T0
    assert d.update.pending_add is not None  # salient: enters the recurrence window
    assert state.applied == 0  # deciding writes nothing
    await m.apply(d)
    assert state.applied == 1
    assert await state.timeline_ids(TENANT, USER) == ["e0"]
    [stored] = await state.turns(TENANT, USER, ["e0"])
    assert stored.turn == d.update.turn
    assert [p.event_id for p in (await state.load_user(TENANT, USER, "e1")).pending] == ["e0"]
    assert await m.decide(event(0, ORDER_TALK[0])) is None  # a redelivery is a duplicate


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
    assert await m.decide(event(0, ORDER_TALK[0])) is None
    assert await m.decide(event(1, ORDER_TALK[1])) is None  # at the tombstone: dropped too
    later = await m.decide(event(2, ORDER_TALK[2]))
    assert later is not None
    assert later.update.turn.event_id == "e2"
    assert state.applied == 0


async def test_a_pinned_turn_is_kept_pinned() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    d = await m.decide(event(0, "My flat's door code is 4417", pin=True))
    assert d is not None
    assert d.update.turn.pinned
    await m.apply(d)
    [stored] = await state.turns(TENANT, USER, ["e0"])
    assert stored.turn.pinned


async def test_users_are_decided_apart() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    await feed(m, ORDER_TALK[:3])
    d = await m.decide(event(3, ORDER_TALK[3], user="u2"))
    assert d is not None
    assert d.triggers == []
    assert (await state.load_user(TENANT, "u2", "e3")).pending == []
