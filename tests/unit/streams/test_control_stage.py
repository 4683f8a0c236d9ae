"""The control stage's handler (``streams.control.Controller``) over the short-term fake and
qdrant-client's in-process store, driven through one turn of the per-message loop: a
forget removes the user's short- and long-term data and leaves a tombstone at the
command's time, and nobody else's; other actions and bad commands are not forgets."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np

from memstream.schemas import ConsolidatedMemory, Control, StoredTurn
from memstream.stores.longterm import ArchivedTurn, LongTermStore, memory_point_id
from memstream.streams.control import NAME, Controller
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER, put_hot
from tests.unit.streams.stage_fakes import message, sample, stage

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
FORGET_AT = T0 + timedelta(days=1)
PEOPLE = [("acme", "u1"), ("acme", "u2"), ("other", "u1")]  # the same user id, two tenants


def command(tenant: str, user: str, action: str = "forget_user") -> bytes:
    return json.dumps(
        {"tenant_id": tenant, "user_id": user, "action": action, "ts": FORGET_AT.isoformat()}
    ).encode()


def turn(i: int, text: str) -> StoredTurn:
    return StoredTurn(
        event_id=f"e{i}", session_id="s1", role="user", text=text, ts=T0 + timedelta(hours=i)
    )


async def remember(state: FakeShortTermState, longterm: LongTermStore) -> None:
    """Each person: two hot turns, both archived, and one consolidated memory."""
    for tenant, user in PEOPLE:
        turns = [turn(0, f"{user} ordered A-1"), turn(1, f"{user} likes tea")]
        for t in turns:
            await put_hot(state, tenant, user, t)
        vectors = ENCODER.encode([t.text for t in turns])
        await longterm.upsert_turns(
            [ArchivedTurn(tenant, user, t, v) for t, v in zip(turns, vectors, strict=True)]
        )
        key = "entity:order:A-1"
        memory = ConsolidatedMemory(
            memory_id=memory_point_id(tenant, user, key),
            tenant_id=tenant,
            user_id=user,
            key=key,
            title="Order A-1",
            created_at=T0,
            updated_at=T0,
        )
        await longterm.upsert([(memory, ENCODER.encode([memory.title])[0])])


async def traces(
    state: FakeShortTermState, longterm: LongTermStore, tenant: str, user: str
) -> tuple[int, int, int, float | None]:
    """(hot turns, archived turns, memories, tombstone) of one person."""
    return (
        await state.count_hot_turns(tenant, user),
        await longterm.count_turns(tenant, user),
        await longterm.count(tenant, user),
        await state.forgotten_at(tenant, user),
    )


async def test_a_forget_removes_the_user_everywhere_and_nobody_else(
    longterm: LongTermStore,
) -> None:
    state = FakeShortTermState()
    await remember(state, longterm)
    s, dlq, metrics = stage(NAME, "memstream.control")
    controller = Controller(s, state, longterm)

    await s.handle_message(Control, controller.handle, message(command("acme", "u1")))

    assert await traces(state, longterm, "acme", "u1") == (0, 0, 0, FORGET_AT.timestamp())
    assert await state.turns_state("acme", "u1") == (None, 0)  # the turn index re-syncs
    assert await state.clusters("acme", "u1") == []
    for tenant, user in PEOPLE[1:]:  # another user, and the same user id of another tenant
        assert await traces(state, longterm, tenant, user) == (2, 2, 1, None)
        assert await state.timeline_ids(tenant, user) == ["e0", "e1"]
    assert dlq.sent == []
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 1


async def test_a_redelivered_forget_changes_nothing_and_sweeps_late_writes(
    longterm: LongTermStore,
) -> None:
    state = FakeShortTermState()
    await remember(state, longterm)
    s, dlq, metrics = stage(NAME, "memstream.control")
    controller = Controller(s, state, longterm)
    await s.handle_message(Control, controller.handle, message(command("acme", "u1")))
    # A processor wrote for the user between the RPC's delete and the command's delivery.
    late = turn(5, "written while the forget was in flight")
    await put_hot(state, "acme", "u1", late)
    await longterm.upsert_turns(
        [ArchivedTurn("acme", "u1", late, np.asarray(ENCODER.encode([late.text])[0]))]
    )

    await s.handle_message(Control, controller.handle, message(command("acme", "u1")))

    assert await traces(state, longterm, "acme", "u1") == (0, 0, 0, FORGET_AT.timestamp())
    assert await traces(state, longterm, "acme", "u2") == (2, 2, 1, None)
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 2
    assert dlq.sent == []


async def test_other_actions_and_bad_commands_forget_nothing(longterm: LongTermStore) -> None:
    state = FakeShortTermState()
    await remember(state, longterm)
    s, dlq, metrics = stage(NAME, "memstream.control")
    controller = Controller(s, state, longterm)
    no_user = json.loads(command("acme", "u1"))
    del no_user["user_id"]
    for raw in (
        command("acme", "u1", action="pin_memory"),  # the consolidation workers' command
        command("acme", "u1", action="drop_everything"),
        json.dumps(no_user).encode(),
    ):
        await s.handle_message(Control, controller.handle, message(raw))

    for tenant, user in PEOPLE:
        assert await traces(state, longterm, tenant, user) == (2, 2, 1, None)
    bad_action, missing = dlq.letters()
    assert bad_action.reason.startswith("invalid message: action: Input should be")
    assert missing.reason == "invalid message: user_id: Field required"
    assert (bad_action.stage, bad_action.topic) == (NAME, "memstream.control")
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="skipped") == 1
    assert sample(metrics, "memstream_dlq_total", stage=NAME, reason="validation") == 2
