"""RecMem's recurrence detector: decide when a user's turns have recurred enough to consolidate.

Raw turns are cheap; consolidation asks an LLM, so it should happen only when a topic or an
entity comes back. Four signals, checked for every salient (or pinned) turn:

- ``pin``: the turn is pinned or says "remember this": fire at once.
- ``semantic``: at least ``min_similar`` earlier unconsolidated turns have cosine above
  ``similarity`` with this one (RecMem's rule, 5 / 0.7 by default). The turns used are
  *consumed*: the caller drops them from the pending list, so the same evidence cannot fire
  twice (hysteresis by consumption).
- ``entity``: an entity key (order, email, phone, product, date, tracking number) has a
  decayed mention count (half-life ``entity_half_life_days``) of ``entity_min_turns``
  (less ``entity_count_slack``, so three mentions a few hours apart still count as three).
- ``cluster``: the turn's topic cluster has salient turns from ``cluster_min_sessions``
  distinct sessions.

Entity and cluster keys keep a ``KeyState``; after a key fires it waits for new evidence
(hysteresis): an entity ``refire_new_turns`` new turns, or a turn from a session the key has
not seen; a topic ``topic_refire_new_turns`` new turns (a topic recurs in most sessions of a
long conversation, so a new session alone is not news).
A turn naming an entity that already has a memory (its key has fired) leaves topic
triggers to it (one memory about one conversation, not two): the topic's evidence is
used up all the same.

Trigger scores (the consolidated memory's starting strength is derived from them):
semantic = mean similarity x count / ``min_similar`` (>= the bound times 1 when it fires);
entity = the decayed mention count; cluster = the number of distinct sessions; pin = 1.0,
a fixed unit strength, because an explicit request carries no graded evidence.

Pure and deterministic: time comes in as ``now`` (pass the event time, so a replay of the log
reproduces every decision), inputs are never mutated, outputs have a fixed order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from memstream.memory.vectors import FloatArray, cosine_to_rows, normalize

Reason = Literal["semantic", "cluster", "entity", "pin", "eager"]

# When several signals fire for one key in one call, one trigger is kept: an explicit request
# first, then the most specific evidence.
_PRIORITY: dict[Reason, int] = {"pin": 0, "entity": 1, "semantic": 2, "cluster": 3, "eager": 4}

_SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class RecurrenceParams:
    min_similar: int = 5
    similarity: float = 0.7
    entity_min_turns: float = 3.0
    entity_half_life_days: float = 14.0
    cluster_min_sessions: int = 3
    refire_new_turns: int = 2
    topic_refire_new_turns: int = 10
    max_turn_ids: int = 40
    # How far below entity_min_turns a decayed count may be and still fire. Without it three
    # mentions an hour apart would score 2.99 and never fire; 0.5 means "the decayed count,
    # rounded to whole turns", so decay matters across weeks, not minutes.
    entity_count_slack: float = 0.5
    # When an entity key fires on a turn, drop the topic (semantic / cluster) trigger of the
    # same turn: both would consolidate the same conversation into two memories.
    entity_subsumes_topic: bool = True
    # The eager baseline of the cost benchmark: every turn triggers its own consolidation
    # (key ``event:<id>``), the way systems without a recurrence gate work.
    eager: bool = False

    def __post_init__(self) -> None:
        if min(self.min_similar, self.cluster_min_sessions, self.refire_new_turns) < 1:
            raise ValueError("min_similar, cluster_min_sessions and refire_new_turns must be >= 1")
        if self.topic_refire_new_turns < 1:
            raise ValueError("topic_refire_new_turns must be >= 1")
        if self.max_turn_ids < 1:
            raise ValueError("max_turn_ids must be >= 1")
        if not -1.0 <= self.similarity <= 1.0:
            raise ValueError("similarity must lie in [-1, 1]")
        if self.entity_half_life_days <= 0.0:
            raise ValueError("entity_half_life_days must be positive")
        if not 0.0 <= self.entity_count_slack < self.entity_min_turns:
            raise ValueError("entity_count_slack must lie in [0, entity_min_turns)")


@dataclass(frozen=True, eq=False)
class TurnSignal:
    """What the detector needs to know of a turn (compared by identity: it holds an array)."""

    event_id: str
    session_id: str
    ts: float
    vector: FloatArray
    entities: tuple[str, ...]
    cluster_id: str
    salient: bool
    pinned: bool  # metadata.pin or a "remember this" turn


@dataclass
class KeyState:
    """Per key ("entity:<entity>" or "topic:<cluster_id>"); bounded lists keep the newest."""

    score: float = 0.0  # decayed mention count as of last_ts
    last_ts: float = 0.0
    turn_ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)  # distinct, most recently seen last
    new_since_fire: int = 0
    fired: int = 0


@dataclass(frozen=True)
class TriggerSpec:
    key: str
    reason: Reason
    score: float
    turn_ids: tuple[str, ...]


@dataclass(frozen=True)
class Detection:
    triggers: tuple[TriggerSpec, ...]  # ordered by priority, then key
    updated_keys: dict[str, KeyState]  # only keys this turn changed
    consumed_turn_ids: tuple[str, ...]  # drop from pending (may include the new turn)


def entity_key(entity: str) -> str:
    return f"entity:{entity}"


def topic_key(cluster_id: str) -> str:
    return f"topic:{cluster_id}"


def detect(
    turn: TurnSignal,
    pending: Sequence[TurnSignal],
    keys: Mapping[str, KeyState],
    now: float,
    params: RecurrenceParams,
) -> Detection:
    """Decide what ``turn`` triggers, given the user's earlier unconsolidated salient turns
    (``pending``, newest last) and the state of the user's keys. Inputs are not modified."""
    if params.eager:
        spec = TriggerSpec(f"event:{turn.event_id}", "eager", 1.0, (turn.event_id,))
        return Detection(triggers=(spec,), updated_keys={}, consumed_turn_ids=())
    if not (turn.salient or turn.pinned):
        # Salience filter: "ok", "thanks" count for nothing. (A fresh dict: callers may keep it.)
        return Detection(triggers=(), updated_keys={}, consumed_turn_ids=())

    candidates: list[TriggerSpec] = []
    if turn.pinned:
        candidates.append(_pin_trigger(turn))
    semantic = _semantic_trigger(turn, pending, params)
    if semantic is not None:
        candidates.append(semantic)

    updated: dict[str, KeyState] = {}
    for entity in dict.fromkeys(turn.entities):  # unique, order kept
        key = entity_key(entity)
        observed = _observe(keys.get(key), turn, now, params, topic=False)
        if observed is None:
            continue
        state, may_fire = observed
        updated[key] = state
        if may_fire and state.score >= params.entity_min_turns - params.entity_count_slack:
            candidates.append(TriggerSpec(key, "entity", state.score, tuple(state.turn_ids)))
    if turn.cluster_id:
        key = topic_key(turn.cluster_id)
        observed = _observe(keys.get(key), turn, now, params, topic=True)
        if observed is not None:
            state, may_fire = observed
            updated[key] = state
            if may_fire and len(state.sessions) >= params.cluster_min_sessions:
                candidates.append(
                    TriggerSpec(key, "cluster", float(len(state.sessions)), tuple(state.turn_ids))
                )

    fired = _one_per_key(candidates, turn.event_id, params.max_turn_ids)
    for trigger in fired:
        if trigger.key in updated:
            _mark_fired(updated[trigger.key])
    consumed: tuple[str, ...] = ()
    if semantic is not None:
        kept = next(t for t in fired if t.key == semantic.key)
        consumed = kept.turn_ids  # every turn the trigger carries has now been used
    triggers = fired
    # A turn naming an entity that has a memory (its key fired now or before) belongs to that
    # memory: a topic trigger on it would write a second memory of the same conversation.
    # The topic's evidence still counts as used (key marked fired, semantic turns consumed),
    # so it waits for new evidence; the entity's memory takes the turn at its next firing.
    entity_owned = any(
        state.fired > 0 for key, state in updated.items() if key.startswith("entity:")
    )
    if params.entity_subsumes_topic and entity_owned:
        triggers = tuple(t for t in fired if not t.key.startswith("topic:"))
    return Detection(triggers=triggers, updated_keys=updated, consumed_turn_ids=consumed)


def _pin_trigger(turn: TurnSignal) -> TriggerSpec:
    key = entity_key(turn.entities[0]) if turn.entities else topic_key(turn.cluster_id)
    return TriggerSpec(key, "pin", 1.0, (turn.event_id,))


def _semantic_trigger(
    turn: TurnSignal, pending: Sequence[TurnSignal], params: RecurrenceParams
) -> TriggerSpec | None:
    query = normalize(turn.vector)
    # A pending turn with another dimension predates an encoder change (state is rebuilt by
    # replay after one); comparing it is meaningless, so it is skipped rather than fatal.
    earlier = [p for p in pending if p.event_id != turn.event_id and p.vector.shape == query.shape]
    if len(earlier) < params.min_similar:
        return None
    similarities = cosine_to_rows(query, normalize(np.stack([p.vector for p in earlier])))
    similar = [
        (p, float(s)) for p, s in zip(earlier, similarities, strict=True) if s > params.similarity
    ]
    if len(similar) < params.min_similar:
        return None
    mean_similarity = math.fsum(s for _, s in similar) / len(similar)
    score = mean_similarity * len(similar) / params.min_similar
    turn_ids = _newest([p.event_id for p, _ in similar] + [turn.event_id], params.max_turn_ids)
    return TriggerSpec(topic_key(turn.cluster_id), "semantic", score, turn_ids)


def _observe(
    previous: KeyState | None,
    turn: TurnSignal,
    now: float,
    params: RecurrenceParams,
    *,
    topic: bool,
) -> tuple[KeyState, bool] | None:
    """The key's state after one more mention, and whether hysteresis lets it fire.

    None when the turn was already counted (a redelivered event must not count twice).
    """
    if previous is None:
        state = KeyState(last_ts=now)
    elif turn.event_id in previous.turn_ids:
        return None
    else:
        state = replace(
            previous, turn_ids=list(previous.turn_ids), sessions=list(previous.sessions)
        )
    half_life_s = params.entity_half_life_days * _SECONDS_PER_DAY
    elapsed = max(0.0, now - state.last_ts)  # an out-of-order event does not grow the score
    new_session = turn.session_id not in state.sessions
    state.score = state.score * 0.5 ** (elapsed / half_life_s) + 1.0
    state.last_ts = max(state.last_ts, now)
    state.turn_ids = list(_newest([*state.turn_ids, turn.event_id], params.max_turn_ids))
    sessions = [s for s in state.sessions if s != turn.session_id] + [turn.session_id]
    state.sessions = list(_newest(sessions, params.max_turn_ids))
    state.new_since_fire += 1
    # "A session not seen at the last fire" is approximated by "a session this key has not
    # seen before": exact for the first turn of every new session, which is what matters.
    if topic:
        # A topic recurs in most sessions of a long conversation: only a batch of new turns
        # (not a new session alone) pays for consolidating it again.
        may_fire = state.fired == 0 or state.new_since_fire >= params.topic_refire_new_turns
    else:
        may_fire = (
            state.fired == 0 or state.new_since_fire >= params.refire_new_turns or new_session
        )
    return state, may_fire


def _mark_fired(state: KeyState) -> None:
    state.new_since_fire = 0
    state.fired += 1


def _one_per_key(
    candidates: Iterable[TriggerSpec], new_turn_id: str, max_turn_ids: int
) -> tuple[TriggerSpec, ...]:
    """Keep the highest-priority trigger per key, carrying the evidence of the ones it beat.

    Every candidate ends with the new turn. The union lists the beaten triggers' ids first
    and the winner's last (each id once, at its last place), then the new turn, so bounding
    it to ``max_turn_ids`` drops the beaten triggers' evidence before the winner's.
    """
    by_key: dict[str, list[TriggerSpec]] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.key, []).append(candidate)
    kept: list[TriggerSpec] = []
    for group in by_key.values():
        group.sort(key=lambda t: _PRIORITY[t.reason])
        winner = group[0]
        if len(group) > 1:
            ids: dict[str, None] = {}
            for trigger in reversed(group):
                for turn_id in trigger.turn_ids:
                    ids.pop(turn_id, None)  # re-inserting moves it to the end
                    ids[turn_id] = None
            ids.pop(new_turn_id, None)
            winner = replace(winner, turn_ids=_newest([*ids, new_turn_id], max_turn_ids))
        kept.append(winner)
    return tuple(sorted(kept, key=lambda t: (_PRIORITY[t.reason], t.key)))


def _newest(items: Sequence[str], limit: int) -> tuple[str, ...]:
    return tuple(items[-limit:])
