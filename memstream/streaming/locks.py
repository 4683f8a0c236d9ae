"""Per-user locks for the long-term writes of one consolidate process.

Consolidation, feedback boosts, decay and links all read a user's memory, change it and
write it back. Triggers and feedback are keyed by user, so one process owns a user's
writes; these locks keep its own concurrent tasks from overwriting each other's change.
Striped (a fixed number of locks, users hashed onto them): bounded memory whatever the
number of users, at the cost of two users now and then sharing a lock.
"""

from __future__ import annotations

import asyncio
import zlib

from memstream.schemas.identity import user_key

STRIPES = 256


class UserLocks:
    def __init__(self, stripes: int = STRIPES) -> None:
        self._locks = [asyncio.Lock() for _ in range(stripes)]

    def __call__(self, tenant_id: str, user_id: str) -> asyncio.Lock:
        index = zlib.crc32(user_key(tenant_id, user_id).encode()) % len(self._locks)
        return self._locks[index]
