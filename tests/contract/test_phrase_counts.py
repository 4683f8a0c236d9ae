"""Tenant phrase counts on real Valkey: a user's own phrase set has no wall-clock TTL, so a
replay of the same events, however much later, counts nobody twice (issue 14)."""

from __future__ import annotations

import uuid

from stores.embedded import EmbeddedRedis
from stores.redis_state import RedisState, user_tag


async def test_a_users_phrase_set_never_expires_so_a_late_replay_counts_nobody_twice(
    redis_server: EmbeddedRedis,
) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}"
    state = RedisState.from_url(redis_server.url, prefix=prefix, ttl_days=7.0)
    try:
        await state.record_phrases("acme", "u1", ["p1", "p2"])
        own = f"{prefix}:{user_tag('acme', 'u1')}:phr"
        assert await state.redis.ttl(own) == -1  # exists, no expiry
        # What a TTL would have done once it ran out: the set gone, the tenant hash kept.
        # Here it is not gone, so the replayed event adds nothing.
        await state.record_phrases("acme", "u1", ["p1", "p2"])
        assert await state.phrase_users("acme", ["p1", "p2"]) == [1, 1]
        assert await state.delete_user("acme", "u1") >= 1
        assert not await state.redis.exists(own)  # a forget still removes it
    finally:
        await state.close()
