"""The strength worker over fakes: feedback boosts once per retrieval, and decay counts in
each user's event time, not the calendar's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memstream.memory.strength import StrengthParams, decayed
from memstream.memory.turns import stored_turn
from memstream.schemas import ConsolidatedMemory, Feedback, InteractionEvent
from memstream.stores.longterm import LongTermStore, memory_point_id
from memstream.streaming.locks import UserLocks
from memstream.workers.strength import SCAN_PAGE, StrengthWorker
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER, put_hot

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
PARAMS = StrengthParams()  # x1.2 per use, x0.99 per whole day, floor 0.1


def memory(tenant: str, user: str, key: str, strength: float = 1.0) -> ConsolidatedMemory:
    return ConsolidatedMemory(
        memory_id=memory_point_id(tenant, user, key),
        tenant_id=tenant,
        user_id=user,
        key=key,
        title=f"About {key}",
        strength=strength,
        created_at=T0,
        updated_at=T0,
    )


async def stored(longterm: LongTermStore, *memories: ConsolidatedMemory) -> None:
    await longterm.upsert([(m, ENCODER.encode([m.title])[0]) for m in memories])


async def said(state: FakeShortTermState, tenant: str, user: str, at: datetime) -> None:
    """A turn of the user's at ``at``: the user's newest event time becomes ``at``."""
    event = InteractionEvent(
        event_id=f"{user}-{at.isoformat()}",
        tenant_id=tenant,
        user_id=user,
        session_id="s1",
        role="user",
        text="Where is my parcel?",
        ts=at,
    )
    await put_hot(state, tenant, user, stored_turn(event))


def worker(longterm: LongTermStore, state: FakeShortTermState) -> StrengthWorker:
    return StrengthWorker(longterm=longterm, state=state, locks=UserLocks(), params=PARAMS)


async def strength_of(longterm: LongTermStore, m: ConsolidatedMemory) -> float:
    (fresh,) = await longterm.get_many(m.tenant_id, m.user_id, [m.memory_id])
    return fresh.strength


async def test_a_feedback_boosts_each_memory_it_names_once_even_when_redelivered(
    longterm: LongTermStore,
) -> None:
    used, unused = memory("acme", "u1", "order:A-1"), memory("acme", "u1", "order:A-2")
    theirs = memory("other", "u1", "order:A-1")
    await stored(longterm, used, unused, theirs)
    strength = worker(longterm, FakeShortTermState())
    feedback = Feedback(
        feedback_id="r1", tenant_id="acme", user_id="u1", memory_ids=[used.memory_id], ts=T0
    )
    assert await strength.apply_feedback(feedback) == 1
    assert await strength.apply_feedback(feedback) == 0  # a redelivery counts for nothing
    assert await strength_of(longterm, used) == pytest.approx(1.2)
    assert await strength_of(longterm, unused) == pytest.approx(1.0)
    assert await strength_of(longterm, theirs) == pytest.approx(1.0)
    # The same ids from another tenant name nothing of acme's.
    spoofed = feedback.model_copy(update={"feedback_id": "r2", "tenant_id": "other"})
    assert await strength.apply_feedback(spoofed) == 0
    assert await strength_of(longterm, used) == pytest.approx(1.2)


async def test_decay_ages_each_user_to_their_newest_event_and_is_idempotent(
    longterm: LongTermStore,
) -> None:
    active, quiet = memory("acme", "u1", "order:A-1"), memory("acme", "u2", "order:A-9")
    await stored(longterm, active, quiet)
    state = FakeShortTermState()
    await said(state, "acme", "u1", T0 + 10 * DAY + timedelta(hours=5))
    strength = worker(longterm, state)
    assert await strength.decay_all() == 1
    assert await strength.decay_all() == 0  # a repeated run finds no whole day left
    # Ten whole days of u1's own time, whatever today's date is.
    assert await strength_of(longterm, active) == pytest.approx(0.99**10, rel=1e-5)
    # u2 has said nothing: the calendar does not age their memories.
    assert await strength_of(longterm, quiet) == pytest.approx(1.0)
    await said(state, "acme", "u1", T0 + 12 * DAY)
    assert await strength.decay_all() == 1
    assert await strength_of(longterm, active) == pytest.approx(0.99**12, rel=1e-5)


async def test_decay_never_takes_a_memory_under_the_floor(longterm: LongTermStore) -> None:
    weak = memory("acme", "u1", "order:A-3", strength=0.105)
    await stored(longterm, weak)
    state = FakeShortTermState()
    await said(state, "acme", "u1", T0 + 400 * DAY)
    assert await worker(longterm, state).decay_all() == 1
    assert await strength_of(longterm, weak) == pytest.approx(PARAMS.floor)


async def test_decay_reaches_users_whose_ids_hold_a_colon(longterm: LongTermStore) -> None:
    theirs = memory("acme", "eu:u:1", "order:A-4")
    await stored(longterm, theirs)
    state = FakeShortTermState()
    await said(state, "acme", "eu:u:1", T0 + 3 * DAY)
    assert await worker(longterm, state).decay_all() == 1
    assert await strength_of(longterm, theirs) == pytest.approx(0.99**3, rel=1e-5)


async def test_decay_pass_changes_exactly_what_the_rule_says_for_every_memory(
    longterm: LongTermStore,
) -> None:
    """The indexed pass against the rule applied to every stored memory: users with
    memories of many ages over several of the store's pages, and one user without state."""
    ages = [0.0, 0.5, 1.0, 2.0, 5.0, 30.0]  # days before the user's newest event
    newest = {"u1": T0 + 40 * DAY, "u2": T0 + 3 * DAY, "u3": T0 + 9 * DAY}
    state = FakeShortTermState()
    memories = []
    for user, at in newest.items():
        if user != "u3":  # u3 has memories but no short-term state: no clock to age them by
            await said(state, "acme", user, at)
        for k in range(3 * SCAN_PAGE // len(ages) + 1):
            for age in ages:
                created = at - age * DAY - timedelta(minutes=k)
                memories.append(
                    memory("acme", user, f"k:{age}:{k}").model_copy(
                        update={"created_at": created, "updated_at": created}
                    )
                )
    await stored(longterm, *memories)
    expected = {
        m.memory_id: decayed(m, newest[m.user_id], PARAMS)
        for m in memories
        if m.user_id != "u3" and decayed(m, newest[m.user_id], PARAMS) is not m
    }
    assert await worker(longterm, state).decay_all() == len(expected)
    for m in memories:
        (after,) = await longterm.get_many("acme", m.user_id, [m.memory_id])
        assert after == expected.get(m.memory_id, m)
