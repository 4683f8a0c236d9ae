"""The ``memorize`` processor: cluster the turn, keep it in short-term memory, detect recurrence.

It is the one writer of a user's state in Redis (it owns the user's partition). Per event:
read the user's state, decide with the pure engines in ``memory/``, emit triggers, then write
everything in one transaction with the processed-event mark. Triggers go out before the
write, so a crash in between re-emits the same trigger id (the consolidator dedups) and
never loses one.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from functools import partial

import faust
import numpy as np

from memory.clustering import ClusterParams, assign
from memory.recurrence import RecurrenceParams, TriggerSpec, TurnSignal, detect
from memory.text import extract_entities, is_remember_request, is_salient
from memory.vectors import normalize
from memstream.metrics import Metrics
from schemas import EncodedEvent, RecurrenceTrigger, StoredTurn
from stores.redis_state import RedisState, UserUpdate
from streams.app import Topics
from streams.handling import DeadLetters, with_retries

STAGE = "memorize"


def trigger_id(tenant_id: str, user_id: str, spec: TriggerSpec) -> str:
    """Deterministic: the same evidence always yields the same id, so replays dedup."""
    digest = hashlib.sha256(
        "\x1f".join((tenant_id, user_id, spec.key, spec.reason, *spec.turn_ids)).encode()
    )
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class Decision:
    """What one event changes: triggers to emit, then the state update to apply."""

    tenant_id: str
    user_id: str
    triggers: list[RecurrenceTrigger]
    update: UserUpdate


@dataclass
class Memorizer:
    state: RedisState
    cluster_params: ClusterParams
    recurrence_params: RecurrenceParams
    window: int

    async def decide(self, encoded: EncodedEvent) -> Decision | None:
        """What this event changes, or None when it was already processed."""
        event = encoded.event
        tenant, user = event.tenant_id, event.user_id
        snapshot = await self.state.load_user(tenant, user, event.event_id)
        if snapshot.already_processed:
            return None
        now = event.ts.timestamp()
        vector = normalize(np.asarray(encoded.embedding, dtype=np.float32))
        assignment = assign(
            snapshot.clusters,
            vector,
            event.metadata.importance,
            now,
            f"c{snapshot.next_cluster_number}",
            self.cluster_params,
        )
        salient = is_salient(event.text)
        pinned = event.metadata.pin or is_remember_request(event.text)
        entities = tuple(extract_entities(event.text))
        signal = TurnSignal(
            event_id=event.event_id,
            session_id=event.session_id,
            ts=now,
            vector=vector,
            entities=entities,
            cluster_id=assignment.cluster.cluster_id,
            salient=salient,
            pinned=pinned,
        )
        detection = detect(signal, snapshot.pending, snapshot.keys, now, self.recurrence_params)
        consumed = set(detection.consumed_turn_ids)
        keep = salient and event.event_id not in consumed
        still_pending = [p.event_id for p in snapshot.pending if p.event_id not in consumed]
        # The window keeps the newest turns; the oldest fall out (they stay in short-term memory).
        overflow = len(still_pending) + int(keep) - self.window
        evicted = still_pending[:overflow] if overflow > 0 else []
        triggers = [
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
        ]
        turn = StoredTurn(
            event_id=event.event_id,
            session_id=event.session_id,
            role=event.role,
            text=event.text,
            ts=event.ts,
            speaker=event.metadata.speaker,
            cluster_id=assignment.cluster.cluster_id,
            entities=list(entities),
            importance=event.metadata.importance,
            pinned=pinned,
        )
        update = UserUpdate(
            event_id=event.event_id,
            turn=turn,
            vector=vector,
            pending_add=signal if keep else None,
            pending_remove=[*consumed, *evicted],
            cluster=assignment.cluster,
            next_cluster_number=snapshot.next_cluster_number + 1 if assignment.created else None,
            keys=detection.updated_keys,
        )
        return Decision(tenant, user, triggers, update)

    async def apply(self, decision: Decision) -> None:
        """Write what ``decide`` decided; call once its triggers are delivered."""
        await self.state.apply(decision.tenant_id, decision.user_id, decision.update)


def register_memorize(
    app: faust.App, topics: Topics, memorizer: Memorizer, metrics: Metrics
) -> None:
    dead_letters = DeadLetters(topics.dlq, metrics, stage=STAGE, source=topics.encoded)

    @app.agent(topics.encoded, name="memstream.memorize")
    async def memorize(stream: faust.StreamT[bytes]) -> None:
        async for message in stream.events():
            started = time.perf_counter()
            encoded = await dead_letters.decode(EncodedEvent, message.key, message.value)
            if encoded is None:
                continue
            try:
                decision = await with_retries(partial(memorizer.decide, encoded), stage=STAGE)
                if decision is None:
                    metrics.events.labels(STAGE, "duplicate").inc()
                    continue
                for trigger in decision.triggers:
                    delivery = await topics.triggers.send(
                        key=message.key, value=trigger.model_dump_json().encode()
                    )
                    await delivery  # delivered before the state says "processed"
                    metrics.triggers.labels(trigger.reason).inc()
                await with_retries(partial(memorizer.apply, decision), stage=STAGE)
            except Exception as exc:
                await dead_letters.poison(exc, message.key, message.value)
                continue
            metrics.events.labels(STAGE, "ok").inc()
            metrics.stage_latency.labels(STAGE).observe(time.perf_counter() - started)
