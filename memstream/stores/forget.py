"""Forgetting a user: everywhere memstream keeps something of theirs.

Called by the RPC (``DELETE /v1/users/{user}``, ``memstream forget``) and again by the
``control`` processor when the command comes round on ``memstream.control``, so the forget
sticks against what was in flight. Every step is idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.stores.longterm import LongTermStore
from memstream.stores.short_term import ShortTermState


def forgotten(tombstone: float | None, stamped: float, arrived: float | None) -> bool:
    """Whether an event is one its user's forget (at ``tombstone``) dropped: stamped at or
    before it (in flight, or replayed), or posted at or before it whatever its stamp (a
    producer's clock a day ahead must not outlive a forget). Epoch seconds."""
    if tombstone is None:
        return False
    return stamped <= tombstone or (arrived is not None and arrived <= tombstone)


@dataclass(frozen=True)
class Forgotten:
    redis_keys_deleted: int
    memories_deleted: int
    turns_deleted: int = 0  # archived turns


async def forget_user(
    state: ShortTermState, longterm: LongTermStore, tenant_id: str, user_id: str, at: float
) -> Forgotten:
    """Tombstone first (so nothing new is memorized or archived meanwhile), then delete
    everywhere: short-term turns, clusters, recurrence counters and pending triggers in
    Redis, the user's memories and archived turns in the long-term store."""
    await state.mark_forgotten(tenant_id, user_id, at)
    keys = await state.delete_user(tenant_id, user_id)
    memories = await longterm.delete_user(tenant_id, user_id)
    turns = await longterm.delete_turns(tenant_id, user_id)
    return Forgotten(keys, memories, turns)
