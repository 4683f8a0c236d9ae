"""The ``ShortTermState`` contract, run on the in-process fake and on ``RedisState`` over the
session's real Valkey: every test taking ``make_state`` runs once on each, so the fake that
the processor and RPC unit tests use cannot drift from Redis unnoticed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory.clustering import ClusterParams, ClusterState, MemoryIn, StepResult, step
from memory.recurrence import KeyState, TurnSignal
from schemas import StoredTurn
from stores.embedded import EmbeddedRedis
from stores.fakes import FakeShortTermState
from stores.redis_state import RedisState, UserUpdate
from stores.short_term import ShortTermState

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
DIM = 8
TENANT, USER, OTHER = "acme", "u1", "u2"

MakeState = Callable[..., ShortTermState]


@pytest.fixture(params=["fake", "redis"])
async def make_state(
    request: pytest.FixtureRequest, redis_server: EmbeddedRedis
) -> AsyncIterator[MakeState]:
    made: list[ShortTermState] = []

    def make(*, ttl_days: float = 7.0, max_turns: int = 2000) -> ShortTermState:
        state: ShortTermState
        if request.param == "fake":
            state = FakeShortTermState(ttl_days=ttl_days, max_turns=max_turns)
        else:
            state = RedisState.from_url(
                redis_server.url,
                prefix=f"c{uuid.uuid4().hex[:8]}",
                ttl_days=ttl_days,
                max_turns=max_turns,
            )
        made.append(state)
        return state

    yield make
    for state in made:
        await state.close()


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.3  # not exactly representable in float16: rounding is visible
    return v / np.linalg.norm(v)


def turn(event_id: str, at: timedelta, *, pinned: bool = False, text: str = "hi") -> StoredTurn:
    return StoredTurn(
        event_id=event_id,
        session_id="s1",
        role="user",
        text=text,
        ts=T0 + at,
        speaker="Ann",
        entities=["order:a-1"],
        pinned=pinned,
    )


def update(t: StoredTurn, i: int = 0, **fields: object) -> UserUpdate:
    return UserUpdate(event_id=t.event_id, turn=t, vector=unit(i), **fields)  # type: ignore[arg-type]


def signal(event_id: str, ts: float) -> TurnSignal:
    return TurnSignal(event_id, "s1", ts, unit(0), ("order:a-1",), "c1", True, False)


async def test_an_unknown_user_has_nothing(make_state: MakeState) -> None:
    state = make_state()
    snap = await state.load_user(TENANT, USER, "e1")
    assert (snap.already_processed, snap.clusters, snap.pending, snap.keys) == (
        False,
        None,
        [],
        {},
    )
    assert snap.cluster_version == ("", 0)
    assert snap.forgotten_at is None
    assert await state.turns_state(TENANT, USER) == (None, 0)
    assert await state.turns_version(TENANT, USER) is None
    assert await state.timeline_ids(TENANT, USER) == []
    assert await state.turns(TENANT, USER, ["e1"]) == []
    assert await state.clusters(TENANT, USER) == []
    assert await state.count_turns(TENANT, USER) == 0
    assert await state.users() == []
    assert await state.ping()


async def test_apply_writes_the_turn_as_stored_and_marks_the_event(make_state: MakeState) -> None:
    state = make_state()
    t = turn("e1", timedelta(0), text="Where is order A-1?")
    await state.apply(TENANT, USER, update(t, 3))

    assert (await state.load_user(TENANT, USER, "e1")).already_processed
    assert not (await state.load_user(TENANT, USER, "e2")).already_processed
    [got] = await state.turns(TENANT, USER, ["e1"])
    assert got.turn == t
    # float16 as stored, read back float32: exactly the rounding, no more.
    expected = unit(3).astype(np.float16).astype(np.float32)
    assert got.vector.dtype == np.float32
    assert np.array_equal(got.vector, expected)
    assert not np.array_equal(got.vector, unit(3))
    vectors = await state.member_vectors(TENANT, USER, ["e1", "missing"])
    assert list(vectors) == ["e1"]
    assert np.array_equal(vectors["e1"], expected)
    assert await state.users() == [f"{TENANT}:{USER}"]
    assert await state.timeline_ids(TENANT, USER) == ["e1"]
    # Isolation: the other user, and the same user id of another tenant, see nothing.
    assert await state.turns(TENANT, OTHER, ["e1"]) == []
    assert await state.turns("globex", USER, ["e1"]) == []
    assert not (await state.load_user("globex", USER, "e1")).already_processed


async def test_turn_version_is_fresh_on_every_write_and_tall_counts_distinct_turns(
    make_state: MakeState,
) -> None:
    state = make_state()
    await state.apply(TENANT, USER, update(turn("e1", timedelta(0))))
    v1, n1 = await state.turns_state(TENANT, USER)
    await state.apply(TENANT, USER, update(turn("e2", timedelta(minutes=1))))
    v2, n2 = await state.turns_state(TENANT, USER)
    await state.apply(TENANT, USER, update(turn("e2", timedelta(minutes=1))))  # applied again
    v3, n3 = await state.turns_state(TENANT, USER)
    assert v1 is not None
    assert v2 is not None
    assert v3 is not None
    assert len({v1, v2, v3}) == 3
    assert (n1, n2, n3) == (1, 2, 2)
    assert await state.turns_version(TENANT, USER) == v3
    assert await state.turns_written(TENANT, USER) == 2
    assert await state.timeline_ids(TENANT, USER) == ["e1", "e2"]


async def test_turns_in_the_order_asked_and_the_timeline_in_time_order(
    make_state: MakeState,
) -> None:
    state = make_state()
    # Written out of time order; equal times order by id, as a Redis zset does.
    for event_id, minutes in (("e3", 2), ("e1", 0), ("e2b", 1), ("e2a", 1)):
        await state.apply(TENANT, USER, update(turn(event_id, timedelta(minutes=minutes))))
    got = await state.turns(TENANT, USER, ["e2a", "nope", "e3", "e1"])
    assert [g.turn.event_id for g in got] == ["e2a", "e3", "e1"]
    assert await state.timeline_ids(TENANT, USER) == ["e1", "e2a", "e2b", "e3"]
    since = (T0 + timedelta(minutes=1)).timestamp()
    assert await state.timeline_since(TENANT, USER, since) == ["e2a", "e2b", "e3"]


async def test_hot_tier_expires_in_event_time_and_keeps_the_count(
    make_state: MakeState,
) -> None:
    state = make_state(ttl_days=1.0)
    await state.apply(TENANT, USER, update(turn("old", timedelta(0))))
    await state.apply(TENANT, USER, update(turn("pin", timedelta(hours=1), pinned=True)))
    await state.apply(TENANT, USER, update(turn("mid", timedelta(hours=2))))
    assert await state.count_hot_turns(TENANT, USER) == 3  # no wall clock: all still hot
    await state.apply(TENANT, USER, update(turn("new", timedelta(days=1, hours=1, minutes=30))))
    # Older than newest - 1 day left; the pinned turn never expires by age.
    assert await state.timeline_ids(TENANT, USER) == ["pin", "mid", "new"]
    assert await state.turns(TENANT, USER, ["old"]) == []
    # A late turn already older than the cutoff is counted but never hot.
    await state.apply(TENANT, USER, update(turn("late", timedelta(minutes=5))))
    assert await state.timeline_ids(TENANT, USER) == ["pin", "mid", "new"]
    assert await state.turns_written(TENANT, USER) == 5
    assert await state.count_turns(TENANT, USER) == 5
    assert await state.count_hot_turns(TENANT, USER) == 3
    assert (await state.load_user(TENANT, USER, "late")).already_processed


async def test_hot_tier_cap_drops_the_oldest_unpinned_first(make_state: MakeState) -> None:
    state = make_state(max_turns=3)
    await state.apply(TENANT, USER, update(turn("a", timedelta(minutes=0), pinned=True)))
    for i, event_id in enumerate(("b", "c", "d", "e"), start=1):
        await state.apply(TENANT, USER, update(turn(event_id, timedelta(minutes=i))))
    assert await state.timeline_ids(TENANT, USER) == ["a", "d", "e"]
    assert [t.turn.event_id for t in await state.turns(TENANT, USER, list("abcde"))] == [
        "a",
        "d",
        "e",
    ]
    assert await state.turns_written(TENANT, USER) == 5


async def test_pending_window_and_recurrence_keys(make_state: MakeState) -> None:
    state = make_state()
    t1, t2 = turn("e1", timedelta(0)), turn("e2", timedelta(minutes=1))
    k1 = KeyState(score=1.0, last_ts=t1.ts.timestamp(), turn_ids=["e1"], sessions=["s1"])
    k2 = KeyState(score=2.0, last_ts=t2.ts.timestamp(), turn_ids=["e1", "e2"], sessions=["s1"])
    # Written newest first: the snapshot still lists pending turns oldest first.
    await state.apply(
        TENANT,
        USER,
        update(t2, pending_add=signal("e2", t2.ts.timestamp()), keys={"entity:a": k1}),
    )
    await state.apply(
        TENANT,
        USER,
        update(t1, pending_add=signal("e1", t1.ts.timestamp()), keys={"entity:b": k2}),
    )
    snap = await state.load_user(TENANT, USER, "e3")
    assert [p.event_id for p in snap.pending] == ["e1", "e2"]
    assert snap.pending[0].entities == ("order:a-1",)
    assert snap.keys == {"entity:a": k1, "entity:b": k2}  # keys merge, never replace
    t3 = turn("e3", timedelta(minutes=2))
    await state.apply(TENANT, USER, update(t3, pending_remove=["e1"], keys={"entity:a": k2}))
    snap = await state.load_user(TENANT, USER, "e4")
    assert [p.event_id for p in snap.pending] == ["e2"]
    assert snap.keys == {"entity:a": k2, "entity:b": k2}


def _steps(n: int) -> StepResult:
    params = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
    state, result = ClusterState.empty(params), None
    for i in range(n):
        result = step(state, MemoryIn(f"e{i}", unit(2 * i), 0.5, ("word",)), float(i), params)
        state = result.state
    assert result is not None
    return result


async def test_clusters_and_their_version(make_state: MakeState) -> None:
    state = make_state()
    first = _steps(1)
    assert first.changed  # the engine opened a cluster
    t = turn("e0", timedelta(0))
    await state.apply(TENANT, USER, update(t, clusters=first.state, clusters_changed=first.changed))
    snap = await state.load_user(TENANT, USER, "e1")
    generation, version = snap.cluster_version
    assert generation
    assert version == 1
    assert snap.clusters is not None
    assert [c.cluster_id for c in snap.clusters.clusters] == [
        c.cluster_id for c in first.state.clusters
    ]
    assert [m.event_id for c in snap.clusters.clusters for m in c.members] == ["e0"]
    listed = await state.clusters(TENANT, USER)
    assert [c.cluster_id for c in listed] == [c.cluster_id for c in first.state.clusters]
    assert np.allclose(listed[0].centroid, first.state.clusters[0].centroid, atol=1e-3)

    # Handed the snapshot's version back: same generation, next version.
    second = _steps(3)
    await state.apply(
        TENANT,
        USER,
        update(
            turn("e1", timedelta(minutes=1)),
            clusters=second.state,
            clusters_changed=tuple(c.cluster_id for c in second.state.clusters),
            cluster_version=snap.cluster_version,
        ),
    )
    again = await state.load_user(TENANT, USER, "e9")
    assert again.cluster_version == (generation, 2)
    assert again.clusters is not None
    assert len(again.clusters.clusters) == len(second.state.clusters)
    # An update without clusters leaves them and their version alone.
    await state.apply(TENANT, USER, update(turn("e2", timedelta(minutes=2))))
    assert (await state.load_user(TENANT, USER, "e9")).cluster_version == (generation, 2)
    # A removed cluster is gone from the listing.
    gone = second.state.clusters[-1].cluster_id
    await state.apply(
        TENANT,
        USER,
        update(
            turn("e3", timedelta(minutes=3)),
            clusters=second.state,
            clusters_removed=(gone,),
            cluster_version=(generation, 2),
        ),
    )
    assert gone not in {c.cluster_id for c in await state.clusters(TENANT, USER)}


async def test_trigger_markers_and_an_events_open_triggers(make_state: MakeState) -> None:
    state = make_state()
    assert not await state.trigger_done(TENANT, USER, "t1")
    await state.remember_event_triggers(TENANT, USER, "e1", {"t2": b"two", "t1": b"one"})
    assert await state.open_event_triggers(TENANT, USER, "e1") == [b"one", b"two"]
    await state.mark_trigger_done(TENANT, USER, "t1")
    assert await state.trigger_done(TENANT, USER, "t1")
    assert not await state.trigger_done(TENANT, OTHER, "t1")
    assert await state.open_event_triggers(TENANT, USER, "e1") == [b"two"]
    assert await state.open_event_triggers(TENANT, USER, "e2") == []


async def test_a_reminder_is_claimed_once_until_released(make_state: MakeState) -> None:
    state = make_state()
    assert await state.claim_reminder(TENANT, USER, "r1", 60)
    assert not await state.claim_reminder(TENANT, USER, "r1", 60)
    assert await state.claim_reminder(TENANT, OTHER, "r1", 60)
    await state.release_reminder(TENANT, USER, "r1")
    assert await state.claim_reminder(TENANT, USER, "r1", 60)


async def test_phrases_count_distinct_users_per_tenant(make_state: MakeState) -> None:
    state = make_state()
    await state.record_phrases(TENANT, USER, ["p1", "p2"])
    await state.record_phrases(TENANT, USER, ["p1"])  # the same user again: no count
    await state.record_phrases(TENANT, OTHER, ["p1"])
    await state.record_phrases("globex", OTHER, ["p2"])
    assert await state.phrase_users(TENANT, ["p1", "p2", "p3"]) == [2, 1, 0]
    assert await state.phrase_users("globex", ["p1", "p2"]) == [0, 1]
    assert await state.phrase_users(TENANT, []) == []


async def test_forget_deletes_the_user_and_keeps_a_forward_only_tombstone(
    make_state: MakeState,
) -> None:
    state = make_state()
    first = _steps(1)
    t = turn("e1", timedelta(0))
    for user in (USER, OTHER):
        await state.apply(
            TENANT, user, update(t, clusters=first.state, clusters_changed=first.changed)
        )
    at = T0.timestamp() + 10
    await state.mark_forgotten(TENANT, USER, at)
    await state.mark_forgotten(TENANT, USER, at - 5)  # never moves back
    assert await state.forgotten_at(TENANT, USER) == at
    assert await state.delete_user(TENANT, USER) > 0
    assert await state.delete_user(TENANT, USER) == 0

    snap = await state.load_user(TENANT, USER, "e1")
    assert not snap.already_processed
    assert snap.clusters is None
    assert snap.cluster_version == ("", 0)
    assert snap.forgotten_at == at  # the tombstone outlives the delete
    assert await state.turns_state(TENANT, USER) == (None, 0)
    assert await state.turns(TENANT, USER, ["e1"]) == []
    assert await state.users() == [f"{TENANT}:{OTHER}"]
    # The other user is untouched.
    assert (await state.load_user(TENANT, OTHER, "e1")).already_processed
    assert [x.turn.event_id for x in await state.turns(TENANT, OTHER, ["e1"])] == ["e1"]

    assert await state.clear_forgotten(TENANT, USER)
    assert not await state.clear_forgotten(TENANT, USER)
    assert await state.forgotten_at(TENANT, USER) is None


def test_both_implementations_satisfy_the_protocol() -> None:
    assert isinstance(FakeShortTermState(), ShortTermState)
    assert issubclass(RedisState, ShortTermState)


async def test_newest_event_is_the_users_latest_event_time(make_state: MakeState) -> None:
    state = make_state()
    assert await state.newest_event(TENANT, USER) is None
    await state.apply(TENANT, USER, update(turn("b", timedelta(hours=2))))
    await state.apply(TENANT, USER, update(turn("a", timedelta(hours=1))))  # arrives late
    assert await state.newest_event(TENANT, USER) == (T0 + timedelta(hours=2)).timestamp()
    assert await state.newest_event(TENANT, OTHER) is None
    await state.delete_user(TENANT, USER)
    assert await state.newest_event(TENANT, USER) is None
