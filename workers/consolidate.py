"""The consolidation worker: recurrence triggers -> one structured memory per key in Qdrant.

Triggers arrive in batches; duplicates of a key inside a batch fold into one job; each job
loads the key's turns from Redis and its current memory from the long-term store, asks the
consolidator (LLM or extractive), merges, and upserts under the deterministic id
uuid5(tenant:user:key) — consolidating a topic again updates its memory, never adds one.
Then links: the user's memories that share an entity key or lie close in vector space are
linked both ways (``memory.links``). The read-merge-write runs under the user's lock, which
the strength worker (feedback boosts, decay) shares, so neither overwrites the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import faust
import numpy as np

from memory.consolidation import merge_memory
from memory.links import LinkParams, entity_keys, linked, related_ids
from memory.render import memory_text
from memory.strength import StrengthParams, initial_strength
from memstream.metrics import Metrics
from schemas import ConsolidatedMemory, RecurrenceTrigger, StoredTurn
from stores.broker import Topics
from stores.encoder import OnnxEncoder
from stores.llm import Consolidator, build_messages
from stores.longterm import LongTermStore, memory_point_id
from stores.redis_state import RedisState
from stores.stage import Received, Stage
from workers.locks import UserLocks

STAGE = "consolidate"
# How long a job waits for the archive to hold a trigger's turns that left the hot tier.
ARCHIVE_WAIT_S = 30.0


@dataclass(frozen=True)
class Job:
    """All triggers of one (tenant, user, key) in a batch, folded together."""

    tenant_id: str
    user_id: str
    key: str
    trigger_ids: tuple[str, ...]
    turn_ids: tuple[str, ...]
    score: float
    importance: float


def fold_triggers(triggers: Sequence[RecurrenceTrigger]) -> list[Job]:
    jobs: dict[tuple[str, str, str], Job] = {}
    for t in triggers:
        ident = (t.tenant_id, t.user_id, t.key)
        prior = jobs.get(ident)
        if prior is None:
            jobs[ident] = Job(
                t.tenant_id,
                t.user_id,
                t.key,
                (t.trigger_id,),
                tuple(t.turn_ids),
                t.score,
                t.importance,
            )
        else:
            turn_ids = prior.turn_ids + tuple(i for i in t.turn_ids if i not in prior.turn_ids)
            jobs[ident] = Job(
                *ident,
                (*prior.trigger_ids, t.trigger_id),
                turn_ids,
                max(prior.score, t.score),
                max(prior.importance, t.importance),
            )
    return list(jobs.values())


@dataclass
class ConsolidationWorker:
    state: RedisState
    longterm: LongTermStore
    consolidator: Consolidator
    encoder: OnnxEncoder
    metrics: Metrics
    max_turns: int
    max_concurrency: int
    locks: UserLocks = field(default_factory=UserLocks)
    links: LinkParams = field(default_factory=LinkParams)
    strength: StrengthParams = field(default_factory=StrengthParams)

    def __post_init__(self) -> None:
        self._limit = asyncio.Semaphore(self.max_concurrency)

    async def _archived(self, job: Job, event_ids: list[str]) -> list[StoredTurn]:
        """The turns of ``event_ids`` from the archive, waiting (bounded) for any it has not
        written yet: the archive worker follows ``memstream.encoded`` on its own, and a
        memory must not depend on which of the two got there first."""
        waited, pause = 0.0, 0.05
        while True:
            found = await self.longterm.get_turns(job.tenant_id, job.user_id, event_ids)
            if len(found) >= len(event_ids) or waited >= ARCHIVE_WAIT_S:
                return [a.turn for a in found]
            # A forgotten user's turns are never archived: nothing to wait for.
            if await self.state.forgotten_at(job.tenant_id, job.user_id) is not None:
                return [a.turn for a in found]
            await asyncio.sleep(pause)
            waited += pause
            pause = min(pause * 2, 1.0)

    async def run_job(self, job: Job) -> ConsolidatedMemory | None:
        """The memory written for this job, or None when there was nothing new to do."""
        done = [
            await self.state.trigger_done(job.tenant_id, job.user_id, t) for t in job.trigger_ids
        ]
        if all(done):
            self.metrics.consolidations.labels("skipped").inc()
            return None
        turns = [t.turn for t in await self.state.turns(job.tenant_id, job.user_id, job.turn_ids)]
        # A trigger's older turns may have left the hot tier (event-time TTL, cap): the
        # archive holds every turn, so a recurrence months apart still sees its evidence.
        hot = {t.event_id for t in turns}
        cold = [i for i in job.turn_ids if i not in hot]
        if cold:
            turns += await self._archived(job, cold)
        turns = sorted(turns, key=lambda t: t.ts)[-self.max_turns :]
        memory_id = memory_point_id(job.tenant_id, job.user_id, job.key)
        existing = await self.longterm.get(job.tenant_id, job.user_id, memory_id)
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
                sum(self.encoder.count_tokens(m["content"]) for m in prompt)
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
            vector = (await asyncio.to_thread(self.encoder.encode, [memory_text(memory)]))[0]
            memory = await self._link(memory, vector)
            await self.longterm.upsert([(memory, vector)])
            await self._link_back(memory)
        await self._mark_done(job)
        self.metrics.consolidations.labels("updated" if existing else "created").inc()
        return memory

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
        for trigger_id in job.trigger_ids:
            await self.state.mark_trigger_done(job.tenant_id, job.user_id, trigger_id)


def register_consolidate(
    app: faust.App,
    topics: Topics,
    worker: ConsolidationWorker,
    metrics: Metrics,
    *,
    batch_size: int,
    within_s: float,
) -> None:
    stage = Stage(STAGE, topics.triggers, topics.dlq, metrics)

    async def run(job: Job) -> ConsolidatedMemory | None:
        return await stage.retry(partial(worker.run_job, job))

    async def handle(batch: list[Received[RecurrenceTrigger]]) -> int:
        by_id = {item.value.trigger_id: item for item in batch}
        jobs = fold_triggers([item.value for item in batch])
        results = await asyncio.gather(*(run(job) for job in jobs), return_exceptions=True)
        handled = 0
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, BaseException):
                for trigger_id in job.trigger_ids:
                    await stage.poison(result, by_id[trigger_id])
                continue
            handled += len(job.trigger_ids)
            if result is not None:
                await topics.consolidated.send(
                    key=f"{job.tenant_id}:{job.user_id}".encode(),
                    value=result.model_dump_json().encode(),
                )
        return handled

    stage.batched(
        app,
        RecurrenceTrigger,
        handle,
        agent="memstream.consolidate",
        batch_size=batch_size,
        within_s=within_s,
    )
