"""memorize over fetched batches (``Memorizer.memorize``) against the short-term fake: a
batch decides and stores exactly what its events decide one by one, whatever the batch
sizes; duplicates, forgotten users and a poison event in a batch; triggers delivered before
the write, and a crash in between re-emits the same ids; the bot's canned lines (the
per-user heard set) and a user's own repeats."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from memstream.memory.clustering import ClusterParams
from memstream.memory.recurrence import RecurrenceParams
from memstream.schemas import EncodedEvent, EventMetadata, InteractionEvent
from memstream.stores.short_term import UserWrite
from memstream.streaming.stage import Received
from memstream.streams.memorize import Decision, Memorizer, by_user
from tests.fakes import FakeShortTermState
from tests.unit.over_fakes import ENCODER

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"
CANNED = "Your parcel is on its way and should arrive within three working days."
TALK = [
    ("user", "Where is my order A-10293? It has not shipped yet"),
    ("assistant", CANNED),
    ("user", "I like hiking in the mountains near the lake"),
    ("user", "Order A-10293 still shows no tracking number"),
    ("assistant", "Let me check the warehouse system for you right now."),
    ("user", "Can you check order A-10293 again please"),
    ("user", "My flat's door code is 4417, please remember that"),
    ("assistant", CANNED),
    ("user", "Hiking trails near the lake were lovely this weekend"),
    ("user", "The mountains near the lake had fresh snow on the trails"),
]
# Maintenance every few memories and splits of small clusters, so member vectors are read
# in the middle of a batch (the path that writes the user's earlier events first).
SPLITTY = ClusterParams(maintain_every=3, split_min_size=3, split_dispersion=0.0)


def item(
    i: int, text: str, *, user: str = "u1", role: str = "user", session: int = 0
) -> Received[EncodedEvent]:
    e = InteractionEvent(
        event_id=f"{user}-e{i}",
        tenant_id=TENANT,
        user_id=user,
        session_id=f"s{session}",
        role=role,
        text=text,
        ts=T0 + timedelta(hours=i),
        metadata=EventMetadata(),
    )
    encoded = EncodedEvent(event=e, embedding=ENCODER.encode([text])[0].tolist(), model_id="hash")
    return Received(encoded, f"{TENANT}:{user}".encode(), encoded.model_dump_json().encode())


def stream() -> list[Received[EncodedEvent]]:
    """Three users interleaved, each saying the talk (twice, as sessions) in log order."""
    items = []
    for n in range(2 * len(TALK)):
        for user in ("u1", "u2", "u3")[: 1 + n % 3]:
            role, text = TALK[n % len(TALK)]
            items.append(item(n, text, user=user, role=role, session=n // len(TALK)))
    return items


def memorizer(state: FakeShortTermState, params: ClusterParams | None = None) -> Memorizer:
    embed = ENCODER.encode
    return Memorizer(
        state=state,
        cluster_params=params or ClusterParams(),
        recurrence_params=RecurrenceParams(),
        window=50,
        embed=embed,
    )


class Delivered:
    """The deliver callback: records triggers, and checks each event is not yet marked."""

    def __init__(self, state: FakeShortTermState) -> None:
        self.state = state
        self.trigger_ids: list[str] = []

    async def __call__(self, decided: Sequence[tuple[Received[EncodedEvent], Decision]]) -> None:
        for it, d in decided:
            event = it.value.event
            snap = await self.state.load_user(event.tenant_id, event.user_id, event.event_id)
            assert not snap.already_processed  # delivered before the state says processed
            self.trigger_ids += [t.trigger_id for t in d.triggers]


async def one_by_one(
    items: list[Received[EncodedEvent]], params: ClusterParams | None = None
) -> tuple[FakeShortTermState, dict[str, Decision]]:
    state = FakeShortTermState()
    m = memorizer(state, params)
    decisions = {}
    for it in items:  # each event alone through the batch path: the one-by-one reference
        [(_, d)] = await m.memorize([[it]], Delivered(state))
        assert isinstance(d, Decision), d
        decisions[it.value.event.event_id] = d
    return state, decisions


async def batched(
    items: list[Received[EncodedEvent]], sizes: random.Random, params: ClusterParams | None = None
) -> tuple[FakeShortTermState, dict[str, Decision], Delivered]:
    state = FakeShortTermState()
    m = memorizer(state, params)
    deliver = Delivered(state)
    decisions = {}
    at = 0
    while at < len(items):
        size = sizes.randint(1, 12)
        for it, result in await m.memorize(by_user(items[at : at + size]), deliver):
            assert isinstance(result, Decision), result
            decisions[it.value.event.event_id] = result
        at += size
    return state, decisions, deliver


def plan_of(d: Decision) -> tuple[Any, ...]:
    u = d.update
    return (
        [t.model_dump() for t in d.triggers],
        u.turn,
        u.pending_add.event_id if u.pending_add else None,
        u.pending_add.salient if u.pending_add else None,
        tuple(u.pending_remove),
        u.keys,
        [(c.cluster_id, c.member_ids, c.description) for c in u.clusters.clusters]
        if u.clusters
        else None,
        tuple(u.clusters_changed),
        tuple(u.clusters_removed),
        tuple(u.heard),
    )


async def stored(state: FakeShortTermState, items: list[Received[EncodedEvent]]) -> Any:
    """Every user's stores, item by item."""
    out = {}
    for user in ("u1", "u2", "u3"):
        ids = [it.value.event.event_id for it in items if it.value.event.user_id == user]
        snap = await state.load_user(TENANT, user, "-")
        out[user] = (
            await state.timeline_ids(TENANT, user),
            [(t.turn, t.vector.tobytes()) for t in await state.turns(TENANT, user, ids)],
            [(p.event_id, p.vector.tobytes()) for p in snap.pending],
            snap.keys,
            snap.cluster_version[1],
            [
                (c.cluster_id, c.member_ids, c.description, np.asarray(c.centroid).tobytes())
                for c in await state.clusters(TENANT, user)
            ],
            [await state.open_event_triggers(TENANT, user, i) for i in ids],
            await state.turns_written(TENANT, user),
        )
    return out


async def test_batches_of_any_size_decide_and_store_what_events_one_by_one_do() -> None:
    items = stream()
    alone_state, alone = await one_by_one(items)
    assert sum(len(d.triggers) for d in alone.values()) > 0  # the stream does trigger
    for seed in (1, 2, 3):
        state, decisions, deliver = await batched(items, random.Random(seed))
        assert sorted(decisions) == sorted(alone)
        for event_id, d in alone.items():
            assert plan_of(decisions[event_id]) == plan_of(d), event_id
        assert await stored(state, items) == await stored(alone_state, items)
        # Each trigger delivered once (batches order them by user, not across users).
        assert sorted(deliver.trigger_ids) == sorted(
            t.trigger_id for d in alone.values() for t in d.triggers
        )


async def test_two_events_of_one_user_in_a_batch_equal_them_one_by_one() -> None:
    items = [item(0, TALK[0][1]), item(1, TALK[3][1]), item(2, TALK[5][1])]
    alone_state, alone = await one_by_one(items)
    state = FakeShortTermState()
    results = await memorizer(state).memorize(by_user(items), Delivered(state))
    together = {it.value.event.event_id: r for it, r in results}
    assert all(isinstance(r, Decision) for r in together.values())
    for event_id, d in alone.items():
        r = together[event_id]
        assert isinstance(r, Decision)
        assert plan_of(r) == plan_of(d)
    [trigger] = alone["u1-e2"].triggers  # the third mention of the order
    assert trigger.turn_ids == ["u1-e0", "u1-e1", "u1-e2"]
    assert await stored(state, items) == await stored(alone_state, items)


async def test_splits_in_the_middle_of_a_batch_read_what_one_by_one_would() -> None:
    rng = random.Random(5)
    texts = [t for _, t in TALK] * 3
    items = [item(i, texts[i]) for i in range(len(texts))]
    alone_state, alone = await one_by_one(items, SPLITTY)
    assert any(
        d.clustering and d.clustering.maintenance and d.clustering.maintenance.splits
        for d in alone.values()
    )
    state, decisions, _ = await batched(items, rng, SPLITTY)
    for event_id, d in alone.items():
        assert plan_of(decisions[event_id]) == plan_of(d), event_id
    assert await stored(state, items) == await stored(alone_state, items)


async def test_duplicates_forgotten_users_and_a_poison_event_in_one_batch() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    first = [item(0, TALK[0][1]), item(1, TALK[2][1])]
    await m.memorize(by_user(first), Delivered(state))
    await state.mark_forgotten(TENANT, "u9", (T0 + timedelta(hours=3)).timestamp())
    bad = item(2, "This one has a broken embedding of the wrong size")
    bad = Received(bad.value.model_copy(update={"embedding": [0.5, 0.5, 0.5]}), bad.key, bad.raw)
    batch = [
        first[1],  # redelivered
        item(3, "Forgotten, this stays forgotten", user="u9"),
        bad,
        item(4, TALK[3][1]),  # the same user after the poison event goes on
        item(5, "Said after the forget, so kept", user="u9"),
        item(4, TALK[3][1]),  # the same event twice in one batch
    ]
    results = await m.memorize(by_user(batch), Delivered(state))
    outcome = [
        r if isinstance(r, str) else type(r).__name__ if isinstance(r, Exception) else "ok"
        for _, r in results
    ]
    assert [it.value.event.event_id for it, _ in results] == [
        "u1-e1",
        "u1-e2",
        "u1-e4",
        "u1-e4",
        "u9-e3",
        "u9-e5",
    ]
    assert outcome[0] == "duplicate"
    poison = results[1][1]
    assert isinstance(poison, Exception)  # dead-lettered by the stage; it changed nothing
    assert outcome[2:] == ["ok", "duplicate", "forgotten", "ok"]
    assert await state.timeline_ids(TENANT, "u1") == ["u1-e0", "u1-e1", "u1-e4"]
    assert await state.timeline_ids(TENANT, "u9") == ["u9-e5"]


async def test_the_bots_canned_line_counts_once_per_user_and_a_users_repeat_always() -> None:
    state = FakeShortTermState()
    m = memorizer(state)
    said = [
        item(0, CANNED, role="assistant", session=0),
        item(1, CANNED, role="assistant", session=1),  # heard before: the script
        item(2, CANNED, user="u2", role="assistant"),  # another user: news to them
        item(3, "I would like to return the blue jacket I bought", session=1),
        item(4, "I would like to return the blue jacket I bought", session=2),
    ]
    results = await m.memorize(by_user(said[:2]), Delivered(state))  # one batch ...
    results += await m.memorize(by_user(said[2:]), Delivered(state))  # ... and another
    kept = {
        it.value.event.event_id: r.update.pending_add is not None
        for it, r in results
        if isinstance(r, Decision)
    }
    assert kept == {"u1-e0": True, "u1-e1": False, "u2-e2": True, "u1-e3": True, "u1-e4": True}
    # The same in one event at a time: the heard set is the state, not the batch.
    _, alone = await one_by_one(said)
    assert {i: d.update.pending_add is not None for i, d in alone.items()} == kept


class CrashOnWrite(FakeShortTermState):
    """The process dies between delivering a batch's triggers and writing it (once)."""

    crashed = False

    async def apply_users(self, writes: Sequence[UserWrite]) -> None:
        if not self.crashed:
            self.crashed = True
            raise KeyboardInterrupt("killed before the write")
        await super().apply_users(writes)


async def test_a_crash_between_delivery_and_write_re_emits_the_same_trigger_ids() -> None:
    items = [item(i, TALK[n][1]) for i, n in enumerate((0, 3, 5, 2))]
    state = CrashOnWrite()
    m = memorizer(state)
    deliver = Delivered(state)
    with pytest.raises(KeyboardInterrupt):
        await m.memorize(by_user(items), deliver)
    first = list(deliver.trigger_ids)
    assert first  # the third mention of the order was delivered, then nothing was written
    assert await state.timeline_ids(TENANT, "u1") == []
    results = await m.memorize(by_user(items), deliver)  # the batch, redelivered
    assert all(isinstance(r, Decision) for _, r in results)
    assert deliver.trigger_ids == first + first  # the same ids again: the consolidator dedups
    alone_state, _ = await one_by_one(items)
    assert await stored(state, items) == await stored(alone_state, items)
