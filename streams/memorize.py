"""The ``memorize`` processor: cluster the turn, keep it in short-term memory, detect recurrence.

It is the one writer of a user's state in Redis (it owns the user's partition). Per event:
read the user's state, decide with the pure engines in ``memory/``, emit triggers, then write
everything in one transaction with the processed-event mark. Triggers go out before the
write, so a crash in between re-emits the same trigger id (the consolidator dedups) and
never loses one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import faust
import numpy as np

from memory.clustering import (
    ClusterParams,
    ClusterState,
    StepResult,
    vectors_needed,
    with_descriptions,
)
from memory.memorize import decide_event, memory_in
from memory.memorize import trigger_id as trigger_id
from memory.recurrence import RecurrenceParams
from memory.text import phrase_keys
from memory.vectors import normalize
from memstream.metrics import Metrics
from schemas import EncodedEvent, RecurrenceTrigger
from stores.broker import Topics
from stores.redis_state import RedisState, UserUpdate
from stores.stage import Outcome, Received, Stage

STAGE = "memorize"


@dataclass(frozen=True)
class Decision:
    """What one event changes: triggers to emit, then the state update to apply."""

    tenant_id: str
    user_id: str
    triggers: list[RecurrenceTrigger]
    update: UserUpdate
    clustering: StepResult | None = None  # for metrics
    phrases: tuple[str, ...] = ()  # sentence fingerprints, counted per tenant after the write


@dataclass
class Memorizer:
    state: RedisState
    cluster_params: ClusterParams
    recurrence_params: RecurrenceParams
    window: int
    # Optional: the encoder that embeds new cluster descriptions (None = descriptions stay
    # unembedded and retrieval ranks those clusters by centroid only). No model is called
    # here: fuzzy memories wait in the buffer and descriptions are keywords, so ingest costs
    # no LLM latency and the same log always gives the same clusters.
    embed: Callable[[Sequence[str]], np.ndarray] | None = field(default=None, repr=False)
    # A sentence said by this many distinct users of a tenant counts for nothing (0 = off).
    common_phrase_users: int = 25

    async def decide(self, encoded: EncodedEvent) -> Decision | None:
        """What this event changes, or None when it was already processed (or its user was
        forgotten after it was stamped). Every read first, then ``memory.memorize``'s pure
        ``decide_event``; only new cluster descriptions are embedded after it."""
        event = encoded.event
        tenant, user = event.tenant_id, event.user_id
        snapshot = await self.state.load_user(tenant, user, event.event_id)
        if snapshot.already_processed:
            return None
        if snapshot.forgotten_at is not None and event.ts.timestamp() <= snapshot.forgotten_at:
            return None  # in flight (or replayed) when the user was forgotten: stays forgotten
        vector = normalize(np.asarray(encoded.embedding, dtype=np.float32))
        phrases = tuple(phrase_keys(event.text))
        common = await self._common_phrases(tenant, phrases)
        clusters = snapshot.clusters or ClusterState.empty(self.cluster_params)
        needed = vectors_needed(clusters, memory_in(event, vector), self.cluster_params)
        vectors = await self.state.member_vectors(tenant, user, needed) if needed else {}
        plan = decide_event(
            event,
            vector,
            clusters,
            snapshot.pending,
            snapshot.keys,
            common,
            vectors,
            event.ts.timestamp(),
            cluster_params=self.cluster_params,
            recurrence_params=self.recurrence_params,
            window=self.window,
        )
        clustering = plan.clustering
        described = clustering.maintenance.described if clustering.maintenance else ()
        if described and self.embed is not None:
            clustering = await self._describe(clustering, described)
        update = UserUpdate(
            event_id=event.event_id,
            turn=plan.turn,
            vector=vector,
            pending_add=plan.signal if plan.keep else None,
            pending_remove=plan.pending_remove,
            clusters=clustering.state,
            clusters_changed=clustering.changed,
            clusters_removed=clustering.removed,
            cluster_version=snapshot.cluster_version,
            keys=plan.keys,
        )
        return Decision(tenant, user, list(plan.triggers), update, clustering, phrases)

    async def _common_phrases(self, tenant: str, phrases: tuple[str, ...]) -> frozenset[str]:
        """The turn's sentence fingerprints that many users of the tenant have said."""
        if not phrases or self.common_phrase_users <= 0:
            return frozenset()
        users = await self.state.phrase_users(tenant, phrases)
        return frozenset(
            p for p, n in zip(phrases, users, strict=True) if n >= self.common_phrase_users
        )

    async def _describe(self, result: StepResult, cluster_ids: Sequence[str]) -> StepResult:
        """Embeddings for clusters whose keyword descriptions changed."""
        clusters = [c for c in (result.state.cluster(i) for i in cluster_ids) if c is not None]
        texts = [c.description for c in clusters]
        vectors: list[np.ndarray | None] = [None] * len(texts)
        if self.embed is not None:
            embedded = await asyncio.to_thread(self.embed, texts)
            vectors = [embedded[i] if texts[i] else None for i in range(len(texts))]
        state = with_descriptions(
            result.state,
            {c.cluster_id: (t, v) for c, t, v in zip(clusters, texts, vectors, strict=True)},
        )
        return replace(result, state=state)

    async def apply(self, decision: Decision) -> None:
        """Write what ``decide`` decided; call once its triggers are delivered."""
        await self.state.apply(decision.tenant_id, decision.user_id, decision.update)
        await self.state.record_phrases(decision.tenant_id, decision.user_id, decision.phrases)


def register_memorize(
    app: faust.App, topics: Topics, memorizer: Memorizer, metrics: Metrics
) -> None:
    stage = Stage(STAGE, topics.encoded, topics.dlq, metrics)

    async def handle(message: Received[EncodedEvent]) -> Outcome:
        encoded = message.value
        decision = await stage.retry(partial(memorizer.decide, encoded))
        if decision is None:
            await stage.retry(
                partial(_resend_open_triggers, memorizer.state, topics, message.key, encoded)
            )
            return "duplicate"
        await stage.retry(
            partial(_remember_triggers, memorizer.state, decision, encoded.event.event_id)
        )
        for trigger in decision.triggers:
            delivery = await topics.triggers.send(
                key=message.key, value=trigger.model_dump_json().encode()
            )
            await delivery  # delivered before the state says "processed"
            metrics.triggers.labels(trigger.reason).inc()
        await stage.retry(partial(memorizer.apply, decision))
        _count_clustering(metrics, decision.clustering)
        return "ok"

    stage.per_message(app, EncodedEvent, handle, agent="memstream.memorize")


async def _remember_triggers(state: RedisState, decision: Decision, event_id: str) -> None:
    """Keep what this event triggers until the event's seen mark expires: see below."""
    if decision.triggers:
        payloads = {t.trigger_id: t.model_dump_json().encode() for t in decision.triggers}
        await state.remember_event_triggers(
            decision.tenant_id, decision.user_id, event_id, payloads
        )


async def _resend_open_triggers(
    state: RedisState, topics: Topics, key: bytes | None, encoded: EncodedEvent
) -> None:
    """A duplicate event re-sends its triggers that were never consolidated.

    Its triggers were delivered before it was marked seen, but delivered is not consumed: a
    broker that lost its log since then lost them too, and the replayed event, now a
    duplicate, would never send them again. The consolidator skips a trigger whose ``trig:``
    marker is set, so a re-send that races the first delivery costs a lookup, not a memory.
    """
    event = encoded.event
    for payload in await state.open_event_triggers(event.tenant_id, event.user_id, event.event_id):
        await (await topics.triggers.send(key=key, value=payload))


def _count_clustering(metrics: Metrics, result: StepResult | None) -> None:
    if result is None:
        return
    events = metrics.cluster_events
    events.labels("fuzzy" if result.buffered else result.band).inc()
    if result.flushed:
        events.labels("flush").inc()
    report = result.maintenance
    if report is not None:
        events.labels("maintenance").inc()
        for name, n in (("split", report.splits), ("merge", report.merges)):
            if n:
                events.labels(name).inc(n)
        if report.archived:
            events.labels("archive").inc(report.archived)
