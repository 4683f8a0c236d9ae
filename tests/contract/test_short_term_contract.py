"""The ``ShortTermState`` contract, run on the in-process fake and on ``RedisState`` over the
session's real Valkey: every test taking ``make_state`` runs once on each, so the fake that
the processor and RPC unit tests use cannot drift from Redis unnoticed."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memstream.memory.clustering import ClusterParams, ClusterState, MemoryIn, StepResult, step
from memstream.memory.recurrence import KeyState, TurnSignal
from memstream.schemas import StoredTurn
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import (
    ShortTermState,
    UserRead,
    UserUpdate,
    UserWrite,
    snapshot_after,
)
from tests.fakes import FakeShortTermState

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
    assert not await state.memorized(TENANT, USER, "e1")
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
    assert await state.memorized(TENANT, USER, "e1")
    assert not await state.memorized(TENANT, USER, "e2")
    assert not await state.memorized("globex", USER, "e1")
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
    assert await state.users() == [(TENANT, USER)]
    assert await state.timeline_ids(TENANT, USER) == ["e1"]
    # Isolation: the other user, and the same user id of another tenant, see nothing.
    assert await state.turns(TENANT, OTHER, ["e1"]) == []
    assert await state.turns("globex", USER, ["e1"]) == []
    assert not (await state.load_user("globex", USER, "e1")).already_processed


async def test_memorized_many_answers_each_event_as_memorized_does(make_state: MakeState) -> None:
    state = make_state()
    assert await state.memorized_many([]) == []
    await state.apply(TENANT, USER, update(turn("e1", timedelta(0))))
    await state.apply(TENANT, OTHER, update(turn("e3", timedelta(minutes=1))))
    asked = [
        (TENANT, USER, "e1"),
        (TENANT, USER, "e2"),
        (TENANT, OTHER, "e3"),
        (TENANT, OTHER, "e1"),  # another user's event id
        ("globex", USER, "e1"),  # the same user id of another tenant
        (TENANT, USER, "e1"),  # asked twice: answered twice
    ]
    expected = [await state.memorized(*a) for a in asked]
    assert expected == [True, False, True, False, False, True]
    assert await state.memorized_many(asked) == expected
    await state.delete_user(TENANT, USER)  # forgetting removes the marks
    assert await state.memorized_many(asked[:1]) == [False]


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


async def test_newest_events_are_each_users_clock_in_the_order_asked(
    make_state: MakeState,
) -> None:
    state = make_state()
    await state.apply(TENANT, USER, update(turn("e1", timedelta(minutes=5))))
    await state.apply(TENANT, USER, update(turn("e0", timedelta(0))))  # older, arrived later
    await state.apply(TENANT, OTHER, update(turn("x1", timedelta(hours=1))))
    asked = [(TENANT, OTHER), ("globex", USER), (TENANT, USER), (TENANT, "nobody")]
    assert await state.newest_events(asked) == [
        (T0 + timedelta(hours=1)).timestamp(),
        None,  # the same user id of another tenant has no clock
        (T0 + timedelta(minutes=5)).timestamp(),
        None,
    ]
    assert await state.newest_events([]) == []


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
    # Gone from the hot tier, still readable until the archive worker releases it.
    assert await state.leaving([(TENANT, USER)]) == [["old"]]
    assert [t.turn.event_id for t in await state.turns(TENANT, USER, ["old"])] == ["old"]
    # A late turn already older than the cutoff is counted but never hot.
    await state.apply(TENANT, USER, update(turn("late", timedelta(minutes=5))))
    assert await state.timeline_ids(TENANT, USER) == ["pin", "mid", "new"]
    assert await state.leaving([(TENANT, USER)]) == [["late", "old"]]
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
    assert await state.leaving([(TENANT, USER)]) == [["b", "c"]]
    assert await state.turns_written(TENANT, USER) == 5


async def test_a_turn_that_left_the_hot_tier_stays_readable_until_released(
    make_state: MakeState,
) -> None:
    """No moment in which a turn is in neither tier: an evicted turn's hash stays (``turns``
    reads it; a split's ``member_vectors`` does not, so clustering never depends on how far
    the archive worker has got) until ``release_archived``, which drops only listed turns."""
    state = make_state(max_turns=2)
    for i, event_id in enumerate("abcd"):
        await state.apply(TENANT, USER, update(turn(event_id, timedelta(minutes=i)), i))
    assert await state.leaving([(TENANT, USER), (TENANT, OTHER)]) == [["a", "b"], []]
    assert [t.turn.event_id for t in await state.turns(TENANT, USER, list("abcd"))] == list("abcd")
    assert sorted(await state.member_vectors(TENANT, USER, list("abcd"))) == ["c", "d"]

    assert await state.release_archived(TENANT, USER, ["a", "c", "zz"]) == 1  # c is hot
    assert await state.leaving([(TENANT, USER)]) == [["b"]]
    assert [t.turn.event_id for t in await state.turns(TENANT, USER, list("abcd"))] == list("bcd")
    # A redelivered event puts its turn back on the timeline: released, its hash stays.
    await state.apply(TENANT, USER, update(turn("b", timedelta(minutes=9)), 1))
    assert await state.release_archived(TENANT, USER, ["b"]) == 1
    assert await state.leaving([(TENANT, USER)]) == [["c"]]
    assert "b" in await state.timeline_ids(TENANT, USER)
    assert [t.turn.event_id for t in await state.turns(TENANT, USER, ["b"])] == ["b"]


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


async def test_delete_user_drops_every_marker_and_turn_of_the_user_only(
    make_state: MakeState,
) -> None:
    """Hot and evicted turns, seen/etrig/trig/remind markers: none survives a forget, and a
    user whose id differs only by a ':' keeps all of theirs. (That no key is left at all is
    tests/integration/test_redis_forget.py's, which may scan.)"""
    state = make_state(max_turns=2)
    users = ("eu", "eu:bob")
    for user in users:
        for n in range(4):  # two leave the hot tier
            t = turn(f"e{n}", timedelta(minutes=n), pinned=n == 1)
            await state.apply(TENANT, user, update(t, n, triggers={f"t{n}": b"x"}))
        await state.mark_trigger_done(TENANT, user, "t0")
        assert await state.claim_reminder(TENANT, user, "r1", 60)
    assert await state.delete_user(TENANT, "eu") > 0
    assert await state.users() == [(TENANT, "eu:bob")]

    ids = [f"e{n}" for n in range(4)]
    gone, kept = await state.load_users([UserRead(TENANT, u, ids) for u in users])
    assert (gone.processed, kept.processed) == (frozenset(), frozenset(ids))
    assert (await state.timeline_ids(TENANT, "eu"), await state.turns(TENANT, "eu", ids)) == (
        [],
        [],
    )
    assert await state.leaving([(TENANT, "eu"), (TENANT, "eu:bob")]) == [[], ["e0", "e2"]]
    assert len(await state.turns(TENANT, "eu:bob", ids)) == 4  # two hot, two leaving
    assert not await state.trigger_done(TENANT, "eu", "t0")
    assert await state.trigger_done(TENANT, "eu:bob", "t0")
    assert await state.open_event_triggers(TENANT, "eu", "e1") == []
    assert await state.open_event_triggers(TENANT, "eu:bob", "e1") == [b"x"]
    assert await state.claim_reminder(TENANT, "eu", "r1", 60)
    assert not await state.claim_reminder(TENANT, "eu:bob", "r1", 60)


async def test_the_heard_set_is_the_users_own_and_read_for_the_phrases_asked(
    make_state: MakeState,
) -> None:
    state = make_state()
    await state.apply(TENANT, USER, update(turn("e1", timedelta(0)), heard=["p1", "p2"]))
    await state.apply(TENANT, USER, update(turn("e2", timedelta(minutes=1)), heard=["p2", "p3"]))
    [mine, other, elsewhere] = await state.load_users(
        [
            UserRead(TENANT, USER, ["e2", "e3"], ["p1", "p3", "p4"]),
            UserRead(TENANT, OTHER, ["e1"], ["p1"]),
            UserRead("globex", USER, [], ["p1"]),
        ]
    )
    assert (mine.processed, mine.heard) == (frozenset({"e2"}), frozenset({"p1", "p3"}))
    assert mine.already_processed
    assert (other.processed, other.heard) == (frozenset(), frozenset())
    assert not other.already_processed
    assert elsewhere.heard == frozenset()
    assert await state.delete_user(TENANT, USER) > 0
    [gone] = await state.load_users([UserRead(TENANT, USER, ["e1"], ["p1"])])
    assert (gone.processed, gone.heard) == (frozenset(), frozenset())


async def test_an_updates_triggers_are_kept_with_the_event(make_state: MakeState) -> None:
    state = make_state()
    triggers = {"t2": b"two", "t1": b"one"}
    await state.apply(TENANT, USER, update(turn("e1", timedelta(0)), triggers=triggers))
    assert await state.open_event_triggers(TENANT, USER, "e1") == [b"one", b"two"]
    await state.mark_trigger_done(TENANT, USER, "t2")
    assert await state.open_event_triggers(TENANT, USER, "e1") == [b"one"]


def _history() -> list[tuple[str, UserUpdate]]:
    """Two users' updates touching everything ``apply`` writes: the hot tier's cap and
    event-time expiry (a pinned turn, a late turn), pending adds and removes, keys, heard
    phrases, triggers, and the clustering engine's states as it steps (one update without)."""
    params = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
    out: list[tuple[str, UserUpdate]] = []
    times = [0, 1, 2, 30 * 60, 3, 31 * 60, 32 * 60]  # minutes; the 4th moves the cutoff
    for user in (USER, OTHER):
        state = ClusterState.empty(params)
        for n, minutes in enumerate(times):
            event_id = f"{user}-e{n}"
            t = turn(event_id, timedelta(minutes=minutes), pinned=n == 1)
            k = KeyState(score=float(n), last_ts=float(n), turn_ids=[event_id], sessions=["s1"])
            result = step(state, MemoryIn(f"{user}-e{n}", unit(n % 3), 0.5, ("w",)), n, params)
            state = result.state if n != 2 else state
            out.append(
                (
                    user,
                    update(
                        t,
                        n,
                        pending_add=signal(event_id, t.ts.timestamp()) if n % 2 == 0 else None,
                        pending_remove=[f"{user}-e{n - 2}"] if n >= 4 else [],
                        keys={f"k{n % 3}": k},
                        heard=[f"p{n % 2}"],
                        triggers={f"t{n}": b"x"} if n == 3 else {},
                        clusters=result.state if n != 2 else None,
                        clusters_changed=result.changed,
                        clusters_removed=result.removed,
                    ),
                )
            )
    return out


async def _observed(state: ShortTermState, user: str, n: int) -> dict[str, object]:
    ids = [f"{user}-e{i}" for i in range(n)]
    [snap] = await state.load_users([UserRead(TENANT, user, ids, ["p0", "p1", "p2"])])
    hot = await state.turns(TENANT, user, ids)
    return {
        "timeline": await state.timeline_ids(TENANT, user),
        "turns": [(h.turn, h.vector.tobytes()) for h in hot],
        "written": await state.turns_written(TENANT, user),
        "newest": (await state.newest_events([(TENANT, user)]))[0],
        "pending": [(p.event_id, p.vector.tobytes()) for p in snap.pending],
        "keys": snap.keys,
        "version": snap.cluster_version[1],
        "members": [(c.cluster_id, c.member_ids) for c in snap.clusters.clusters]
        if snap.clusters
        else None,
        "listed": [(c.cluster_id, c.member_ids) for c in await state.clusters(TENANT, user)],
        "processed": snap.processed,
        "heard": snap.heard,
        "open": [await state.open_event_triggers(TENANT, user, i) for i in ids],
        "users": await state.users(),
    }


async def test_apply_users_equals_applying_each_update_in_order(make_state: MakeState) -> None:
    history = _history()
    one_by_one, batched = (
        make_state(ttl_days=0.02, max_turns=4),
        make_state(ttl_days=0.02, max_turns=4),
    )
    for user, u in history:  # handing back the version read, as memorize does
        read = (await one_by_one.load_user(TENANT, user, "-")).cluster_version
        await one_by_one.apply(TENANT, user, replace(u, cluster_version=read))
    # In two batches: the second starts from what the first wrote (and its cluster version).
    for part in (history[:3] + history[7:9], history[3:7] + history[9:]):
        versions = {
            user: (await batched.load_user(TENANT, user, "-")).cluster_version
            for user in (USER, OTHER)
        }
        writes = []
        for user in (USER, OTHER):
            mine = [u for who, u in part if who == user]
            # Each update hands back the version the chain would have read before it.
            chained: list[UserUpdate] = []
            generation, version = versions[user]
            for u in mine:
                chained.append(replace(u, cluster_version=(generation, version)))
                version += int(u.clusters is not None)
            writes.append(UserWrite(TENANT, user, chained))
        await batched.apply_users(writes)
    for user in (USER, OTHER):
        assert await _observed(batched, user, 7) == await _observed(one_by_one, user, 7)
    assert await batched.timeline_ids(TENANT, USER) != [f"{USER}-e{i}" for i in range(7)]


async def test_apply_users_takes_each_user_once(make_state: MakeState) -> None:
    state = make_state()
    twice = [UserWrite(TENANT, USER, [update(turn(f"e{i}", timedelta(minutes=i)))]) for i in (1, 2)]
    with pytest.raises(ValueError, match="more than one"):
        await state.apply_users(twice)
    await state.apply_users([])  # nothing to write
    assert await state.turns_written(TENANT, USER) == 0


async def test_snapshot_after_is_what_a_load_reads_after_the_update(
    make_state: MakeState,
) -> None:
    state = make_state()
    history = [u for user, u in _history() if user == USER]
    read = UserRead(TENANT, USER, [u.event_id for u in history], ["p0", "p1"])
    [snap] = await state.load_users([read])
    for u in history:
        u = replace(u, cluster_version=snap.cluster_version)
        chained = snapshot_after(snap, u)
        await state.apply(TENANT, USER, u)
        [snap] = await state.load_users([read])
        assert chained.processed == snap.processed
        assert [(p.event_id, p.vector.tobytes()) for p in chained.pending] == [
            (p.event_id, p.vector.tobytes()) for p in snap.pending
        ]
        assert chained.keys == snap.keys
        assert chained.cluster_version[1] == snap.cluster_version[1]
        assert chained.heard == snap.heard
        assert chained.forgotten_at == snap.forgotten_at
        chained_members = (
            [c.member_ids for c in chained.clusters.clusters] if chained.clusters else None
        )
        assert chained_members == (
            [c.member_ids for c in snap.clusters.clusters] if snap.clusters else None
        )


async def test_apply_users_evicts_like_one_by_one_over_random_histories(
    make_state: MakeState,
) -> None:
    """The hot tier chained in process equals Redis's own, one update at a time: caps,
    event-time expiry, pinned turns, late turns and turns applied again, in random batches."""
    rng = random.Random(14)
    for _ in range(4):
        one_by_one, batched = (make_state(ttl_days=0.01, max_turns=5) for _ in range(2))
        history: list[tuple[str, UserUpdate]] = []
        clock = {USER: 0.0, OTHER: 0.0}
        for n in range(40):
            user = rng.choice((USER, OTHER))
            clock[user] += rng.choice((1.0, 2.0, 9.0))  # minutes; 14.4 min is the TTL
            late = rng.random() < 0.15
            minutes = clock[user] - (rng.uniform(5, 20) if late else 0.0)
            again = rng.random() < 0.1 and history
            if again:
                user, u = rng.choice(history)  # an event applied again (its mark expired)
            else:
                pinned = rng.random() < 0.15
                u = update(turn(f"{user}-{n}", timedelta(minutes=minutes), pinned=pinned), n)
            history.append((user, u))
        for user, u in history:
            await one_by_one.apply(TENANT, user, u)
        at = 0
        while at < len(history):
            size = rng.randint(1, 9)
            part = history[at : at + size]
            at += size
            await batched.apply_users(
                [
                    UserWrite(TENANT, user, [u for who, u in part if who == user])
                    for user in (USER, OTHER)
                ]
            )
        for user in (USER, OTHER):
            ids = [u.event_id for who, u in history if who == user]
            for state in (one_by_one, batched):
                assert await state.timeline_ids(TENANT, user) == await one_by_one.timeline_ids(
                    TENANT, user
                )
            got = [(t.turn, t.vector.tobytes()) for t in await batched.turns(TENANT, user, ids)]
            want = [(t.turn, t.vector.tobytes()) for t in await one_by_one.turns(TENANT, user, ids)]
            assert got == want
            assert await batched.turns_written(TENANT, user) == await one_by_one.turns_written(
                TENANT, user
            )
            assert await batched.leaving([(TENANT, user)]) == await one_by_one.leaving(
                [(TENANT, user)]
            )
            assert await batched.newest_events([(TENANT, user)]) == (
                await one_by_one.newest_events([(TENANT, user)])
            )
