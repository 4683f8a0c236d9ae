"""The consolidation worker: recurrence triggers -> one structured memory per key in Qdrant.

Triggers arrive in batches; ``memory.consolidation_jobs`` turns a batch into one queue per
user, in log order. Users run side by side (LLM calls bounded by ``max_concurrency``); a
user's jobs run one at a time, so a memory, its links and the LLM calls spent on it are a
function of the log, never of which batch a trigger landed in. Each job loads the key's
turns from Redis (or the archive) and its current memory from the long-term store, asks
the consolidator (LLM or extractive), merges, and upserts under the deterministic id
uuid5(tenant:user:key) — consolidating a topic again updates its memory, never adds one.
A trigger that brings no turn the memory does not already hold costs no LLM call (it can
only raise the memory's strength), nor does one that comes within ``min_interval_s`` of
event time of the newest turn the memory holds (deferred to the key's next trigger).
Then links: the user's memories that share an entity key or lie close in vector space are
linked both ways (``memory.links``). The read-merge-write runs under the user's lock, which
the strength worker (feedback boosts, decay) shares, so neither overwrites the other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from memstream.memory.consolidation import merge_memory, reinforced
from memstream.memory.consolidation_jobs import Job, new_evidence, pays_for_llm, user_queues
from memstream.memory.links import LinkParams, entity_keys, linked, related_ids
from memstream.memory.strength import StrengthParams, initial_strength
from memstream.memory.vectors import mean_direction
from memstream.metrics import Metrics, StageSeries
from memstream.schemas import ConsolidatedMemory, RecurrenceTrigger, StoredTurn
from memstream.schemas.identity import user_key
from memstream.stores.llm import Consolidator, build_messages
from memstream.stores.longterm import LongTermStore, memory_point_id
from memstream.stores.short_term import ShortTermState
from memstream.stores.text_encoder import TextEncoder, TokenCounter
from memstream.streaming.locks import UserLocks
from memstream.streaming.params import link_params, strength_params
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import Received

NAME = "consolidate"
# How long a job waits for the archive to hold a trigger's turns that left the hot tier.
ARCHIVE_WAIT_S = 30.0


@dataclass
class ConsolidationWorker:
    state: ShortTermState
    longterm: LongTermStore
    consolidator: Consolidator
    encoder: TextEncoder
    metrics: Metrics
    max_turns: int
    max_concurrency: int
    # Event time a key's memory rests between two consolidations (memory.consolidation_jobs).
    min_interval_s: float = 60.0
    locks: UserLocks = field(default_factory=UserLocks)
    links: LinkParams = field(default_factory=LinkParams)
    strength: StrengthParams = field(default_factory=StrengthParams)

    def __post_init__(self) -> None:
        self._limit = asyncio.Semaphore(self.max_concurrency)
        self._count_tokens = TokenCounter(self.encoder)

    async def _archived(
        self, job: Job, event_ids: list[str]
    ) -> list[tuple[StoredTurn, np.ndarray]]:
        """The turns of ``event_ids`` from the archive, waiting (bounded) for any it has not
        written yet: the archive worker follows ``memstream.encoded`` on its own, and a
        memory must not depend on which of the two got there first."""
        waited, pause = 0.0, 0.05
        while True:
            found = await self.longterm.get_turns(job.tenant_id, job.user_id, event_ids)
            if len(found) >= len(event_ids) or waited >= ARCHIVE_WAIT_S:
                return [(a.turn, a.vector) for a in found]
            # A forgotten user's turns are never archived: nothing to wait for.
            if await self.state.forgotten_at(job.tenant_id, job.user_id) is not None:
                return [(a.turn, a.vector) for a in found]
            await asyncio.sleep(pause)
            waited += pause
            pause = min(pause * 2, 1.0)

    async def run_job(self, job: Job) -> ConsolidatedMemory | None:
        """The memory written for this job, or None when there was nothing new to do."""
        if await self.state.trigger_done(job.tenant_id, job.user_id, job.trigger_id):
            self.metrics.consolidations.labels("skipped").inc()
            return None
        memory_id = memory_point_id(job.tenant_id, job.user_id, job.key)
        existing = await self.longterm.get(job.tenant_id, job.user_id, memory_id)
        if existing is not None and not pays_for_llm(job, existing, self.min_interval_s):
            if new_evidence(job, existing):
                # Too soon after the memory's newest turn (event time): the key's next
                # trigger brings these turns along; until then they are retrieved as turns.
                await self._mark_done(job)
                self.metrics.consolidations.labels("deferred").inc()
            else:
                await self._reinforce(job, memory_id)
            return None
        sources = [
            (t.turn, t.vector)
            for t in await self.state.turns(job.tenant_id, job.user_id, job.turn_ids)
        ]
        # A trigger's older turns may have left the hot tier (event-time TTL, cap): the
        # archive holds every turn, so a recurrence months apart still sees its evidence.
        hot = {turn.event_id for turn, _ in sources}
        cold = [i for i in job.turn_ids if i not in hot]
        if cold:
            sources += await self._archived(job, cold)
        sources = sorted(sources, key=lambda s: (s[0].ts, s[0].event_id))[-self.max_turns :]
        turns = [turn for turn, _ in sources]
        if not turns:  # every turn expired or was forgotten: nothing to consolidate
            await self._mark_done(job)
            self.metrics.consolidations.labels("skipped").inc()
            return None
        # Event time, never the wall clock: the memory's times are its sources' times, so a
        # replay of an old log writes the same memory the live stream did.
        now = max(t.ts for t in turns)
        async with self._limit:
            started = time.perf_counter()
            # What the consolidator reads, in the encoder's tokens whatever the backend (the
            # extractive one reads the same turns): what gated and eager consolidation spend.
            prompt = build_messages(job.key, turns, existing, now)
            self.metrics.consolidation_input_tokens.labels(self.consolidator.name).inc(
                sum(self._count_tokens(m["content"]) for m in prompt)
            )
            try:
                content = await self.consolidator.consolidate(job.key, turns, existing, now)
            except Exception:
                self.metrics.llm_calls.labels(self.consolidator.name, "error").inc()
                raise
            self.metrics.llm_calls.labels(self.consolidator.name, "ok").inc()
            self.metrics.stage_latency.labels("llm").observe(time.perf_counter() - started)
        async with self.locks(job.tenant_id, job.user_id):
            # A forget may have landed during the LLM call: its turns must not come back.
            forgotten_at = await self.state.forgotten_at(job.tenant_id, job.user_id)
            if forgotten_at is not None and all(t.ts.timestamp() <= forgotten_at for t in turns):
                await self._mark_done(job)
                self.metrics.consolidations.labels("skipped").inc()
                return None
            # Read again under the lock: a boost may have landed during the LLM call.
            existing = await self.longterm.get(job.tenant_id, job.user_id, memory_id)
            memory = merge_memory(
                existing,
                content,
                memory_id=memory_id,
                tenant_id=job.tenant_id,
                user_id=job.user_id,
                key=job.key,
                source_event_ids=[t.event_id for t in turns],
                strength=initial_strength(job.score, job.importance, self.strength),
                now=now,
            )
            if existing is not None and memory == existing:
                await self._mark_done(job)
                self.metrics.consolidations.labels("unchanged").inc()
                return None
            # The memory's direction is its sources' (their vectors were encoded at ingest):
            # re-encoding its text cost ~10 turns' ONNX time per consolidation, and the
            # encoder sees only its first 256 tokens (measured on LoCoMo-dev: BENCHMARKS.md).
            vector = mean_direction(np.stack([v for _, v in sources]))
            memory = await self._link(memory, vector)
            await self.longterm.upsert([(memory, vector)])
            await self._link_back(memory)
        await self._mark_done(job)
        self.metrics.consolidations.labels("updated" if existing else "created").inc()
        return memory

    async def _reinforce(self, job: Job, memory_id: str) -> None:
        """No new evidence: no LLM call; the trigger's strength, if higher, is kept (as the
        merge would keep it), in place (the memory says the same: its vector is kept)."""
        async with self.locks(job.tenant_id, job.user_id):
            existing = await self.longterm.get(job.tenant_id, job.user_id, memory_id)
            strength = initial_strength(job.score, job.importance, self.strength)
            if existing is not None and (after := reinforced(existing, strength)) is not existing:
                await self.longterm.rewrite([after])
        await self._mark_done(job)
        self.metrics.consolidations.labels("unchanged").inc()

    async def _link(self, memory: ConsolidatedMemory, vector: np.ndarray) -> ConsolidatedMemory:
        """``memory`` linked to the user's related memories (shared entity keys, close vectors)."""
        tenant, user, limit = memory.tenant_id, memory.user_id, self.links.max_links + 1
        nearest = await self.longterm.search(tenant, user, vector, limit)
        sharing = await self.longterm.find_by_keys(tenant, user, entity_keys(memory), limit)
        related = related_ids(memory, [(h.memory, h.score) for h in nearest], sharing, self.links)
        return linked(memory, related, self.links)

    async def _link_back(self, memory: ConsolidatedMemory) -> None:
        """Links are stored both ways: each memory ``memory`` links to links back to it."""
        others = await self.longterm.get_many(memory.tenant_id, memory.user_id, memory.links)
        changed = [
            after
            for other in others
            if (after := linked(other, [memory.memory_id], self.links)) is not other
        ]
        if changed:
            await self.longterm.rewrite(changed)

    async def _mark_done(self, job: Job) -> None:
        await self.state.mark_trigger_done(job.tenant_id, job.user_id, job.trigger_id)


def start(services: Services) -> None:
    settings, topics = services.settings, services.topics
    c = settings.consolidation
    worker = ConsolidationWorker(
        state=services.state,
        longterm=services.longterm,
        consolidator=services.role_consolidator(),
        encoder=services.encoder,
        metrics=services.metrics,
        max_turns=c.max_turns,
        max_concurrency=c.max_concurrency,
        min_interval_s=c.min_interval_s,
        locks=services.locks,
        links=link_params(c),
        strength=strength_params(settings.maintenance),
    )
    stage = services.stage(NAME, topics.triggers)

    async def run(job: Job) -> ConsolidatedMemory | None:
        return await stage.retry(partial(worker.run_job, job))

    async def drain(queue: list[Job]) -> list[tuple[Job, ConsolidatedMemory | Exception | None]]:
        """One user's jobs, one at a time in log order; a poisoned one does not stop the rest."""
        done: list[tuple[Job, ConsolidatedMemory | Exception | None]] = []
        for job in queue:
            try:
                done.append((job, await run(job)))
            except Exception as exc:
                done.append((job, exc))
        return done

    async def handle(batch: list[Received[RecurrenceTrigger]]) -> int:
        by_id = {item.value.trigger_id: item for item in batch}
        queues = user_queues([item.value for item in batch])
        handled = 0
        for done in await asyncio.gather(*(drain(queue) for queue in queues)):
            for job, result in done:
                if isinstance(result, Exception):
                    await stage.poison(result, by_id[job.trigger_id])
                    continue
                handled += 1
                if result is not None:
                    await topics.consolidated.send(
                        key=user_key(job.tenant_id, job.user_id).encode(),
                        value=result.model_dump_json().encode(),
                    )
        return handled

    stage.batched(
        services.app,
        RecurrenceTrigger,
        handle,
        agent="memstream.consolidate",
        batch_size=c.batch_size,
        within_s=c.batch_within_s,
    )


STAGE = StageSpec("consolidate", start, series=(StageSeries(NAME, batched=True),))
