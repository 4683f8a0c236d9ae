"""RecMem detector: salience gate, semantic / entity / cluster / pin triggers, hysteresis."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping

import numpy as np
import pytest

from memstream.memory.recurrence import (
    Detection,
    KeyState,
    RecurrenceParams,
    TurnSignal,
    detect,
)
from memstream.memory.text import extract_entities
from memstream.memory.vectors import FloatArray, normalize

DAY = 86_400.0
PARAMS = RecurrenceParams()
DIM = 8
T0 = 1_780_000_000.0


def unit(i: int) -> FloatArray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    return v


def near(base: FloatArray, other: FloatArray, cosine: float) -> FloatArray:
    return normalize(cosine * base + math.sqrt(1 - cosine**2) * other)


def turn(
    event_id: str,
    *,
    session: str = "s1",
    ts: float = T0,
    vector: FloatArray | None = None,
    entities: Iterable[str] = (),
    cluster: str = "c0",
    salient: bool = True,
    pinned: bool = False,
) -> TurnSignal:
    return TurnSignal(
        event_id=event_id,
        session_id=session,
        ts=ts,
        vector=unit(7) if vector is None else vector,
        entities=tuple(entities),
        cluster_id=cluster,
        salient=salient,
        pinned=pinned,
    )


class User:
    """Feeds turns through ``detect`` the way the memorize processor does (state carried over,
    consumed turns dropped from pending, salient unconsumed turns added to it)."""

    def __init__(self, params: RecurrenceParams = PARAMS) -> None:
        self.params = params
        self.pending: list[TurnSignal] = []
        self.keys: dict[str, KeyState] = {}

    def say(self, t: TurnSignal) -> Detection:
        d = detect(t, self.pending, self.keys, t.ts, self.params)
        self.keys.update(d.updated_keys)
        consumed = set(d.consumed_turn_ids)
        self.pending = [p for p in self.pending if p.event_id not in consumed]
        if t.salient and t.event_id not in consumed:
            self.pending.append(t)
        return d


def reasons(d: Detection) -> list[tuple[str, str]]:
    return [(t.reason, t.key) for t in d.triggers]


# --- salience ------------------------------------------------------------------------------


def test_non_salient_turn_changes_nothing() -> None:
    pending = [turn(f"p{i}") for i in range(10)]  # all identical to the new one
    keys: Mapping[str, KeyState] = {"entity:order:1": KeyState(score=9, last_ts=T0)}
    d = detect(turn("t", entities=["order:1"], salient=False), pending, keys, T0, PARAMS)
    assert d == Detection(triggers=(), updated_keys={}, consumed_turn_ids=())


def test_pinned_non_salient_turn_still_counts() -> None:
    d = detect(turn("t", salient=False, pinned=True), [], {}, T0, PARAMS)
    assert reasons(d) == [("pin", "topic:c0")]


# --- pin -----------------------------------------------------------------------------------


def test_pin_fires_at_once_on_the_first_entity_key() -> None:
    d = detect(turn("t", entities=["email:a@b.io", "order:A-1"], pinned=True), [], {}, T0, PARAMS)
    pin = d.triggers[0]
    assert (pin.reason, pin.key, pin.score, pin.turn_ids) == (
        "pin",
        "entity:email:a@b.io",
        1.0,
        ("t",),
    )
    assert reasons(d) == [("pin", "entity:email:a@b.io")]  # nothing else has recurred yet
    assert d.updated_keys["entity:email:a@b.io"].fired == 1  # pin counts as the key's fire


def test_pin_without_entities_keys_the_topic() -> None:
    d = detect(turn("t", cluster="c9", pinned=True), [], {}, T0, PARAMS)
    assert reasons(d) == [("pin", "topic:c9")]


# --- semantic ------------------------------------------------------------------------------


def similar_pending(n: int, cosine: float = 0.8) -> list[TurnSignal]:
    return [
        turn(f"p{i}", ts=T0 + i, vector=near(unit(0), unit(1 + i % 6), cosine), cluster=f"x{i}")
        for i in range(n)
    ]


def test_semantic_fires_exactly_at_min_similar() -> None:
    new = turn("t", ts=T0 + 100, vector=unit(0), cluster="c3")
    noise = [turn("n1", vector=unit(5)), turn("n2", vector=unit(6))]
    below = detect(new, [*similar_pending(4), *noise], {}, T0 + 100, PARAMS)
    assert "semantic" not in [t.reason for t in below.triggers]
    assert below.consumed_turn_ids == ()

    pending = [*similar_pending(5), *noise]
    d = detect(new, pending, {}, T0 + 100, PARAMS)
    semantic = next(t for t in d.triggers if t.reason == "semantic")
    assert semantic.key == "topic:c3"
    assert semantic.turn_ids == ("p0", "p1", "p2", "p3", "p4", "t")
    assert semantic.score == pytest.approx(0.8 * 5 / 5, abs=1e-5)
    assert d.consumed_turn_ids == semantic.turn_ids  # noise stays pending


def test_semantic_similarity_bound_is_strict() -> None:
    pending = [turn(f"p{i}", vector=unit(0)) for i in range(5)]  # cosine exactly 1.0
    new = turn("t", vector=unit(0))

    def semantic_fires(bound: float) -> bool:
        d = detect(new, pending, {}, T0, RecurrenceParams(similarity=bound))
        return "semantic" in [t.reason for t in d.triggers]

    assert semantic_fires(0.999)
    assert not semantic_fires(1.0)


def test_semantic_score_grows_with_evidence() -> None:
    new = turn("t", vector=unit(0))
    score5 = detect(new, similar_pending(5, 0.9), {}, T0, PARAMS).triggers
    score10 = detect(new, similar_pending(10, 0.9), {}, T0, PARAMS).triggers
    s5 = next(t.score for t in score5 if t.reason == "semantic")
    s10 = next(t.score for t in score10 if t.reason == "semantic")
    assert s10 == pytest.approx(2 * s5, rel=1e-5)


def test_semantic_turn_ids_are_bounded_newest_kept() -> None:
    params = RecurrenceParams(max_turn_ids=4, min_similar=3)
    d = detect(turn("t", vector=unit(0)), similar_pending(6), {}, T0, params)
    semantic = next(t for t in d.triggers if t.reason == "semantic")
    assert semantic.turn_ids == ("p3", "p4", "p5", "t")
    assert d.consumed_turn_ids == ("p3", "p4", "p5", "t")


def test_consumed_evidence_cannot_fire_twice() -> None:
    user = User()
    for i in range(5):
        user.say(turn(f"p{i}", ts=T0 + i, vector=near(unit(0), unit(1), 0.9), cluster=f"x{i}"))
    fired = user.say(turn("t1", ts=T0 + 10, vector=unit(0), cluster="c1"))
    assert ("semantic", "topic:c1") in reasons(fired)
    assert user.pending == []
    again = user.say(turn("t2", ts=T0 + 11, vector=unit(0), cluster="c2"))
    assert "semantic" not in [t.reason for t in again.triggers]


def test_a_redelivered_turn_is_not_its_own_evidence() -> None:
    same = [turn("t", vector=unit(0))] * 5
    d = detect(turn("t", vector=unit(0)), same, {}, T0, PARAMS)
    assert "semantic" not in [t.reason for t in d.triggers]


# --- entity --------------------------------------------------------------------------------


def mention(event_id: str, ts: float, session: str = "s1", entity: str = "order:A-1") -> TurnSignal:
    # Distinct vectors and clusters: only the entity recurs.
    return turn(
        event_id,
        session=session,
        ts=ts,
        vector=unit(int(event_id[-1]) % DIM),
        entities=[entity],
        cluster=f"k{event_id}",
    )


def entity_triggers(d: Detection) -> list[tuple[str, ...]]:
    return [t.turn_ids for t in d.triggers if t.reason == "entity"]


def test_entity_fires_at_threshold_with_all_evidence() -> None:
    user = User()
    assert entity_triggers(user.say(mention("m1", T0))) == []
    assert entity_triggers(user.say(mention("m2", T0 + 60))) == []
    d = user.say(mention("m3", T0 + 120))
    assert entity_triggers(d) == [("m1", "m2", "m3")]
    trigger = d.triggers[0]
    assert (trigger.key, trigger.reason) == ("entity:order:A-1", "entity")
    assert trigger.score == pytest.approx(3.0, abs=1e-3)


def test_old_mentions_count_less() -> None:
    user = User()
    user.say(mention("m1", T0))
    user.say(mention("m2", T0 + 1))
    late = user.say(mention("m3", T0 + 60 * DAY))  # two half-lives and more later
    assert entity_triggers(late) == []
    state = user.keys["entity:order:A-1"]
    assert state.score == pytest.approx(1 + 2 * 0.5 ** (60 / 14), rel=1e-3)


def test_entity_hysteresis_waits_for_new_evidence() -> None:
    user = User()  # refire_new_turns = 2
    for i, ts in enumerate((T0, T0 + 1, T0 + 2), start=1):
        user.say(mention(f"m{i}", ts))
    assert user.keys["entity:order:A-1"].fired == 1
    assert entity_triggers(user.say(mention("m4", T0 + 3))) == []  # one new turn: wait
    refire = user.say(mention("m5", T0 + 4))  # two new turns: fire again
    assert entity_triggers(refire) == [("m1", "m2", "m3", "m4", "m5")]
    assert user.keys["entity:order:A-1"].fired == 2
    assert user.keys["entity:order:A-1"].new_since_fire == 0


def test_entity_refires_at_once_for_a_new_session() -> None:
    user = User()
    for i, ts in enumerate((T0, T0 + 1, T0 + 2), start=1):
        user.say(mention(f"m{i}", ts, session="s1"))
    assert entity_triggers(user.say(mention("m4", T0 + 3, session="s2"))) != []
    assert entity_triggers(user.say(mention("m5", T0 + 4, session="s2"))) == []


def test_same_event_twice_counts_once() -> None:
    user = User()
    user.say(mention("m1", T0))
    d = user.say(mention("m1", T0))
    assert "entity:order:A-1" not in d.updated_keys
    assert user.keys["entity:order:A-1"].score == 1.0


def test_chinese_order_number_entity_fires() -> None:
    user = User()
    texts = [
        "订单号 778899 还没发货",
        "请帮我查一下订单号778899",
        "订单号：７７８８９９到底什么时候到",
    ]
    fired: list[Detection] = []
    for i, text in enumerate(texts):
        entities = extract_entities(text)
        assert entities == ["order:778899"]
        fired.append(user.say(mention(f"z{i}", T0 + i * 3600, entity=entities[0])))
    assert [reasons(d) for d in fired[:2]] == [[], []]
    assert reasons(fired[2]) == [("entity", "entity:order:778899")]


def test_entity_key_state_is_bounded() -> None:
    user = User(RecurrenceParams(max_turn_ids=3))
    for i in range(6):
        user.say(mention(f"m{i}", T0 + i, session=f"s{i}"))
    state = user.keys["entity:order:A-1"]
    assert state.turn_ids == ["m3", "m4", "m5"]
    assert state.sessions == ["s3", "s4", "s5"]


# --- cluster -------------------------------------------------------------------------------


def topic_turn(event_id: str, session: str, ts: float) -> TurnSignal:
    return turn(event_id, session=session, ts=ts, vector=unit(ord(event_id) % DIM), cluster="c5")


def test_cluster_fires_after_distinct_sessions() -> None:
    user = User()  # cluster_min_sessions = 3
    assert reasons(user.say(topic_turn("a", "s1", T0))) == []
    assert reasons(user.say(topic_turn("b", "s1", T0 + 1))) == []
    assert reasons(user.say(topic_turn("c", "s2", T0 + 2))) == []
    d = user.say(topic_turn("d", "s3", T0 + 3))
    assert reasons(d) == [("cluster", "topic:c5")]
    assert d.triggers[0].score == 3.0
    assert d.triggers[0].turn_ids == ("a", "b", "c", "d")
    # Hysteresis: a topic fires again only after topic_refire_new_turns new turns; unlike an
    # entity, a session it has not seen is not enough (a topic recurs in most sessions).
    quiet = [user.say(topic_turn(c, f"s{4 + i}", T0 + 4 + i)) for i, c in enumerate("efghijklm")]
    assert all(reasons(d) == [] for d in quiet)
    assert reasons(user.say(topic_turn("n", "s2", T0 + 20))) == [("cluster", "topic:c5")]


# --- several signals at once ---------------------------------------------------------------


def test_one_trigger_per_key_by_priority_carrying_all_evidence() -> None:
    keys = {"topic:c0": KeyState(score=2, last_ts=T0, turn_ids=["a", "b"], sessions=["s1", "s2"])}
    pending = [turn(f"p{i}", vector=unit(0)) for i in range(5)]
    new = turn("t", session="s3", vector=unit(0), pinned=True)
    d = detect(new, pending, keys, T0, PARAMS)
    # pin, semantic and cluster all key "topic:c0": the pin wins and keeps everyone's turns.
    assert reasons(d) == [("pin", "topic:c0")]
    assert d.triggers[0].turn_ids == ("a", "b", "p0", "p1", "p2", "p3", "p4", "t")
    assert set(d.consumed_turn_ids) >= {"p0", "p1", "p2", "p3", "p4", "t"}
    assert d.updated_keys["topic:c0"].fired == 1


def test_triggers_come_in_a_fixed_order() -> None:
    keys = {
        "entity:order:A-1": KeyState(score=5, last_ts=T0, turn_ids=["x"], sessions=["s1"]),
        "entity:email:a@b.io": KeyState(score=5, last_ts=T0, turn_ids=["y"], sessions=["s1"]),
        "topic:c0": KeyState(score=2, last_ts=T0, turn_ids=["a"], sessions=["s1", "s2"]),
    }
    new = turn("t", session="s3", entities=["order:A-1", "email:a@b.io"])
    params = RecurrenceParams(entity_subsumes_topic=False)
    first = detect(new, [], keys, T0, params)
    assert reasons(first) == [
        ("entity", "entity:email:a@b.io"),
        ("entity", "entity:order:A-1"),
        ("cluster", "topic:c0"),
    ]
    assert detect(new, [], keys, T0, params) == first


def test_an_entity_trigger_subsumes_the_topic_trigger_of_the_same_turn() -> None:
    keys = {
        "entity:order:A-1": KeyState(score=5, last_ts=T0, turn_ids=["x"], sessions=["s1"]),
        "topic:c0": KeyState(score=2, last_ts=T0, turn_ids=["a"], sessions=["s1", "s2"]),
    }
    pending = [turn(f"p{i}", vector=unit(0)) for i in range(5)]
    new = turn("t", session="s3", vector=unit(0), entities=["order:A-1"])
    d = detect(new, pending, keys, T0, PARAMS)
    assert reasons(d) == [("entity", "entity:order:A-1")]
    # The topic's evidence is used all the same: it must wait for new evidence to fire.
    assert d.updated_keys["topic:c0"].fired == 1
    assert set(d.consumed_turn_ids) >= {"p0", "p1", "p2", "p3", "p4", "t"}


def test_a_turn_of_an_already_consolidated_entity_leaves_topics_to_it() -> None:
    # The entity fired before and waits (hysteresis); the topic would fire on this turn.
    fired = KeyState(score=5, last_ts=T0, turn_ids=["x", "y"], sessions=["s3"], fired=1)
    keys = {"entity:order:A-1": fired}
    pending = [turn(f"p{i}", vector=unit(0)) for i in range(5)]
    new = turn("t", session="s3", vector=unit(0), entities=["order:A-1"])
    d = detect(new, pending, keys, T0, PARAMS)
    assert reasons(d) == []
    assert set(d.consumed_turn_ids) >= {"p0", "t"}
    # Without an entity memory, the same topic evidence fires.
    plain = turn("t", session="s3", vector=unit(0))
    assert reasons(detect(plain, pending, {}, T0, PARAMS)) == [("semantic", "topic:c0")]


def test_inputs_are_not_mutated() -> None:
    state = KeyState(score=2, last_ts=T0, turn_ids=["a"], sessions=["s1"])
    keys = {"entity:order:A-1": state}
    before = copy.deepcopy(state)
    detect(mention("m9", T0 + 5), [], keys, T0 + 5, PARAMS)
    assert keys == {"entity:order:A-1": before}


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="min_similar"):
        RecurrenceParams(min_similar=0)
    with pytest.raises(ValueError, match="half_life"):
        RecurrenceParams(entity_half_life_days=0)
