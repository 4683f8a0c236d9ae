"""Strength upkeep in the consolidate role: boosts from ``memstream.feedback``, periodic decay.

The rules (x1.2 per use, x0.99 per interval, floor 0.1, idempotent under redelivery and
repeated runs) are ``memory.strength``'s; this module reads memories, applies them under
the user's lock and rewrites the memories in place (their vectors do not change).

Decay runs on the wall clock's schedule but counts in event time: a user's memories decay
up to that user's newest event, so a replay of an old log stores the strengths the live
stream did, and a user who has said nothing since is not aged by the calendar. A pass
asks the store, user by user, only for the memories a whole interval behind that user's
newest event (`MemoryStore.decay_due`, an indexed read), so a user who said nothing
since the last pass costs one empty read, not a read of every memory they have.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from memstream.memory.strength import StrengthParams, boost_all, decayed
from memstream.metrics import StageSeries
from memstream.schemas import Feedback
from memstream.stores.longterm import MemoryStore
from memstream.stores.short_term import ShortTermState
from memstream.streaming.locks import UserLocks
from memstream.streaming.params import strength_params
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import Outcome, Received, periodic

FEEDBACK_NAME = "feedback"
DECAY_NAME = "decay"
SCAN_PAGE = 256
USERS_PAGE = 512  # users whose clocks the decay pass reads in one round trip


def feedback_id(feedback: Feedback) -> str:
    """The publisher's id, or one derived from the message: a redelivery has the same."""
    if feedback.feedback_id:
        return feedback.feedback_id
    return hashlib.sha256(feedback.model_dump_json().encode()).hexdigest()[:32]


@dataclass
class StrengthWorker:
    longterm: MemoryStore
    state: ShortTermState
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

    async def decay_all(self) -> int:
        """Decay every stored memory up to its user's newest event; how many changed (0 on a
        repeated run). Users without short-term state (none yet, or forgotten) have no
        clock, so their memories wait, as they did when this pass scanned every memory."""
        changed = 0
        users = await self.state.users()
        for start in range(0, len(users), USERS_PAGE):
            page = users[start : start + USERS_PAGE]
            clocks = await self.state.newest_events(page)
            for (tenant, user), newest in zip(page, clocks, strict=True):
                if newest is not None:
                    changed += await self._decay_behind(
                        tenant, user, datetime.fromtimestamp(newest, UTC)
                    )
        return changed

    async def _decay_behind(self, tenant: str, user: str, now: datetime) -> int:
        """Decay the user's memories a whole interval behind ``now``, page by page."""
        changed = 0
        behind = now - timedelta(seconds=self.params.interval_s)
        offset: str | None = None
        while True:
            page, offset = await self.longterm.decay_due(tenant, user, behind, SCAN_PAGE, offset)
            if page:
                ids = [m.memory_id for m in page]
                changed += await self._decay_user(tenant, user, ids, now)
            if offset is None:
                return changed

    async def _decay_user(self, tenant: str, user: str, ids: list[str], now: datetime) -> int:
        """Decay what the index read; how many changed. Every memory read is rewritten, the
        unchanged ones too: a memory stored before `DECAY_FIELD` existed is read until a
        rewrite stores its field (the few within the index's slack are rewritten as they are)."""
        async with self.locks(tenant, user):
            # Re-read under the lock: a boost or a consolidation may have landed since the read.
            fresh = await self.longterm.get_many(tenant, user, ids)
            after = [decayed(memory, now, self.params) for memory in fresh]
            if after:
                await self.longterm.rewrite(after)
        return sum(a is not m for a, m in zip(after, fresh, strict=True))


def start(services: Services) -> None:
    worker = StrengthWorker(
        services.longterm,
        services.state,
        services.locks,
        strength_params(services.settings.maintenance),
    )
    stage = services.stage(FEEDBACK_NAME, services.topics.feedback)

    async def handle(message: Received[Feedback]) -> Outcome:
        await stage.retry(partial(worker.apply_feedback, message.value))
        return "ok"

    stage.per_message(services.app, Feedback, handle, agent="memstream.feedback")

    async def decay() -> int:
        return await worker.decay_all()

    periodic(
        services.app,
        services.metrics,
        decay,
        stage=DECAY_NAME,
        every_s=services.settings.maintenance.decay_every_s,
        name="memstream.decay",
    )


# Strength upkeep writes long-term memories too: the consolidate role's, under its locks.
STAGE = StageSpec(
    "consolidate",
    start,
    series=(
        StageSeries(FEEDBACK_NAME),
        StageSeries(DECAY_NAME, ("ok", "error"), dead_letters=False),
    ),
)
