"""Faults fired by progress: at a share of the stream's turns stored, never at a time.

A fault fired at a fixed second hits a different part of the stream on every machine (on a
fast one "Qdrant unreachable" began at 1500 of 1500 turns and met only the consolidation
tail). Here a fault begins when ``start`` of the stream's turns are stored and, if it is a
window, ends when ``until`` are; what ran is recorded as the turn counts it actually began
and ended at (a poll may see a share late, an action may take long) and the row's label is
written from those counts, not from the plan.

The plan and the labels are pure (``plan``, ``due``, ``Span.label``); ``fire`` is the loop
that polls a counter and runs the actions, used by every stream row of the suite
(reliability/pipeline.py: crashes, outages, cluster faults).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

# What a fault does to the deployment; the line it returns goes into the row's note.
Action = Callable[[Any], Awaitable[str]]


@dataclass(frozen=True)
class Fault:
    """``begin`` at ``start`` of the turns stored; a window also runs ``end`` at ``until``.

    A point fault (``until`` None) is over when ``begin`` returns: a SIGKILL and restart,
    a Valkey restart (no turn can be stored while Valkey is down, so its length is seconds).
    """

    what: str
    start: float
    begin: Action
    until: float | None = None
    end: Action | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.start <= 1.0:
            raise ValueError(f"{self.what}: start {self.start} is not a share of the stream")
        if (self.until is None) != (self.end is None):
            raise ValueError(f"{self.what}: a window needs both until and end")
        if self.until is not None and not self.start <= self.until <= 1.0:
            raise ValueError(f"{self.what}: until {self.until} is not in [start, 1]")


@dataclass(frozen=True)
class Step:
    """One entry of a plan: fault ``index`` begins (or ends) once ``want`` turns are stored."""

    want: int
    index: int
    ending: bool


def plan(windows: Sequence[tuple[float, float | None]], total: int) -> list[Step]:
    """The steps of ``windows`` ((start, until) shares) over a stream of ``total`` turns, in
    the order they fire: by turn count; at one count a window ends before another begins
    (they do not overlap), and a fault's own begin always comes before its end."""
    steps: list[Step] = []
    for index, (start, until) in enumerate(windows):
        steps.append(Step(int(start * total), index, ending=False))
        if until is not None:
            steps.append(Step(max(int(until * total), int(start * total)), index, ending=True))
    begins = {s.index: s.want for s in steps if not s.ending}

    def phase(step: Step) -> int:
        if not step.ending:
            return 1
        return 2 if begins[step.index] == step.want else 0  # a zero-length window: after

    return sorted(steps, key=lambda s: (s.want, phase(s), s.index))


def due(steps: Sequence[Step], done: int, stored: int) -> int:
    """How many steps have fired once ``stored`` turns are stored, ``done`` having fired:
    the next ones whose count is reached, in order (a later step never fires first)."""
    while done < len(steps) and stored >= steps[done].want:
        done += 1
    return done


def share(count: int, total: int) -> str:
    return f"{100 * count / total:.0f}%" if total else "—"


@dataclass
class Span:
    """What one fault did: turns stored when it began and when it was over, and its seconds."""

    what: str
    total: int
    started_at: int
    ended_at: int | None = None
    seconds: float | None = None
    window: bool = False
    late: bool = False  # fired at the deadline, the stream having stalled before its share
    lines: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``Qdrant unreachable from 30% to 60% of turns stored (12.4 s)``, from the counts."""
        took = f" ({self.seconds:.1f} s)" if self.seconds is not None else ""
        stalled = ", stream stalled before it" if self.late else ""
        if self.window and self.ended_at is not None:
            return (
                f"{self.what} from {share(self.started_at, self.total)} to "
                f"{share(self.ended_at, self.total)} of turns stored{took}{stalled}"
            )
        return f"{self.what} at {share(self.started_at, self.total)} of turns stored{took}{stalled}"

    @property
    def counts(self) -> str:
        """The turn counts themselves: ``452 → 903 of 1500 turns``."""
        end = f" → {self.ended_at}" if self.ended_at is not None else ""
        return f"{self.started_at}{end} of {self.total} turns"


async def fire(
    faults: Sequence[Fault],
    target: Any,
    total: int,
    count: Callable[[], Awaitable[int]],
    *,
    deadline: float,
    poll_s: float = 0.5,
) -> list[Span]:
    """Run ``faults`` on ``target`` as ``count()`` (turns stored; negative while the store
    cannot answer) reaches their shares of ``total``. Past ``deadline`` (monotonic) the steps
    left fire at once, so every window is closed (a frozen process resumed, a switch off)
    whatever the stream did; such a span is marked late."""
    steps = plan([(f.start, f.until) for f in faults], total)
    spans: dict[int, Span] = {}
    began: dict[int, float] = {}
    done = 0
    while done < len(steps):
        stored = await count()
        late = time.monotonic() > deadline
        ready = len(steps) if late else due(steps, done, stored)
        if ready == done:
            await asyncio.sleep(poll_s)
            continue
        step = steps[done]  # one step at a time: an action changes what count() says
        done += 1
        fault = faults[step.index]
        if not step.ending:
            began[step.index] = time.monotonic()
            line = await fault.begin(target)
            span = Span(
                fault.what, total, stored, window=fault.until is not None, late=late, lines=(line,)
            )
            spans[step.index] = span
            if fault.until is None:
                span.ended_at = await _readable(count)
                span.seconds = time.monotonic() - began[step.index]
        else:
            assert fault.end is not None
            line = await fault.end(target)
            span = spans[step.index]
            span.ended_at = await _readable(count)
            span.seconds = time.monotonic() - began[step.index]
            span.late = span.late or late
            span.lines = (*span.lines, line)
    return list(spans.values())  # in the order they began


async def _readable(count: Callable[[], Awaitable[int]], tries: int = 60) -> int:
    """``count()`` once the store answers again (a fault may just have restarted it)."""
    for _ in range(tries):
        if (stored := await count()) >= 0:
            return stored
        await asyncio.sleep(0.5)
    return -1
