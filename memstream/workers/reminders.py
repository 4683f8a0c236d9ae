"""Reminders in the consolidate role: open actions that fell due, emitted once each.

Periodically the memories with an open action due in the reminder window (``now - max_late``
to ``now``) are read through the store's due-time index (``MemoryStore.due_between``: a
pass touches only those, not every memory); for each open action due now
(``memory.reminders.due_reminders``, the one rule) the worker claims the reminder's marker
in Redis (SET NX), sends it to ``memstream.reminders`` and waits for delivery; a failed
send releases the marker so the next run retries. A claimed reminder is never sent again,
whatever the number of runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from memstream.memory.reminders import due_reminders
from memstream.metrics import StageSeries
from memstream.schemas import Reminder
from memstream.stores.longterm import MemoryStore
from memstream.stores.short_term import ShortTermState
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import periodic

NAME = "reminders"
SCAN_PAGE = 256

Send = Callable[[Reminder], Awaitable[None]]


@dataclass
class ReminderWorker:
    longterm: MemoryStore
    state: ShortTermState
    max_late: timedelta

    async def emit_due(self, now: datetime, send: Send) -> int:
        """Send every reminder due at ``now`` not sent before; how many were sent."""
        # A marker outlives the window in which its action could fall due again.
        ttl_s = 2 * self.max_late.total_seconds() + 86_400
        sent = 0
        offset: str | None = None
        while True:
            page, offset = await self.longterm.due_between(
                now - self.max_late, now, SCAN_PAGE, offset
            )
            for memory in page:
                for reminder in due_reminders(memory, now, self.max_late):
                    tenant, user = reminder.tenant_id, reminder.user_id
                    if not await self.state.claim_reminder(
                        tenant, user, reminder.reminder_id, ttl_s
                    ):
                        continue
                    try:
                        await send(reminder)
                    except BaseException:
                        await self.state.release_reminder(tenant, user, reminder.reminder_id)
                        raise
                    sent += 1
            if offset is None:
                return sent


def start(services: Services) -> None:
    m = services.settings.maintenance
    worker = ReminderWorker(
        services.longterm, services.state, timedelta(seconds=m.reminder_max_late_s)
    )

    async def send(reminder: Reminder) -> None:
        delivery = await services.topics.reminders.send(
            key=reminder.user_key.encode(),
            value=reminder.model_dump_json().encode(),
        )
        await delivery

    async def emit() -> int:
        return await worker.emit_due(datetime.now(UTC), send)

    periodic(
        services.app,
        services.metrics,
        emit,
        stage=NAME,
        every_s=m.reminders_every_s,
        name="memstream.reminders",
    )


# Reminders are the consolidate role's, beside the memories they are due from.
STAGE = StageSpec(
    "consolidate", start, series=(StageSeries(NAME, ("ok", "error"), dead_letters=False),)
)
