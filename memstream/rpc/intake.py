"""The RPC's side of the intake journal (``stores.journal``): recovery at start, pruning.

``POST /v1/events`` appends and fsyncs before it publishes and answers 202. At start,
before the API listens, the events an earlier process journaled and that are not memorized
(the processed marks in Redis) are published again: the embedded broker may have died with
them, or the process before it was killed between the fsync and the broker's ack. Memorize
is idempotent by event id, so one that was memorized meanwhile costs nothing. A background
task closes idle segments and deletes those whose events are all memorized.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memstream.metrics import Metrics
from memstream.schemas import InteractionEvent
from memstream.settings import RPCSettings
from memstream.stores.journal import IntakeJournal
from memstream.stores.short_term import ShortTermState
from memstream.streaming.broker import EventPublisher

log = logging.getLogger("memstream.intake")

CHUNK = 5_000  # events per pipelined read and per publish at recovery
TOPIC_WAIT_S = 30.0  # a fresh embedded broker: the processors declare the topic meanwhile


def journal_folder(data_dir: Path) -> Path:
    """Where a process with the data folder ``data_dir`` journals its intake."""
    return data_dir / "intake"


async def settled(
    state: ShortTermState, events: Sequence[InteractionEvent], thorough: bool
) -> list[bool]:
    """Memorized (the processed mark), or, looked at ``thorough``ly, stamped at or before its
    user's forget: memorize drops those, and forgetting removes the marks."""
    flags: list[bool] = []
    for at in range(0, len(events), CHUNK):
        chunk = events[at : at + CHUNK]
        flags += await state.memorized_many([(e.tenant_id, e.user_id, e.event_id) for e in chunk])
    if thorough and not all(flags):
        users = {(e.tenant_id, e.user_id) for e, ok in zip(events, flags, strict=True) if not ok}
        forgotten = {u: await state.forgotten_at(*u) for u in users}
        for i, e in enumerate(events):
            at_ = forgotten.get((e.tenant_id, e.user_id))
            if not flags[i] and at_ is not None and e.ts.timestamp() <= at_:
                flags[i] = True
    return flags


class Intake:
    """The journal of one RPC process: append, recover at start, prune in the background."""

    def __init__(
        self,
        rpc: RPCSettings,
        *,
        data_dir: Path,
        topic: str,
        state: Callable[[], ShortTermState],
        publisher: EventPublisher,
        metrics: Metrics,
    ) -> None:
        """``topic``: the events topic, where recovered events are published again."""
        self.journal = IntakeJournal(
            journal_folder(data_dir),
            segment_bytes=int(rpc.journal_segment_mb * 2**20),
            segment_age_s=rpc.journal_segment_age_s,
            settle_s=rpc.journal_settle_s,
            max_age_s=rpc.journal_max_age_s,
        )
        self.topic = topic
        self.interval_s = rpc.journal_prune_interval_s
        self.state = state  # the serving generation's: a switch swaps it (memstream.generations)
        self.publisher = publisher
        self.metrics = metrics
        self._pruning: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Open the journal, re-publish what is not memorized, start pruning; how many
        events were re-published."""
        await asyncio.to_thread(self.journal.open)
        recovered = await self.recover()
        self._note()
        self._pruning = asyncio.ensure_future(self._prune_forever())
        return recovered

    async def recover(self) -> int:
        read = await asyncio.to_thread(self.journal.recovered)
        if not read.events:
            return 0
        began = time.monotonic()
        unique = list({e.event_id: e for e in read.events}.values())  # a retried request
        memorized = await settled(self.state(), unique, thorough=False)
        todo = [e for e, done in zip(unique, memorized, strict=True) if not done]
        if todo:
            await self._wait_for_topic()
            for at in range(0, len(todo), CHUNK):
                await self.publisher.publish_many(
                    self.topic,
                    [(e.user_key, e.model_dump_json().encode()) for e in todo[at : at + CHUNK]],
                )
            self.metrics.journal_recovered.inc(len(todo))
        log.warning(
            "intake journal: %d events journaled by an earlier process, %d not memorized "
            "re-published (%d torn lines skipped) in %.2f s",
            len(unique),
            len(todo),
            read.torn,
            time.monotonic() - began,
        )
        return len(todo)

    async def _wait_for_topic(self) -> None:
        """A fresh embedded broker has no topics until the processors declare them; one a
        publish created would have the broker's partition count, not ``kafka.partitions``."""
        deadline = time.monotonic() + TOPIC_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if await self.publisher.partitions(self.topic) > 0:
                    return
            await asyncio.sleep(0.2)
        log.warning("intake journal: %s not declared after %.0f s", self.topic, TOPIC_WAIT_S)

    async def append(self, values: Sequence[bytes]) -> None:
        await self.journal.append(values)
        self._note()

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.prune()
            except Exception:  # Redis away a moment: the next round looks again
                log.warning("intake journal: pruning failed", exc_info=True)

    async def prune(self) -> int:
        await self.journal.rotate_if_due()
        gone = await self.journal.prune(
            lambda events, thorough: settled(self.state(), events, thorough)
        )
        self._note()
        return gone

    def _note(self) -> None:
        self.metrics.journal_bytes.set(self.journal.bytes)
        self.metrics.journal_segments.set(self.journal.segments)

    async def close(self) -> None:
        if self._pruning is not None:
            self._pruning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruning
        await self.journal.close()
