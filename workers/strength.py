"""Strength upkeep in the consolidate role: boosts from ``memstream.feedback``, periodic decay.

The rules (x1.2 per use, x0.99 per interval, floor 0.1, idempotent under redelivery and
repeated runs) are ``memory.strength``'s; this module reads memories, applies them under
the user's lock and rewrites the memories in place (their vectors do not change).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import faust

from memory.strength import StrengthParams, boost_all, decayed
from memstream.metrics import Metrics
from schemas import ConsolidatedMemory, Feedback
from stores.longterm import LongTermStore
from streams.app import Topics
from streams.handling import DeadLetters, with_retries
from workers.locks import UserLocks

FEEDBACK_STAGE = "feedback"
DECAY_STAGE = "decay"
SCAN_PAGE = 256
log = logging.getLogger("memstream.workers")


def feedback_id(feedback: Feedback) -> str:
    """The publisher's id, or one derived from the message: a redelivery has the same."""
    if feedback.feedback_id:
        return feedback.feedback_id
    return hashlib.sha256(feedback.model_dump_json().encode()).hexdigest()[:32]


@dataclass
class StrengthWorker:
    longterm: LongTermStore
    locks: UserLocks
    params: StrengthParams

    async def apply_feedback(self, feedback: Feedback) -> int:
        """Boost every memory the retrieval used, once per feedback id; how many changed."""
        if not feedback.memory_ids:
            return 0
        ident = feedback_id(feedback)
        async with self.locks(feedback.tenant_id, feedback.user_id):
            memories = await self.longterm.get_many(
                feedback.tenant_id, feedback.user_id, feedback.memory_ids
            )
            changed = boost_all(memories, ident, self.params)
            if changed:
                await self.longterm.rewrite(changed)
        return len(changed)

    async def decay_all(self, now: datetime) -> int:
        """Decay every stored memory up to ``now``; how many changed (0 on a repeated run)."""
        changed = 0
        offset: str | None = None
        while True:
            page, offset = await self.longterm.scan(SCAN_PAGE, offset)
            by_user: dict[tuple[str, str], list[str]] = {}
            for memory in page:
                by_user.setdefault((memory.tenant_id, memory.user_id), []).append(memory.memory_id)
            for (tenant, user), ids in by_user.items():
                changed += await self._decay_user(tenant, user, ids, now)
            if offset is None:
                return changed

    async def _decay_user(self, tenant: str, user: str, ids: list[str], now: datetime) -> int:
        async with self.locks(tenant, user):
            # Re-read under the lock: a boost or a consolidation may have landed since the scan.
            fresh = await self.longterm.get_many(tenant, user, ids)
            updated: list[ConsolidatedMemory] = []
            for memory in fresh:
                after = decayed(memory, now, self.params)
                if after is not memory:
                    updated.append(after)
            if updated:
                await self.longterm.rewrite(updated)
        return len(updated)


def register_strength(
    app: faust.App,
    topics: Topics,
    worker: StrengthWorker,
    metrics: Metrics,
    *,
    decay_every_s: float,
) -> None:
    dead_letters = DeadLetters(topics.dlq, metrics, stage=FEEDBACK_STAGE, source=topics.feedback)

    @app.agent(topics.feedback, name="memstream.feedback")
    async def feedback(stream: faust.StreamT[bytes]) -> None:
        async for message in stream.events():
            started = time.perf_counter()
            parsed = await dead_letters.decode(Feedback, message.key, message.value)
            if parsed is None:
                continue
            try:
                await with_retries(
                    partial(worker.apply_feedback, parsed), stage=FEEDBACK_STAGE, metrics=metrics
                )
            except Exception as exc:
                await dead_letters.poison(exc, message.key, message.value)
                continue
            metrics.events.labels(FEEDBACK_STAGE, "ok").inc()
            metrics.stage_latency.labels(FEEDBACK_STAGE).observe(time.perf_counter() - started)

    @app.timer(interval=decay_every_s, name="memstream.decay")
    async def decay() -> None:
        started = time.perf_counter()
        try:
            changed = await worker.decay_all(datetime.now(UTC))
        except Exception:  # a periodic job must outlive a bad run; the next one catches up
            log.exception("decay run failed")
            metrics.events.labels(DECAY_STAGE, "error").inc()
            return
        metrics.events.labels(DECAY_STAGE, "ok").inc(changed)
        metrics.stage_latency.labels(DECAY_STAGE).observe(time.perf_counter() - started)
