"""The ``memorize`` processor: cluster the turn, keep it in short-term memory, detect recurrence.

It is the one writer of a user's state in Redis (it owns the user's partition). Per fetched
batch: one pipelined read of every user in it (``load_users``), then per user its events in
log order through the pure engines in ``memory/`` (each event sees the state the previous
one left, chained in process by ``snapshot_after``), the batch's triggers sent and
delivered, then per user one transaction with every event and its processed mark
(``apply_users``). Triggers go out before the write, so a crash in between re-emits the
same trigger ids (the consolidator dedups) and never loses one. A batch decides exactly
what its events decide one by one: nothing depends on which batch an event landed in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Literal, Protocol, TypeVar

import numpy as np

from memstream.memory.clustering import (
    ClusterParams,
    ClusterState,
    StepResult,
    vectors_needed,
    with_descriptions,
)
from memstream.memory.memorize import canned_phrases, decide_event, memory_in, scripted_phrases
from memstream.memory.memorize import trigger_id as trigger_id
from memstream.memory.recurrence import RecurrenceParams
from memstream.memory.vectors import normalize
from memstream.metrics import Metrics, StageSeries
from memstream.schemas import EncodedEvent, RecurrenceTrigger
from memstream.settings import Settings
from memstream.stores.cpu import off_loop
from memstream.stores.forget import forgotten
from memstream.stores.short_term import (
    MemorizeState,
    UserRead,
    UserSnapshot,
    UserUpdate,
    UserWrite,
    snapshot_after,
)
from memstream.stores.text_encoder import TextEncoder
from memstream.streaming.broker import Topics
from memstream.streaming.params import cluster_params, recurrence_params
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import Received

NAME = "memorize"
T = TypeVar("T")
# How long one event's decision (clustering, salience, keys, recurrence: pure CPU, off the
# event loop) may take before the event is dead-lettered. Text work is linear in a turn of
# at most 8,000 characters, so a decision takes milliseconds; this bounds what a defect or
# a hostile input could cost the user's partition, never retried.
DECIDE_BUDGET_S = 5.0


class OverBudget(Exception):
    """A decision that took longer than its budget (the event is poison)."""


class Retry(Protocol):
    """How a step is retried (``Stage.retry``: outages waited out, errors tried 3 times)."""

    async def __call__(self, work: Callable[[], Awaitable[T]]) -> T: ...


async def once(work: Callable[[], Awaitable[T]]) -> T:
    """No retry (unit tests)."""
    return await work()


@dataclass(frozen=True)
class Decision:
    """What one event changes: triggers to emit, then the state update to apply."""

    tenant_id: str
    user_id: str
    triggers: list[RecurrenceTrigger]
    update: UserUpdate
    clustering: StepResult | None = None  # for metrics


# What became of one event of a batch: decided (its decision was delivered and written),
# already processed, dropped for a forgotten user, or the error that makes it poison.
Skipped = Literal["duplicate", "forgotten"]
Result = Decision | Skipped | Exception
# Sends the decisions' triggers and returns once every one is delivered.
Deliver = Callable[[Sequence[tuple[Received[EncodedEvent], Decision]]], Awaitable[None]]


@dataclass
class Memorizer:
    state: MemorizeState
    cluster_params: ClusterParams
    recurrence_params: RecurrenceParams
    window: int
    # Optional: the encoder that embeds new cluster descriptions (None = descriptions stay
    # unembedded and retrieval ranks those clusters by centroid only). No model is called
    # here: fuzzy memories wait in the buffer and descriptions are keywords, so ingest costs
    # no LLM latency and the same log always gives the same clusters.
    embed: Callable[[Sequence[str]], np.ndarray] | None = field(default=None, repr=False)
    decide_budget_s: float = DECIDE_BUDGET_S

    # -- a batch -------------------------------------------------------------------------

    async def memorize(
        self,
        users: Sequence[Sequence[Received[EncodedEvent]]],
        deliver: Deliver,
        retry: Retry = once,
    ) -> list[tuple[Received[EncodedEvent], Result]]:
        """Each user's events (in log order; users apart) read, decided, delivered, written.

        Per event the result: its decision, why it was skipped, or the error it raised
        (poison: it changed nothing, and the user's later events go on without it). An
        error of the read, the delivery or the write is the whole call's.
        """
        reads = [_read_of([i.value for i in items]) for items in users]
        snapshots = await retry(partial(self.state.load_users, reads))
        runs = await asyncio.gather(
            *(
                self._run_user(items, snapshot, deliver, retry)
                for items, snapshot in zip(users, snapshots, strict=True)
            )
        )
        unwritten = [pending for _, pending in runs if pending]
        await deliver([pair for pending in unwritten for pair in pending])
        await retry(partial(self.state.apply_users, [_write_of(p) for p in unwritten]))
        return [result for results, _ in runs for result in results]

    async def _run_user(
        self,
        items: Sequence[Received[EncodedEvent]],
        snapshot: UserSnapshot,
        deliver: Deliver,
        retry: Retry,
    ) -> tuple[
        list[tuple[Received[EncodedEvent], Result]], list[tuple[Received[EncodedEvent], Decision]]
    ]:
        """One user's events in order; (every result, the decisions not yet written)."""
        results: list[tuple[Received[EncodedEvent], Result]] = []
        pending: list[tuple[Received[EncodedEvent], Decision]] = []
        for item in items:
            skipped = _skipped(snapshot, item)
            if skipped is not None:
                results.append((item, skipped))
                continue
            vector = _unit(item.value)  # once per event: both steps below read it
            try:
                needed = self._needed(snapshot, item.value, vector)
            except Exception as exc:  # this event is poison; the state goes on without it
                results.append((item, exc))
                continue
            if needed and pending:
                # A split reads member vectors from Redis: write what this batch decided for
                # the user first, so the read sees what one-by-one would have seen. (Its
                # failure is the batch's, not this event's.)
                await deliver(pending)
                await retry(partial(self.state.apply_users, [_write_of(pending)]))
                pending = []
            try:
                vectors = (
                    await retry(partial(self._member_vectors, item.value, needed)) if needed else {}
                )
                decision = await self._decide(snapshot, item.value, vector, vectors, retry)
            except Exception as exc:  # this event is poison; the state goes on without it
                results.append((item, exc))
                continue
            results.append((item, decision))
            pending.append((item, decision))
            snapshot = snapshot_after(snapshot, decision.update)
        return results, pending

    def _needed(
        self, snapshot: UserSnapshot, encoded: EncodedEvent, vector: np.ndarray
    ) -> list[str]:
        clusters = snapshot.clusters or ClusterState.empty(self.cluster_params)
        memory = memory_in(encoded.event, vector)
        return vectors_needed(clusters, memory, self.cluster_params)

    async def _member_vectors(
        self, encoded: EncodedEvent, needed: list[str]
    ) -> dict[str, np.ndarray]:
        event = encoded.event
        return await self.state.member_vectors(event.tenant_id, event.user_id, needed)

    async def _decide(
        self,
        snapshot: UserSnapshot,
        encoded: EncodedEvent,
        vector: np.ndarray,
        vectors: dict[str, np.ndarray],
        retry: Retry,
    ) -> Decision:
        """``memory.memorize``'s pure ``decide_event`` on what was read (``vector``: the
        event's unit embedding); only new cluster descriptions are embedded after it."""
        event = encoded.event
        decide = partial(
            decide_event,
            event,
            vector,
            snapshot.clusters or ClusterState.empty(self.cluster_params),
            snapshot.pending,
            snapshot.keys,
            canned_phrases(event, snapshot.heard),
            vectors,
            event.ts.timestamp(),
            cluster_params=self.cluster_params,
            recurrence_params=self.recurrence_params,
            window=self.window,
        )
        # Off the event loop: health checks, the RPC and other users' I/O go on meanwhile.
        # A decision past its budget runs on in its thread, but the stage moves on without it.
        try:
            plan = await asyncio.wait_for(off_loop(decide), self.decide_budget_s)
        except TimeoutError:
            raise OverBudget(
                f"deciding the event took over its {self.decide_budget_s:g} s budget"
            ) from None
        clustering = plan.clustering
        described = clustering.maintenance.described if clustering.maintenance else ()
        if described and self.embed is not None:
            clustering = await retry(partial(self._describe, clustering, described))
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
            heard=scripted_phrases(event),
            # Kept in the event's transaction, so a duplicate of it can re-send them.
            triggers={t.trigger_id: t.model_dump_json().encode() for t in plan.triggers},
        )
        return Decision(event.tenant_id, event.user_id, list(plan.triggers), update, clustering)

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


def _unit(encoded: EncodedEvent) -> np.ndarray:
    return normalize(np.asarray(encoded.embedding, dtype=np.float32))


def _read_of(events: Sequence[EncodedEvent]) -> UserRead:
    """What one user's events of a batch need read: their seen marks, and whether the user
    heard the bot's sentences among them before."""
    first = events[0].event
    phrases = dict.fromkeys(p for e in events for p in scripted_phrases(e.event))
    return UserRead(first.tenant_id, first.user_id, [e.event.event_id for e in events], [*phrases])


def _skipped(snapshot: UserSnapshot, item: Received[EncodedEvent]) -> Skipped | None:
    event = item.value.event
    if event.event_id in snapshot.processed:
        return "duplicate"
    if forgotten(snapshot.forgotten_at, event.ts.timestamp(), item.arrived):
        return "forgotten"
    return None


def _write_of(decided: Sequence[tuple[Received[EncodedEvent], Decision]]) -> UserWrite:
    first = decided[0][1]
    return UserWrite(first.tenant_id, first.user_id, [d.update for _, d in decided])


def by_user(batch: Sequence[Received[EncodedEvent]]) -> list[list[Received[EncodedEvent]]]:
    """The batch's events per user, each user's in batch (= log) order."""
    users: dict[tuple[str, str], list[Received[EncodedEvent]]] = {}
    for item in batch:
        event = item.value.event
        users.setdefault((event.tenant_id, event.user_id), []).append(item)
    return list(users.values())


def description_encoder(
    settings: Settings, encoder: TextEncoder
) -> Callable[[Sequence[str]], np.ndarray] | None:
    """What embeds new cluster descriptions at ingest: only the hierarchical retrieval reads
    them (``memory.hierarchy.rank_clusters``); in the other modes they were 15% more
    encoder texts per event (full bench, 1.18 per event) that nothing used. Clusters
    without one rank by their centroid, so a switch to hierarchical later only ranks
    the clusters described before it by centroid until their description next changes."""
    if settings.rpc.short_term_mode != "hierarchical":
        return None
    # A cluster's description often repeats; the cache gives the same bytes back.
    return partial(encoder.encode, cache=True)


def start(services: Services) -> None:
    settings, topics, metrics = services.settings, services.topics, services.metrics
    memorizer = Memorizer(
        state=services.state,
        cluster_params=cluster_params(settings.cluster),
        recurrence_params=recurrence_params(settings.recurrence),
        window=settings.recurrence.window_turns,
        embed=description_encoder(settings, services.encoder),
    )
    stage = services.stage(NAME, topics.encoded)

    async def deliver(decided: Sequence[tuple[Received[EncodedEvent], Decision]]) -> None:
        deliveries = []
        for item, d in decided:  # all sent, then all awaited: one producer flush
            for trigger in d.triggers:
                payload = d.update.triggers[trigger.trigger_id]
                deliveries.append(
                    (trigger, await topics.triggers.send(key=item.key, value=payload))
                )
        for trigger, delivery in deliveries:
            await delivery  # delivered before the state says "processed"
            metrics.triggers.labels(trigger.reason).inc()

    async def handle(batch: list[Received[EncodedEvent]]) -> int:
        users = by_user(batch)
        try:
            results = await memorizer.memorize(users, deliver, stage.retry)
        except Exception:
            # A read, delivery or write kept failing: each user alone, so one user's bad
            # state sinks only that user's events (already written ones read as duplicates).
            results = []
            for items in users:
                try:
                    results += await memorizer.memorize([items], deliver, stage.retry)
                except Exception as exc:
                    results += [(item, exc) for item in items]
        handled = 0
        for item, result in results:
            if isinstance(result, Decision):
                handled += 1
                _count_clustering(metrics, result.clustering)
            elif isinstance(result, Exception):
                await stage.poison(result, item)
            else:
                if result == "duplicate":
                    await stage.retry(partial(_resend_open_triggers, memorizer.state, topics, item))
                metrics.events.labels(NAME, "duplicate").inc()
        return handled

    # memorize takes the batches the encode stage makes (one Redis read and one
    # transaction per user per batch); a short wait, as events arrive already batched.
    stage.batched(
        services.app,
        EncodedEvent,
        handle,
        agent="memstream.memorize",
        batch_size=settings.encoder.batch_size,
        within_s=min(settings.encoder.batch_within_s, 0.02),
        eager=True,  # a batch decides what its events decide one by one: no reason to wait
    )


async def _resend_open_triggers(
    state: MemorizeState, topics: Topics, item: Received[EncodedEvent]
) -> None:
    """A duplicate event re-sends its triggers that were never consolidated.

    Its triggers were delivered before it was marked seen, but delivered is not consumed: a
    broker that lost its log since then lost them too, and the replayed event, now a
    duplicate, would never send them again. The consolidator skips a trigger whose ``trig:``
    marker is set, so a re-send that races the first delivery costs a lookup, not a memory.
    """
    event = item.value.event
    for payload in await state.open_event_triggers(event.tenant_id, event.user_id, event.event_id):
        await (await topics.triggers.send(key=item.key, value=payload))


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


STAGE = StageSpec("process", start, series=(StageSeries(NAME, ("ok", "duplicate", "dlq")),))
