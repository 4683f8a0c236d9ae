"""Reminders: the open actions of a memory that have fallen due, each with a stable id.

The id is derived from the memory and the action (text and due time), so the worker that
emits reminders can mark each one in Redis and a consumer can dedup on it too. Pure.

`due_times` is what the long-term store indexes so the worker reads only the memories with
something due (every due time, not only the earliest: once the earliest is more than
``max_late`` old, a later action of the same memory must still be found). `due_reminders`
stays the one rule for what is due; the index only narrows the candidates.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from memstream.schemas import ConsolidatedMemory, OpenAction, Reminder


def reminder_id(memory_id: str, action: OpenAction) -> str:
    due = action.due.isoformat() if action.due is not None else ""
    digest = hashlib.sha256("\x1f".join((memory_id, action.text, due)).encode())
    return digest.hexdigest()[:32]


def due_times(memory: ConsolidatedMemory) -> list[float]:
    """The due times (epoch seconds, ascending, distinct) of the memory's open actions.

    An action done is no longer open (the merge moves it to the history), so it drops out
    here the next time the memory is written."""
    return sorted({a.due.timestamp() for a in memory.open_actions if a.due is not None})


def due_reminders(memory: ConsolidatedMemory, now: datetime, max_late: timedelta) -> list[Reminder]:
    """Reminders for the open actions due at or before ``now`` and not more than ``max_late``
    ago: an action that fell due long before anyone looked (a replay of an old log) is
    history, not something to remind a bot of today."""
    return [
        Reminder(
            reminder_id=reminder_id(memory.memory_id, action),
            tenant_id=memory.tenant_id,
            user_id=memory.user_id,
            memory_id=memory.memory_id,
            key=memory.key,
            title=memory.title,
            action=action,
            due=action.due,
            ts=now,
        )
        for action in memory.open_actions
        if action.due is not None and now - max_late <= action.due <= now
    ]
