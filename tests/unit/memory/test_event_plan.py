"""``memory.memorize.decide_event``: memorize's decision as a pure function of the state read
and the event's time -- the turn, the recurrence window, triggers -- with no store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from memstream.memory.clustering import ClusterParams, ClusterState
from memstream.memory.memorize import EventPlan, decide_event, memory_in, trigger_id
from memstream.memory.recurrence import KeyState, RecurrenceParams, TriggerSpec, TurnSignal
from memstream.memory.text import phrase_keys
from memstream.memory.vectors import normalize
from memstream.schemas import EventMetadata, InteractionEvent

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
CLUSTERS = ClusterParams()
RECURRENCE = RecurrenceParams()
DIM = 8


def vector(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return normalize(v)


def event(i: int, text: str, *, pin: bool = False, importance: float = 0.5) -> InteractionEvent:
    return InteractionEvent(
        event_id=f"e{i}",
        tenant_id="acme",
        user_id="u1",
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + timedelta(hours=i),
        metadata=EventMetadata(pin=pin, importance=importance),
    )


def plan(
    e: InteractionEvent,
    pending: list[TurnSignal] | None = None,
    keys: dict[str, KeyState] | None = None,
    *,
    common: frozenset[str] = frozenset(),
    window: int = 50,
    state: ClusterState | None = None,
) -> EventPlan:
    return decide_event(
        e,
        vector(int(e.event_id[1:])),
        state or ClusterState.empty(CLUSTERS),
        pending or [],
        keys or {},
        common,
        {},
        e.ts.timestamp(),
        cluster_params=CLUSTERS,
        recurrence_params=RECURRENCE,
        window=window,
    )


def run(texts: list[str], *, window: int = 50) -> list[EventPlan]:
    """Events one after another, each decided on the state the previous ones left."""
    state, pending, keys, plans = ClusterState.empty(CLUSTERS), [], {}, []
    for i, text in enumerate(texts):
        p = plan(event(i, text), pending, keys, window=window, state=state)
        state = p.clustering.state
        gone = set(p.pending_remove)
        pending = [s for s in pending if s.event_id not in gone] + ([p.signal] if p.keep else [])
        keys = {**keys, **p.keys}
        plans.append(p)
    return plans


ORDER = [
    "Where is my order A-10293? It has not shipped yet",
    "I like hiking in the mountains",
    "Order A-10293 still shows no tracking number",
    "Can you check order A-10293 again please",
]


def test_trigger_ids_are_a_function_of_the_evidence() -> None:
    spec = TriggerSpec("entity:order:A-1", "entity", 3.0, ("e1", "e2"))
    assert trigger_id("acme", "u1", spec) == trigger_id("acme", "u1", spec)
    assert len(trigger_id("acme", "u1", spec)) == 32
    other = TriggerSpec("entity:order:A-1", "entity", 3.0, ("e1", "e3"))
    assert trigger_id("acme", "u1", other) != trigger_id("acme", "u1", spec)
    assert trigger_id("acme", "u2", spec) != trigger_id("acme", "u1", spec)


def test_a_first_event_is_a_stored_salient_turn_and_nothing_else() -> None:
    p = plan(event(0, ORDER[0]))
    assert p.turn.event_id == "e0"
    assert p.turn.ts == T0
    assert p.turn.entities == ["order:A-10293"]
    assert p.turn.cluster_id == p.clustering.cluster_id == p.signal.cluster_id
    assert p.signal.ts == T0.timestamp()
    assert p.keep
    assert p.triggers == ()
    assert p.pending_remove == ()
    assert memory_in(event(0, ORDER[0]), vector(0)).event_id == "e0"


def test_the_third_mention_triggers_and_consumes_its_turns() -> None:
    plans = run(ORDER)
    assert [p.triggers for p in plans[:3]] == [(), (), ()]
    [trigger] = plans[3].triggers
    assert (trigger.key, trigger.reason, trigger.turn_ids) == (
        "entity:order:A-10293",
        "entity",
        ["e0", "e2", "e3"],
    )
    assert trigger.ts == T0 + timedelta(hours=3)
    assert trigger.importance == 0.5
    spec = TriggerSpec(trigger.key, "entity", trigger.score, ("e0", "e2", "e3"))
    assert trigger.trigger_id == trigger_id("acme", "u1", spec)
    assert [t.trigger_id for t in run(ORDER)[3].triggers] == [trigger.trigger_id]  # replay


def test_a_phrase_many_users_say_makes_no_turn_salient() -> None:
    text = "Thank you for contacting support today"
    assert plan(event(0, text)).keep
    canned = frozenset(phrase_keys(text))
    assert not plan(event(0, text), common=canned).keep


def test_the_window_keeps_the_newest_pending_turns() -> None:
    texts = [f"Notes about topic number {n} with several content words" for n in range(4)]
    plans = run(texts, window=2)
    assert [p.pending_remove for p in plans] == [(), (), ("e0",), ("e1",)]


def test_a_pin_or_an_imperative_remember_pins_the_turn() -> None:
    assert plan(event(0, "Just a note about lunch plans", pin=True)).turn.pinned
    assert plan(event(0, "Please remember that my door code is 4417")).signal.pinned
    assert not plan(event(0, "I remember buying it last year")).signal.pinned
