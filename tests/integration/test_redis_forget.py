"""Forgetting in Redis (``RedisState``): ``delete_user`` finds every key of the user without
scanning the keyspace (the fixed names, the timeline's turns, the marker indexes), touches
no other user, and the forget tombstone expires after ``forgotten_ttl_days``.

Real Valkey only: the fake models no keys, TTLs or commands. The tests may SCAN to look for
residue; the product may not.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from memstream.schemas import StoredTurn
from memstream.stores import redis_state
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.redis_state import DAY_S, RedisState, user_tag
from memstream.stores.short_term import UserUpdate, UserWrite

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"

MakeState = Callable[..., RedisState]


@pytest.fixture
async def make_state(redis_server: EmbeddedRedis) -> AsyncIterator[MakeState]:
    made: list[RedisState] = []

    def make(**options: Any) -> RedisState:
        options.setdefault("prefix", f"f{uuid.uuid4().hex[:8]}")
        state = RedisState.from_url(redis_server.url, **options)
        made.append(state)
        return state

    yield make
    for state in made:
        await state.close()


def _update(event_id: str, minutes: int, **fields: Any) -> UserUpdate:
    turn = StoredTurn(
        event_id=event_id,
        session_id="s1",
        role="user",
        text=f"turn {event_id}",
        ts=T0 + timedelta(minutes=minutes),
        speaker="Ann",
        pinned=fields.pop("pinned", False),
    )
    vector = np.ones(8, dtype=np.float32) / np.sqrt(8)
    return UserUpdate(event_id=event_id, turn=turn, vector=vector, **fields)


async def _populate(state: RedisState, user: str) -> None:
    """Hot turns (one pinned), evicted turns (leaving: no archive worker runs here), pending,
    keys, heard, and every marker kind."""
    updates = [
        _update(f"{user}-e{n}", n, pinned=n == 1, heard=[f"p{n}"], triggers={f"t{n}": b"x"})
        for n in range(5)
    ]  # max_turns=2: three leave the hot tier
    await state.apply_users([UserWrite(TENANT, user, updates[:3])])
    await state.apply_users([UserWrite(TENANT, user, updates[3:])])
    await state.remember_event_triggers(TENANT, user, f"{user}-old", {"t9": b"y"})
    await state.mark_trigger_done(TENANT, user, "t1")
    assert await state.claim_reminder(TENANT, user, "r1", 3600)
    assert await state.claim_reminder(TENANT, user, "r2", 60 * DAY_S)  # past processed_ttl
    assert await state.claim_reminder(TENANT, user, "r3", 60)
    await state.release_reminder(TENANT, user, "r3")


async def _keys(state: RedisState) -> dict[bytes, tuple[bytes, int]]:
    """Every key of the state's prefix (a SCAN: the test's, not the product's), each with
    its type and whether it has a TTL."""
    found = {}
    async for key in state.redis.scan_iter(match=f"{state.prefix}:*", count=1000):
        kind = await state.redis.type(key)
        kind = kind.encode() if isinstance(kind, str) else kind
        found[bytes(key)] = (kind, int(await state.redis.ttl(key) > 0))
    return found


def _under(keys: dict[bytes, tuple[bytes, int]], state: RedisState, user: str) -> set[bytes]:
    tag = f"{state.prefix}:{user_tag(TENANT, user)}:".encode()
    return {k for k in keys if k.startswith(tag)}


@pytest.mark.parametrize(("forgotten", "kept"), [("eu", "eu:bob"), ("eu:bob", "eu")])
async def test_delete_user_leaves_no_key_of_the_user_and_touches_no_other(
    make_state: MakeState, forgotten: str, kept: str
) -> None:
    state = make_state(max_turns=2)
    for user in (forgotten, kept, "eu%3Abob"):
        await _populate(state, user)
    before = await _keys(state)
    mine = _under(before, state, forgotten)
    kinds = {k.split(b"}:", 1)[1].split(b":", 1)[0] for k in mine}
    assert {b"turn", b"seen", b"etrig", b"trig", b"remind", b"markers", b"reminders"} <= kinds
    assert b"leaving" in kinds  # evicted, not archived yet: their turns are still there
    assert any(b":turn:" + f"{forgotten}-e0".encode() in k for k in mine)

    deleted = await state.delete_user(TENANT, forgotten)

    after = await _keys(state)
    assert _under(after, state, forgotten) == set()
    assert deleted == len(mine)
    assert {k: v for k, v in before.items() if k not in mine} == after  # others untouched
    assert (TENANT, forgotten) not in await state.users()
    assert (TENANT, kept) in await state.users()
    assert await state.delete_user(TENANT, forgotten) == 0


async def test_delete_user_sends_no_scan(
    make_state: MakeState, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = make_state(max_turns=2)
    await _populate(state, "u1")
    stats = await state.redis.info("commandstats")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("delete_user scanned the keyspace")

    for verb in ("scan", "scan_iter", "keys"):
        monkeypatch.setattr(state.redis, verb, refuse)
    assert await state.delete_user(TENANT, "u1") > 0
    monkeypatch.undo()
    after = await state.redis.info("commandstats")
    for command in ("cmdstat_scan", "cmdstat_keys"):  # none sent by any path, either
        assert after.get(command) == stats.get(command), command
    assert _under(await _keys(state), state, "u1") == set()


async def test_marker_index_is_one_write_per_transaction_pruned_and_expiring(
    make_state: MakeState, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = make_state(processed_ttl_days=1.0)
    index = state._key(TENANT, "u1", "markers")
    updates = [_update(f"e{n}", n, triggers={"t": b"x"} if n == 0 else {}) for n in range(3)]
    await state.apply_users([UserWrite(TENANT, "u1", updates)])
    raw = await state.redis.zrange(index, 0, -1, withscores=True)
    members = cast(list[tuple[bytes, float]], raw)  # (member, score) pairs
    assert sorted(m for m, _ in members) == [b"etrig:e0", b"seen:e0", b"seen:e1", b"seen:e2"]
    assert len({s for _, s in members}) == 1  # one ZADD for the transaction
    assert DAY_S - 5 <= await state.redis.ttl(index) <= DAY_S

    # A day and the clock slack later, the next write prunes the expired entries.
    later = members[0][1] + redis_state.CLOCK_SLACK_S + 1
    monkeypatch.setattr(redis_state, "time", SimpleNamespace(time=lambda: later))
    await state.apply_users([UserWrite(TENANT, "u1", [_update("e3", 3)])])
    assert await state.redis.zrange(index, 0, -1) == [b"seen:e3"]


async def test_a_reminder_index_only_moves_its_expiry_forward(make_state: MakeState) -> None:
    state = make_state()
    index = state._key(TENANT, "u1", "reminders")
    assert await state.claim_reminder(TENANT, "u1", "long", 10 * DAY_S)
    assert await state.claim_reminder(TENANT, "u1", "short", 60)
    assert await state.redis.ttl(index) > 9 * DAY_S
    assert not await state.claim_reminder(TENANT, "u1", "long", 60)  # claimed: score kept
    assert (await state.redis.zscore(index, "remind:long") or 0) > T0.timestamp() + 9 * DAY_S


async def test_the_tombstone_expires_after_forgotten_ttl_days(make_state: MakeState) -> None:
    state = make_state(forgotten_ttl_days=2.0)
    key = state._forgotten_key(TENANT, "never-existed")
    await state.mark_forgotten(TENANT, "never-existed", 100.0)
    assert await state.forgotten_at(TENANT, "never-existed") == 100.0
    assert 2 * DAY_S - 5 <= await state.redis.ttl(key) <= 2 * DAY_S
    await state.redis.expire(key, 60)
    await state.mark_forgotten(TENANT, "never-existed", 50.0)  # older: kept, TTL restarted
    assert await state.forgotten_at(TENANT, "never-existed") == 100.0
    assert await state.redis.ttl(key) > DAY_S
    await state.mark_forgotten(TENANT, "never-existed", 200.0)
    assert await state.forgotten_at(TENANT, "never-existed") == 200.0
    assert await state.redis.ttl(key) > DAY_S

    forever = make_state(forgotten_ttl_days=0)
    await forever.mark_forgotten(TENANT, "u1", 100.0)
    assert await forever.redis.ttl(forever._forgotten_key(TENANT, "u1")) == -1
