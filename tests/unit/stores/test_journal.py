"""The intake journal on a real folder: appends are lines on disk, a torn end is skipped,
segments rotate, a new process recovers what an earlier one left, pruning deletes only what
is settled and only on a second look."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memstream.schemas import InteractionEvent
from memstream.stores.journal import IntakeJournal, JournalBusy, read_segment


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def event(i: int, user: str = "u1") -> InteractionEvent:
    return InteractionEvent(
        event_id=f"e{i}",
        tenant_id="acme",
        user_id=user,
        session_id="s1",
        role="user",
        text=f"where is order A-{i}?",
        ts=datetime(2026, 12, 1, tzinfo=UTC),
    )


def values(*ids: int) -> list[bytes]:
    return [event(i).model_dump_json().encode() for i in ids]


def journal(folder: Path, clock: Clock, **params: float) -> IntakeJournal:
    j = IntakeJournal(folder, clock=clock, wall=clock, **params)  # type: ignore[arg-type]
    j.open()
    return j


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.jsonl"))


async def test_appended_events_are_lines_on_disk_and_a_new_process_recovers_them(
    tmp_path: Path,
) -> None:
    clock = Clock()
    first = journal(tmp_path, clock)
    assert first.recovered().events == []
    await first.append(values(1, 2))
    await first.append(values(3))
    await first.append([])  # nothing to write: no segment either
    [name] = files(tmp_path)
    assert [e.event_id for e in read_segment(tmp_path / name).events] == ["e1", "e2", "e3"]
    assert first.segments == 1
    assert first.bytes == (tmp_path / name).stat().st_size
    await first.close()

    second = journal(tmp_path, clock)
    read = second.recovered()
    assert [e.event_id for e in read.events] == ["e1", "e2", "e3"]
    assert read.events[0] == event(1)
    assert read.torn == 0
    await second.append(values(4))  # never into the segment an earlier process left
    assert len(files(tmp_path)) == 2
    assert [e.event_id for e in second.recovered().events] == ["e1", "e2", "e3"]
    await second.close()


async def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    clock = Clock()
    first = journal(tmp_path, clock)
    await first.append(values(1, 2))
    await first.close()
    [name] = files(tmp_path)
    whole = values(3)[0]
    with (tmp_path / name).open("ab") as f:
        f.write(whole[: len(whole) // 2])  # a crash in the middle of a write
    second = journal(tmp_path, clock)
    read = second.recovered()
    assert [e.event_id for e in read.events] == ["e1", "e2"]
    assert read.torn == 1
    await second.close()


async def test_a_second_process_cannot_take_the_folder(tmp_path: Path) -> None:
    first = journal(tmp_path, Clock())
    with pytest.raises(JournalBusy, match="another process"):
        journal(tmp_path, Clock())
    await first.close()
    journal(tmp_path, Clock())  # released on close


async def test_segments_rotate_by_size_and_by_age(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, segment_bytes=300, segment_age_s=10)
    await j.append(values(1))
    await j.append(values(2))  # under 300 bytes so far: same segment
    assert len(files(tmp_path)) == 1
    await j.append(values(3))  # the segment passed 300 bytes: the next write starts one
    await j.append(values(4))
    assert len(files(tmp_path)) == 2
    clock.now += 11
    await j.append(values(5))  # the open segment is older than segment_age_s
    assert len(files(tmp_path)) == 3
    clock.now += 11
    await j.rotate_if_due()  # an idle segment is closed too, so it can be pruned
    await j.append(values(6))
    assert len(files(tmp_path)) == 4
    ids = [e.event_id for n in files(tmp_path) for e in read_segment(tmp_path / n).events]
    assert ids == ["e1", "e2", "e3", "e4", "e5", "e6"]
    await j.close()


async def test_concurrent_appends_share_an_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = journal(tmp_path, Clock())
    await j.append(values(0))  # the segment (and its folder's fsync) exists
    calls = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    await asyncio.gather(*(j.append(values(i)) for i in range(1, 51)))
    assert 1 <= len(calls) <= 2  # the first write alone, the other 49 in one more
    [name] = files(tmp_path)
    assert len(read_segment(tmp_path / name).events) == 51
    await j.close()


class Settled:
    """Events settled by id; records what it was asked."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.asked: list[tuple[list[str], bool]] = []

    async def __call__(self, events: Sequence[InteractionEvent], thorough: bool) -> list[bool]:
        self.asked.append(([e.event_id for e in events], thorough))
        return [e.event_id in self.ids for e in events]


async def test_pruning_deletes_a_closed_segment_on_a_second_settled_look(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, segment_age_s=2, settle_s=5)
    settled = Settled()
    await j.append(values(1, 2))
    assert await j.prune(settled) == 0  # still open: never looked at
    assert settled.asked == []
    clock.now += 3
    await j.rotate_if_due()
    await j.append(values(3))  # the next segment, open
    settled.ids = {"e1"}
    assert await j.prune(settled) == 0
    assert settled.asked == [(["e1", "e2"], False)]
    settled.ids = {"e1", "e2"}
    assert await j.prune(settled) == 0  # all settled: the first look, only e2 asked
    assert settled.asked[-1] == (["e2"], False)
    clock.now += 4
    assert await j.prune(settled) == 0  # under settle_s since that look
    clock.now += 2
    assert await j.prune(settled) == 1  # the second look reads the whole segment again
    assert settled.asked[-1] == (["e1", "e2"], False)
    assert len(files(tmp_path)) == 1  # the open segment stays
    assert j.segments == 1
    await j.close()


async def test_marks_lost_before_the_second_look_keep_the_segment(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, segment_age_s=1, settle_s=5)
    settled = Settled()
    await j.append(values(1, 2))
    clock.now += 2
    await j.rotate_if_due()
    settled.ids = {"e1", "e2"}
    await j.prune(settled)
    settled.ids = {"e1"}  # Valkey restarted from an AOF that missed e2's mark
    clock.now += 6
    assert await j.prune(settled) == 0
    assert len(files(tmp_path)) == 1
    settled.ids = {"e1", "e2"}  # memorized again after the re-publish
    await j.prune(settled)
    clock.now += 6
    assert await j.prune(settled) == 1
    assert files(tmp_path) == []
    await j.close()


async def test_a_segment_never_settled_is_deleted_past_max_age(tmp_path: Path) -> None:
    clock = Clock()
    first = journal(tmp_path, clock)
    await first.append(values(1))
    await first.close()
    second = IntakeJournal(
        tmp_path, clock=clock, wall=lambda: time.time() + 86_401, settle_s=5, thorough_after_s=30
    )
    second.open()
    settled = Settled()
    assert await second.prune(settled) == 1  # never settled, last written past max_age_s
    assert settled.asked == [(["e1"], False)]
    assert files(tmp_path) == []
    await second.close()


async def test_a_long_unsettled_segment_is_asked_thoroughly(tmp_path: Path) -> None:
    clock = Clock()
    j = journal(tmp_path, clock, segment_age_s=1, thorough_after_s=30)
    settled = Settled()
    await j.append(values(1))
    clock.now += 2
    await j.rotate_if_due()
    await j.prune(settled)
    clock.now += 31
    await j.prune(settled)
    assert [t for _, t in settled.asked] == [False, True]
    await j.close()


async def test_a_failed_write_is_refused_and_the_next_one_starts_a_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = journal(tmp_path, Clock())
    await j.append(values(1))
    real = os.write

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        real(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        await j.append(values(2))
    monkeypatch.setattr(os, "write", real)
    await j.append(values(3))
    reads = [read_segment(tmp_path / n) for n in files(tmp_path)]
    assert [[e.event_id for e in r.events] for r in reads] == [["e1"], ["e3"]]
    assert [r.torn for r in reads] == [1, 0]
    await j.close()
