"""The RPC's intake journal: every event answered 202 is on disk before the answer.

The embedded broker (Tansu, memory-only storage) forgets its topics when it dies, and
Valkey's AOF syncs once a second, so a 202 alone survived no crash of the stack. The RPC
appends each accepted request's events here (one JSON line each: the ``InteractionEvent``
as published) and fsyncs before it publishes and answers; its next start re-publishes the
events not yet memorized (``rpc.intake``), and a segment is deleted once every event in it
is memorized and the marks have had time to reach Valkey's AOF.

Segments are ``<folder>/<seq>.jsonl``. One writer appends: requests that arrive while an
fsync runs share the next one (group commit). A segment rotates by size or age, and a
process never appends to a segment an earlier one left, so a crash mid-write tears at
most the last line of a segment, which reading skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from memstream.schemas import InteractionEvent
from memstream.stores.embedded import DataDirBusy, DataDirLock

log = logging.getLogger("memstream.journal")

SUFFIX = ".jsonl"
LOCK_NAME = "journal"  # the folder's DataDirLock: journal.lock

# Whether each event is settled (memorized, or never to be: a forgotten user's), in order.
# ``thorough``: the segment has waited long; look past the processed marks (tombstones).
Settled = Callable[[Sequence[InteractionEvent], bool], Awaitable[list[bool]]]


class JournalBusy(RuntimeError):
    """Another process appends to this journal folder."""


@dataclass(frozen=True)
class Read:
    """A segment's events in the order appended, and the lines skipped (torn or unparsable)."""

    events: list[InteractionEvent]
    torn: int


@dataclass
class Segment:
    path: Path
    seq: int
    closed_at: float | None = None  # monotonic; None while it takes appends
    verified_at: float | None = None  # when every event was first found settled
    remaining: list[InteractionEvent] | None = None  # not yet settled; None: not read yet
    size: int = 0


def read_segment(path: Path) -> Read:
    """Every whole line of ``path`` that parses. A line without its newline is the torn end
    of a write a crash cut short: skipped, like a line that does not parse."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = 1 if lines[-1] else 0  # a complete file ends with "\n": the last piece is empty
    events: list[InteractionEvent] = []
    for line in lines[:-1]:
        if not line:
            continue
        try:
            events.append(InteractionEvent.model_validate_json(line))
        except ValidationError:
            torn += 1
    return Read(events, torn)


@dataclass
class IntakeJournal:
    """An append-only journal of accepted events in ``folder`` (see the module's doc).

    ``segment_bytes`` / ``segment_age_s``: when the segment appended to is closed and the
    next write starts a new one (an idle segment is closed by ``rotate_if_due``, so it can
    be pruned). ``settle_s``: how long after all of a segment's events were found settled
    it is checked once more and deleted (Valkey's AOF fsyncs every second). ``max_age_s``:
    a closed segment whose last write is older is deleted even with events unsettled (a
    dead-lettered event is never memorized), with a warning.
    """

    folder: Path
    segment_bytes: int = 4 * 2**20
    segment_age_s: float = 2.0
    settle_s: float = 5.0
    max_age_s: float = 86_400.0
    thorough_after_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _segments: list[Segment] = field(default_factory=list, init=False)
    _recovered: list[Segment] = field(default_factory=list, init=False)
    _current: Segment | None = field(default=None, init=False)
    _fd: int | None = field(default=None, init=False)
    _opened_at: float = field(default=0.0, init=False)
    _next_seq: int = field(default=1, init=False)
    _lock: DataDirLock | None = field(default=None, init=False)
    _io: threading.Lock = field(default_factory=threading.Lock, init=False)
    _queue: list[tuple[bytes, asyncio.Future[None]]] = field(default_factory=list, init=False)
    _writer: asyncio.Task[None] | None = field(default=None, init=False)

    # -- opening and recovery ------------------------------------------------------------

    def open(self) -> None:
        """Take the folder and list the segments an earlier process left (all closed now)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = DataDirLock(self.folder, LOCK_NAME).acquire()
        except DataDirBusy:
            raise JournalBusy(
                f"another process appends to the intake journal {self.folder}"
            ) from None
        now = self.clock()
        found = sorted((int(p.stem), p) for p in self.folder.glob(f"*{SUFFIX}") if p.stem.isdigit())
        self._segments = [
            Segment(path, seq, closed_at=now, size=path.stat().st_size) for seq, path in found
        ]
        self._recovered = list(self._segments)
        self._next_seq = found[-1][0] + 1 if found else 1

    def recovered(self) -> Read:
        """Every event of the segments an earlier process left, in order: what it accepted
        and may never have reached the broker (the caller skips what is memorized)."""
        events: list[InteractionEvent] = []
        torn = 0
        for segment in self._recovered:
            if segment.path.exists():
                read = read_segment(segment.path)
                events.extend(read.events)
                torn += read.torn
        return Read(events, torn)

    # -- appending -----------------------------------------------------------------------

    async def append(self, values: Sequence[bytes]) -> None:
        """Append one line per value; return once they are fsynced.

        Values queued while a write runs go out together in the next one: concurrent
        requests share an fsync."""
        if not values:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((b"".join(v + b"\n" for v in values), done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_queued())
        await done

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await asyncio.to_thread(self._write, b"".join(data for data, _ in batch))
            except Exception as exc:
                for _, done in batch:
                    if not done.done():  # a caller that gave up (cancelled) has its own end
                        done.set_exception(exc)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    def _write(self, data: bytes) -> None:
        with self._io:
            now = self.clock()
            current = self._current
            if current is not None and (
                current.size >= self.segment_bytes or now - self._opened_at >= self.segment_age_s
            ):
                self._close_current(now)
            if self._fd is None:
                self._open_segment(now)
            assert self._fd is not None
            assert self._current is not None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
                os.fsync(self._fd)
            except OSError:
                # Part of the batch may be on disk: the next write starts a segment of its
                # own, so that torn line stays the last of this one (reading skips it).
                self._close_current(now)
                raise
            self._current.size += len(data)

    def _open_segment(self, now: float) -> None:
        seq = self._next_seq
        self._next_seq += 1
        path = self.folder / f"{seq:012d}{SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._fsync_folder()  # the new file's name is as durable as what it will hold
        self._current = Segment(path, seq)
        self._opened_at = now
        self._segments.append(self._current)

    def _close_current(self, now: float) -> None:
        if self._fd is not None:
            os.close(self._fd)  # its data is fsynced already
        self._fd = None
        if self._current is not None:
            self._current.closed_at = now
        self._current = None

    def _fsync_folder(self) -> None:
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def rotate_if_due(self) -> None:
        """Close the segment appended to once it is old enough (prunable then)."""
        await asyncio.to_thread(self._rotate_if_due)

    def _rotate_if_due(self) -> None:
        with self._io:
            if self._current is not None and self.clock() - self._opened_at >= self.segment_age_s:
                self._close_current(self.clock())

    # -- pruning -------------------------------------------------------------------------

    async def prune(self, settled: Settled) -> int:
        """Delete the closed segments whose events are all settled; how many went.

        A segment is deleted on its second all-settled look, ``settle_s`` after the first:
        a processed mark Valkey had not yet synced to its AOF would be missing again on the
        second look had Valkey restarted in between."""
        gone = 0
        for segment in [s for s in self._segments if s.closed_at is not None]:
            assert segment.closed_at is not None
            now = self.clock()
            if segment.remaining is None:
                segment.remaining = (await asyncio.to_thread(read_segment, segment.path)).events
            thorough = now - segment.closed_at >= self.thorough_after_s
            if segment.remaining:
                flags = await settled(segment.remaining, thorough)
                segment.remaining = [
                    e for e, ok in zip(segment.remaining, flags, strict=True) if not ok
                ]
            if segment.remaining:
                if self._expired(segment):
                    log.warning(
                        "intake journal: %s deleted after rpc.journal_max_age_s with %d events "
                        "never memorized (dead-lettered?)",
                        segment.path.name,
                        len(segment.remaining),
                    )
                    gone += self._delete(segment)
                continue
            if segment.verified_at is None:
                segment.verified_at = now
                continue
            if now - segment.verified_at < self.settle_s:
                continue
            events = (await asyncio.to_thread(read_segment, segment.path)).events
            flags = await settled(events, thorough) if events else []
            if all(flags):
                gone += self._delete(segment)
            else:  # marks lost since the first look (Valkey restarted): wait for them again
                segment.remaining = [e for e, ok in zip(events, flags, strict=True) if not ok]
                segment.verified_at = None
        return gone

    def _expired(self, segment: Segment) -> bool:
        try:
            written = segment.path.stat().st_mtime
        except FileNotFoundError:
            return True
        return self.wall() - written >= self.max_age_s

    def _delete(self, segment: Segment) -> int:
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()
        with self._io:
            self._segments.remove(segment)
        if segment in self._recovered:
            self._recovered.remove(segment)
        return 1

    # -- what it holds -------------------------------------------------------------------

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segments(self) -> int:
        return len(self._segments)

    async def close(self) -> None:
        """Finish queued writes, close the segment and release the folder."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer
        with self._io:
            if self._fd is not None:
                self._close_current(self.clock())
        if self._lock is not None:
            self._lock.release()
            self._lock = None
