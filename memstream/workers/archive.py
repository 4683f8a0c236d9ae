"""The archive worker: every turn a user said, written through to the long-term store.

It reads ``memstream.encoded`` in batches (its own agent; apart from the processors it is
its own consumer group) and upserts each turn into the store's archive
(``TurnArchive.upsert_turns``; point id uuid5 of tenant, user and event id, so a
redelivered or replayed batch rewrites the same points). No LLM, no clustering: the
turn's text, speaker, time, session, entities and the embedding rounded as the hot tier
rounds it. Short-term memory in Redis can then expire in event time without losing
anything: the RPC's turn index ranks a user's archived turns with the hot ones. A turn
that leaves the hot tier before this worker has written it stays in Redis until it has:
after each write the worker releases the user's leaving turns the archive now holds.

A forgotten user stays forgotten: turns stamped at or before the user's forget tombstone
are skipped, and checked again after the write, because a forget may land between the
check and the write (its delete would then have run before the turn arrived).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from memstream.memory.turns import stored_turn
from memstream.memory.vectors import normalize
from memstream.metrics import StageSeries
from memstream.schemas import EncodedEvent
from memstream.stores.cpu import off_loop
from memstream.stores.forget import forgotten
from memstream.stores.longterm import ArchivedTurn, TurnArchive
from memstream.stores.short_term import ShortTermState
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import Received

NAME = "archive"


def archived_turn(encoded: EncodedEvent) -> ArchivedTurn:
    """The turn as memorize stores it in Redis, less the cluster it was put in."""
    event = encoded.event
    turn = stored_turn(event)
    vector = normalize(np.asarray(encoded.embedding, dtype=np.float32))
    return ArchivedTurn(event.tenant_id, event.user_id, turn, vector)


@dataclass
class ArchiveWorker:
    state: ShortTermState  # forget tombstones; releases the turns that left the hot tier
    longterm: TurnArchive

    async def archive(
        self, batch: Sequence[EncodedEvent], arrived: Sequence[float | None] = ()
    ) -> int:
        """Archive a batch of turns; returns how many were written (forgotten ones not).

        ``arrived``: each event's record timestamp, when known (``streaming.stage.Received``):
        one posted before its user's forget is dropped whatever its own stamp."""
        # Off the event loop: a turn's entities and phrases cost up to tens of ms at the
        # size limit, and this process serves retrievals too.
        turns = await off_loop(lambda: [archived_turn(e) for e in batch])
        arrivals = list(arrived) or [None] * len(turns)
        tombstones = await self._tombstones(turns)
        pairs = [
            (t, a) for t, a in zip(turns, arrivals, strict=True) if not _forgotten(t, tombstones, a)
        ]
        if not pairs:
            return 0
        kept = [t for t, _ in pairs]
        await self.longterm.upsert_turns(kept)
        # A forget that landed meanwhile deleted the archive before these arrived.
        after = await self._tombstones(kept)
        late = [t for t, a in pairs if _forgotten(t, after, a)]
        for tenant, user in {(t.tenant_id, t.user_id) for t in late}:
            ids = [t.turn.event_id for t in late if (t.tenant_id, t.user_id) == (tenant, user)]
            await self.longterm.delete_turns(tenant, user, ids)
        await self._release([t for t, a in pairs if not _forgotten(t, after, a)])
        return len(kept) - len(late)

    async def _release(self, written: Sequence[ArchivedTurn]) -> None:
        """Let Redis drop the turns that left the hot tier and that the archive now holds:
        these, and any listed earlier (memorize can evict a turn after it was archived)."""
        users = list(dict.fromkeys((t.tenant_id, t.user_id) for t in written))
        for (tenant, user), leaving in zip(users, await self.state.leaving(users), strict=True):
            if not leaving:
                continue
            here = {t.turn.event_id for t in written if (t.tenant_id, t.user_id) == (tenant, user)}
            older = [i for i in leaving if i not in here]
            found = await self.longterm.get_turns(tenant, user, older) if older else []
            held = here | {a.turn.event_id for a in found}
            await self.state.release_archived(tenant, user, [i for i in leaving if i in held])

    async def _tombstones(self, turns: Sequence[ArchivedTurn]) -> dict[tuple[str, str], float]:
        found: dict[tuple[str, str], float] = {}
        for owner in dict.fromkeys((t.tenant_id, t.user_id) for t in turns):
            at = await self.state.forgotten_at(*owner)
            if at is not None:
                found[owner] = at
        return found


def _forgotten(
    turn: ArchivedTurn, tombstones: dict[tuple[str, str], float], arrived: float | None = None
) -> bool:
    tombstone = tombstones.get((turn.tenant_id, turn.user_id))
    return forgotten(tombstone, turn.turn.ts.timestamp(), arrived)


def start(services: Services) -> None:
    worker = ArchiveWorker(services.state, services.longterm)
    stage = services.stage(NAME, services.topics.encoded)

    async def archive_one(item: Received[EncodedEvent]) -> int:
        return await worker.archive([item.value], [item.arrived])

    async def handle(batch: list[Received[EncodedEvent]]) -> int:
        events, arrived = [item.value for item in batch], [item.arrived for item in batch]
        try:
            await stage.retry(partial(worker.archive, events, arrived))
        except Exception:
            # One bad turn must not keep its batch-mates out: retry them one by one.
            return len(await stage.one_by_one(batch, archive_one, retry=True))
        return len(batch)

    # Bad records are the memorize stage's to dead-letter; here they are only skipped, so
    # one bad message never lands in the DLQ twice.
    r = services.settings.redis
    stage.batched(
        services.app,
        EncodedEvent,
        handle,
        agent="memstream.archive",
        batch_size=r.archive_batch_size,
        within_s=r.archive_within_s,
        invalid="skip",
    )


# Every turn to the archive tier, so the hot tier in Redis may expire (event time).
STAGE = StageSpec(
    "consolidate", start, series=(StageSeries(NAME, ("ok", "skipped", "dlq"), batched=True),)
)
