"""The consolidation worker: recurrence triggers -> one structured memory per key in Qdrant.

Triggers arrive in batches; duplicates of a key inside a batch fold into one job; each job
loads the key's turns from Redis and its current memory from the long-term store, asks the
consolidator (LLM or extractive), merges, and upserts under the deterministic id
uuid5(tenant:user:key) — consolidating a topic again updates its memory, never adds one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import faust

from memory.consolidation import merge_memory
from memory.ranking import memory_text
from memstream.metrics import Metrics
from schemas import ConsolidatedMemory, RecurrenceTrigger
from stores.encoder import OnnxEncoder
from stores.llm import Consolidator
from stores.longterm import LongTermStore, memory_point_id
from stores.redis_state import RedisState
from streams.app import Topics
from streams.handling import DeadLetters, with_retries

STAGE = "consolidate"


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


def initial_strength(score: float, importance: float) -> float:
    """Strength starts from the trigger's score, weighted up for important memories."""
    return round(max(score, 0.1) * (0.5 + importance), 4)


@dataclass
class ConsolidationWorker:
    state: RedisState
    longterm: LongTermStore
    consolidator: Consolidator
    encoder: OnnxEncoder
    metrics: Metrics
    max_turns: int
    max_concurrency: int

    def __post_init__(self) -> None:
        self._limit = asyncio.Semaphore(self.max_concurrency)

    async def run_job(self, job: Job) -> ConsolidatedMemory | None:
        """The memory written for this job, or None when there was nothing new to do."""
        done = [
            await self.state.trigger_done(job.tenant_id, job.user_id, t) for t in job.trigger_ids
        ]
        if all(done):
            self.metrics.consolidations.labels("skipped").inc()
            return None
        turns = [t.turn for t in await self.state.turns(job.tenant_id, job.user_id, job.turn_ids)]
        turns = sorted(turns, key=lambda t: t.ts)[-self.max_turns :]
        memory_id = memory_point_id(job.tenant_id, job.user_id, job.key)
        existing = await self.longterm.get(job.tenant_id, job.user_id, memory_id)
        if not turns:  # every turn expired or was forgotten: nothing to consolidate
            await self._mark_done(job)
            self.metrics.consolidations.labels("skipped").inc()
            return None
        now = datetime.now(UTC)
        async with self._limit:
            started = time.perf_counter()
            try:
                content = await self.consolidator.consolidate(job.key, turns, existing, now)
            except Exception:
                self.metrics.llm_calls.labels(self.consolidator.name, "error").inc()
                raise
            self.metrics.llm_calls.labels(self.consolidator.name, "ok").inc()
            self.metrics.stage_latency.labels("llm").observe(time.perf_counter() - started)
        memory = merge_memory(
            existing,
            content,
            memory_id=memory_id,
            tenant_id=job.tenant_id,
            user_id=job.user_id,
            key=job.key,
            source_event_ids=[t.event_id for t in turns],
            strength=initial_strength(job.score, job.importance),
            now=now,
        )
        if existing is not None and memory == existing:
            await self._mark_done(job)
            self.metrics.consolidations.labels("unchanged").inc()
            return None
        vector = (await asyncio.to_thread(self.encoder.encode, [memory_text(memory)]))[0]
        await self.longterm.upsert([(memory, vector)])
        await self._mark_done(job)
        self.metrics.consolidations.labels("updated" if existing else "created").inc()
        return memory

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
    dead_letters = DeadLetters(topics.dlq, metrics, stage=STAGE, source=topics.triggers)

    @app.agent(topics.triggers, name="memstream.consolidate")
    async def consolidate(stream: faust.StreamT[bytes]) -> None:
        async for batch in stream.take_events(batch_size, within=within_s):
            started = time.perf_counter()
            triggers: list[RecurrenceTrigger] = []
            raw_by_id: dict[str, tuple[bytes | None, bytes]] = {}
            for message in batch:
                trigger = await dead_letters.decode(RecurrenceTrigger, message.key, message.value)
                if trigger is None:
                    continue
                triggers.append(trigger)
                raw_by_id[trigger.trigger_id] = (message.key, message.value)
            jobs = fold_triggers(triggers)
            results = await asyncio.gather(
                *(with_retries(lambda j=job: worker.run_job(j), stage=STAGE) for job in jobs),
                return_exceptions=True,
            )
            for job, result in zip(jobs, results, strict=True):
                if isinstance(result, BaseException):
                    for trigger_id in job.trigger_ids:
                        key, value = raw_by_id[trigger_id]
                        await dead_letters.poison(result, key, value)
                    continue
                metrics.events.labels(STAGE, "ok").inc(len(job.trigger_ids))
                if result is not None:
                    await topics.consolidated.send(
                        key=f"{job.tenant_id}:{job.user_id}".encode(),
                        value=result.model_dump_json().encode(),
                    )
            metrics.batch_size.labels(STAGE).observe(len(batch))
            metrics.stage_latency.labels(STAGE).observe(time.perf_counter() - started)
