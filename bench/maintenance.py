"""Maintenance passes over a big store: reminders and strength decay, each against the
full scan it replaced, in the same process on the same shard.

Part of the resources benchmark, which bulk-loads the store first. Both workers read only
what an index says may need them (open actions due in a window; memories a whole decay
interval behind their user's newest event); the references read and check every memory.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from memstream.memory.reminders import due_reminders
from memstream.memory.strength import StrengthParams, decayed
from memstream.schemas import Reminder, StoredTurn
from memstream.settings import QdrantSettings
from memstream.stores.longterm import LongTermStore
from memstream.stores.short_term import UserUpdate
from memstream.streaming.locks import UserLocks
from memstream.wiring import open_longterm
from memstream.workers.reminders import SCAN_PAGE, ReminderWorker
from memstream.workers.strength import StrengthWorker
from tests.fakes import FakeShortTermState

REMINDER_MAX_LATE = timedelta(days=7)  # maintenance.reminder_max_late_s's default
PASSES = 3  # the median is reported; the first pass pages the shard in


async def time_maintenance(
    data_dir: Path, dim: int, users: Sequence[str], tenant: str
) -> dict[str, Any]:
    """CPU and wall ms of the reminders pass and of a decay pass with nothing to decay
    (every user's newest event is now, the memories were written just before: the
    steady state of an hourly pass between a user's turns), and of their full scans."""
    store = open_longterm(QdrantSettings(), data_dir)
    await store.ensure_collection(dim)
    now = datetime.now(UTC)
    try:
        reminders = ReminderWorker(store, FakeShortTermState(), REMINDER_MAX_LATE)
        sent: list[Reminder] = []

        async def send(reminder: Reminder) -> None:
            sent.append(reminder)

        async def remind() -> int:
            return await reminders.emit_due(now, send)

        async def scan_reminders() -> int:
            return await _scan_pass(store, lambda m: len(due_reminders(m, now, REMINDER_MAX_LATE)))

        state = await _users_at(tenant, users, now, dim)
        params = StrengthParams()
        decay = StrengthWorker(longterm=store, state=state, locks=UserLocks(), params=params)

        async def scan_decay() -> int:
            return await _scan_pass(store, lambda m: int(decayed(m, now, params) is not m))

        return {
            "reminders": {
                "indexed": await _passes(remind),
                "full scan": await _passes(scan_reminders),
            },
            "reminders_sent": len(sent),
            "decay": {
                "indexed": await _passes(decay.decay_all),
                "full scan": await _passes(scan_decay),
            },
            "decay_users": len(users),
        }
    finally:
        await store.close()


async def _users_at(
    tenant: str, users: Sequence[str], now: datetime, dim: int
) -> FakeShortTermState:
    """Short-term state in which each user's newest event is ``now`` (one turn each)."""
    state = FakeShortTermState()
    vector = np.zeros(dim, dtype=np.float32)
    vector[0] = 1.0
    for user in users:
        turn = StoredTurn(event_id=f"{user}-now", session_id="s1", role="user", text="Hi", ts=now)
        await state.apply(
            tenant, user, UserUpdate(event_id=turn.event_id, turn=turn, vector=vector)
        )
    return state


async def _scan_pass(store: LongTermStore, check: Callable[[Any], int]) -> int:
    """The pass an index replaced: every memory read, page by page, and checked (claims
    and rewrites left out: they are the same in both)."""
    found = 0
    offset: str | None = None
    while True:
        page, offset = await store.scan(SCAN_PAGE, offset)
        found += sum(check(m) for m in page)
        if offset is None:
            return found


async def _passes(one_pass: Callable[[], Awaitable[int]]) -> dict[str, Any]:
    """Median CPU and wall ms of a few passes, and what each one found (a reminder is
    claimed by the first pass that sends it: the later ones find none)."""
    cpu, wall, found = [], [], []
    for _ in range(PASSES):
        c, w = time.process_time(), time.perf_counter()
        found.append(await one_pass())
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return {"cpu_ms": float(np.median(cpu)), "wall_ms": float(np.median(wall)), "found": found}


def maintenance_markdown(memories: int, dated: int, due: int, figures: dict[str, Any]) -> str:
    """The section: each pass through its index against its full scan."""
    lines = []
    for name, what in (
        ("reminders", f"{dated} with a dated action, {due} due; through the due-time index"),
        (
            "decay",
            f"{figures['decay_users']} users, nothing a whole day behind their newest event; "
            "through the decay-time index, one read per user",
        ),
    ):
        indexed, scan = figures[name]["indexed"], figures[name]["full scan"]
        lines.append(
            f"| {name} | {what} | {indexed['cpu_ms']:.1f} / {indexed['wall_ms']:.1f} "
            f"| {scan['cpu_ms']:.0f} / {scan['wall_ms']:.0f} |"
        )
    return "\n".join(
        [
            "### Maintenance passes",
            "",
            f"Over the {memories // 1000}k bulk-loaded memories, before the process opens "
            f"them; median of {PASSES} passes. The full scan is the pass each index replaced "
            "(every memory read and checked).",
            "",
            "| pass | what it finds | CPU / wall ms | full scan CPU / wall ms |",
            "| --- | --- | ---: | ---: |",
            *lines,
        ]
    )
