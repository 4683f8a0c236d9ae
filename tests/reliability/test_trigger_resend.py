"""What a replayed (duplicate) event re-sends: its triggers not consolidated yet, no others."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.redis_state import RedisState


@pytest.fixture
async def state(redis_server: EmbeddedRedis) -> AsyncIterator[RedisState]:
    opened = RedisState.from_url(redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield opened
    await opened.close()


async def test_open_event_triggers_are_the_unconsolidated_ones(state: RedisState) -> None:
    assert await state.open_event_triggers("t1", "u1", "e1") == []
    await state.remember_event_triggers("t1", "u1", "e1", {"tr-a": b'{"a":1}', "tr-b": b'{"b":2}'})
    assert sorted(await state.open_event_triggers("t1", "u1", "e1")) == [b'{"a":1}', b'{"b":2}']
    await state.mark_trigger_done("t1", "u1", "tr-a")
    assert await state.open_event_triggers("t1", "u1", "e1") == [b'{"b":2}']
    # Scoped to the user: another user's event of the same id has none.
    assert await state.open_event_triggers("t1", "u2", "e1") == []
    key = state._key("t1", "u1", "etrig", "e1")
    assert 0 < await state.redis.ttl(key) <= state.processed_ttl_s
    await state.delete_user("t1", "u1")  # forget leaves nothing to re-send
    assert await state.open_event_triggers("t1", "u1", "e1") == []
