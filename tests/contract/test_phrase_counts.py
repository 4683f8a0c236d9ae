"""The user's heard set on real Valkey (the bot's sentences the user heard, which make the
bot's canned lines count for nothing): no wall-clock TTL, so a replay of the same events,
however much later, decides the same; a forget removes it.

It replaced the tenant-wide phrase counts (issue 14): those were shared across partitions,
so a decision reading them depended on processing order (memory/memorize.py says why)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import numpy as np

from memstream.schemas import StoredTurn
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.redis_state import RedisState, user_tag
from memstream.stores.short_term import UserRead, UserUpdate


async def test_the_heard_set_never_expires_and_a_forget_removes_it(
    redis_server: EmbeddedRedis,
) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}"
    state = RedisState.from_url(redis_server.url, prefix=prefix, ttl_days=7.0)
    turn = StoredTurn(
        event_id="e1",
        session_id="s1",
        role="assistant",
        text="Your parcel is on its way.",
        ts=datetime(2024, 5, 1, tzinfo=UTC),
    )
    vector = np.ones(4, dtype=np.float32) / 2
    try:
        await state.apply("acme", "u1", UserUpdate("e1", turn, vector, heard=["p1", "p2"]))
        own = f"{prefix}:{user_tag('acme', 'u1')}:heard"
        assert await state.redis.ttl(own) == -1  # exists, no expiry
        [snap] = await state.load_users([UserRead("acme", "u1", ["e2"], ["p1", "p3"])])
        assert snap.heard == {"p1"}
        assert not await state.redis.exists(f"{prefix}:phr:acme")  # no tenant-wide counts
        assert await state.delete_user("acme", "u1") >= 1
        assert not await state.redis.exists(own)  # a forget still removes it
    finally:
        await state.close()
