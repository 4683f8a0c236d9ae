"""memorize's decision for one event: a pure function of what was read and the event's time.

``streams.memorize.Memorizer`` gathers first (the user's snapshot, the phrases the user
heard from the bot, the member vectors a split may need: ``vectors_needed`` of
``memory_in``), then ``decide_event`` says what the event changes: the stored turn, its
cluster step, the recurrence window and keys, and the triggers to emit. Only the
embedding of changed cluster descriptions is left to the caller (a model call).

Everything read is the user's own state: a user's events are one partition's, in log
order, so the same log gives the same decisions whatever the partitions, batches or
processes (issue 14). Nothing here reads another user's state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from memstream.memory.cluster_describe import terms_of
from memstream.memory.clustering import ClusterParams, ClusterState, MemoryIn, StepResult, step
from memstream.memory.recurrence import KeyState, RecurrenceParams, TriggerSpec, TurnSignal, detect
from memstream.memory.text import (
    extract_entities,
    is_remember_request,
    is_salient,
    phrase_keys,
)
from memstream.memory.turns import stored_turn
from memstream.memory.vectors import FloatArray
from memstream.schemas import InteractionEvent, RecurrenceTrigger, StoredTurn


def trigger_id(tenant_id: str, user_id: str, spec: TriggerSpec) -> str:
    """Deterministic: the same evidence always yields the same id, so replays dedup."""
    digest = hashlib.sha256(
        "\x1f".join((tenant_id, user_id, spec.key, spec.reason, *spec.turn_ids)).encode()
    )
    return digest.hexdigest()[:32]


def is_pinned(event: InteractionEvent) -> bool:
    """The event asks to be pinned, or says "remember this"."""
    return event.metadata.pin or is_remember_request(event.text)


# A bot's canned lines ("Your parcel is on its way", "Let me check that for you"). They used
# to be found by tenant-wide counts (a sentence said to 25+ users), but those counts are
# shared across partitions: a decision reading them depends on how far the other partitions
# got, so the same log gave other triggers with 1 or 4 partitions. What makes a canned line
# harmful is that it recurs to the same user session after session, where RecMem's
# recurrence would fire on it; so the rule is the user's own: an assistant or system
# sentence the user already heard from the bot counts for nothing (the first time it is
# content, then it is the script). A user repeating themselves is left alone: that is the
# recurrence signal itself.
SCRIPTED_ROLES = frozenset({"assistant", "system"})


def scripted_phrases(event: InteractionEvent) -> tuple[str, ...]:
    """The sentence fingerprints this turn adds to what its user heard from the bot (none
    for the user's own turns)."""
    return tuple(phrase_keys(event.text)) if event.role in SCRIPTED_ROLES else ()


def canned_phrases(event: InteractionEvent, heard: Collection[str]) -> frozenset[str]:
    """The turn's sentences that count for nothing: the bot's, heard by this user before."""
    return frozenset(p for p in scripted_phrases(event) if p in heard)


def memory_in(event: InteractionEvent, vector: FloatArray) -> MemoryIn:
    """The event as the clustering engine takes it (``vector``: its unit embedding)."""
    return MemoryIn(
        event.event_id,
        vector,
        event.metadata.importance,
        terms_of(event.text),
        is_pinned(event),
    )


@dataclass(frozen=True)
class EventPlan:
    """What one event changes (``streams.memorize`` turns it into the state update)."""

    turn: StoredTurn  # with its cluster at store time (members move on merge/split)
    signal: TurnSignal
    keep: bool  # the turn enters the recurrence window
    pending_remove: tuple[str, ...]  # consumed by a trigger, or fallen out of the window
    clustering: StepResult
    keys: dict[str, KeyState]  # only the keys this turn changed
    triggers: tuple[RecurrenceTrigger, ...]


def decide_event(
    event: InteractionEvent,
    vector: FloatArray,
    clusters: ClusterState,
    pending: Sequence[TurnSignal],
    keys: Mapping[str, KeyState],
    common_phrases: frozenset[str],
    member_vectors: Mapping[str, FloatArray],
    now: float,
    *,
    cluster_params: ClusterParams,
    recurrence_params: RecurrenceParams,
    window: int,
) -> EventPlan:
    """The event's plan, given the user's state as read (``pending`` oldest first) and
    ``now``, the event's own time in epoch seconds (event time: a replay decides the same).

    ``common_phrases``: the event's sentence fingerprints that count for nothing (they make
    no turn salient: ``canned_phrases``); ``member_vectors``: what ``vectors_needed`` asked
    for.
    """
    tenant, user = event.tenant_id, event.user_id
    salient = is_salient(event.text, common_phrases)
    pinned = is_pinned(event)
    clustering = step(clusters, memory_in(event, vector), now, cluster_params, member_vectors)
    entities = tuple(extract_entities(event.text))
    signal = TurnSignal(
        event_id=event.event_id,
        session_id=event.session_id,
        ts=now,
        vector=vector,
        entities=entities,
        cluster_id=clustering.cluster_id,  # provisional (nearest) while buffered
        salient=salient,
        pinned=pinned,
    )
    detection = detect(signal, pending, keys, now, recurrence_params)
    consumed = set(detection.consumed_turn_ids)
    keep = salient and event.event_id not in consumed
    still_pending = [p.event_id for p in pending if p.event_id not in consumed]
    # The window keeps the newest turns; the oldest fall out (they stay in short-term memory).
    overflow = len(still_pending) + int(keep) - window
    evicted = still_pending[:overflow] if overflow > 0 else []
    triggers = tuple(
        RecurrenceTrigger(
            trigger_id=trigger_id(tenant, user, spec),
            tenant_id=tenant,
            user_id=user,
            key=spec.key,
            reason=spec.reason,
            score=spec.score,
            turn_ids=list(spec.turn_ids),
            importance=1.0 if pinned else event.metadata.importance,
            ts=event.ts,
        )
        for spec in detection.triggers
    )
    return EventPlan(
        turn=stored_turn(event, cluster_id=clustering.cluster_id, entities=entities),
        signal=signal,
        keep=keep,
        pending_remove=(*consumed, *evicted),
        clustering=clustering,
        keys=detection.updated_keys,
        triggers=triggers,
    )
