"""Backpressure on ``POST /v1/events``: a request is refused whole while the pipeline lags.

The lag is the events accepted and not yet memorized: the processors' consumer-group lag on
the events and encoded topics as the broker reports it (``streaming.broker.ConsumerGroupLag``,
what any Kafka tool shows a producer elsewhere), read every ``rpc.ingest_lag_interval_s``
off the request path, plus what this process accepted since that read began, so that a
burst between two reads counts at once. An event is counted twice for the moment between
encode's output and its commit (at most faust's commit interval, 1 s): the bound errs on
the side of refusing early, never late.

Past ``rpc.ingest_max_lag`` a request gets a 429 before anything of it is published: nothing
of a refused request was accepted, so sending the same batch again (the same event ids, as
``memstream.client`` does) is never a duplicate. ``Retry-After`` / ``Retry-After-Ms`` say how long
the group, at the pace it committed over the last few seconds, takes to bring the lag back
under the bound, within the admission hint's bounds (``rpc.admission_retry_after_*``).

A read that fails leaves the last one; one older than ``STALE_READS`` intervals is not
trusted, and requests are admitted: if the broker is down, publishing fails by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import HTTPException

from memstream.metrics import Metrics
from memstream.rpc.gate import retry_headers
from memstream.settings import RPCSettings
from memstream.streaming.broker import GroupLag

log = logging.getLogger("memstream.rpc.ingest")

STALE_READS = 10  # a last read this many intervals old is not trusted
PACE_WINDOW_S = 5.0  # the group's pace is its commits over this long (faust commits each 1 s)


@dataclass(frozen=True)
class Refusal:
    lag: int
    bound: int
    retry_after_ms: float


class IngestBrake:
    """The decision, pure: time and readings are arguments, nothing is awaited."""

    def __init__(
        self,
        max_lag: int,
        *,
        retry_after_min_ms: float,
        retry_after_max_ms: float,
        stale_after_s: float,
    ) -> None:
        self.max_lag = max_lag
        self.retry_after_min_ms = retry_after_min_ms
        self.retry_after_max_ms = retry_after_max_ms
        self.stale_after_s = stale_after_s
        self._accepted = 0  # events this process accepted, running total
        self._accepted_at_read = 0  # that total when the last read began
        self._read: GroupLag | None = None
        self._read_at = 0.0
        self._commits: deque[tuple[float, int]] = deque()  # (time, committed) of one group

    def reading_begins(self) -> int:
        """A mark to hand back with the reading: what was accepted before it began."""
        return self._accepted

    def observe(self, now: float, reading: GroupLag, mark: int) -> None:
        if self._read is not None and reading.group != self._read.group:
            self._commits.clear()  # another group's offsets say nothing of this one's pace
        self._read, self._read_at, self._accepted_at_read = reading, now, mark
        if reading.group is None:
            return
        if self._commits and reading.committed < self._commits[-1][1]:
            self._commits.clear()  # offsets went back (a reset group): start over
        self._commits.append((now, reading.committed))
        while self._commits and self._commits[0][0] < now - PACE_WINDOW_S:
            self._commits.popleft()

    def accepted(self, events: int) -> None:
        self._accepted += events

    def lag(self, now: float) -> int | None:
        """Events accepted and not yet memorized; None when no read is recent enough."""
        if self._read is None or now - self._read_at > self.stale_after_s:
            return None
        return self._read.lag + self._accepted - self._accepted_at_read

    def pace(self) -> float:
        """Events per second the group committed over the last ``PACE_WINDOW_S``."""
        if len(self._commits) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._commits[0], self._commits[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0

    def check(self, now: float) -> Refusal | None:
        """A refusal when the lag is past the bound (0: never), else None."""
        lag = self.lag(now)
        if self.max_lag <= 0 or lag is None or lag <= self.max_lag:
            return None
        pace = self.pace()
        # Until the lag is back under the bound at this pace; a stalled group: the longest.
        wait_ms = (lag - self.max_lag) / pace * 1000 if pace > 0 else self.retry_after_max_ms
        wait_ms = min(self.retry_after_max_ms, max(self.retry_after_min_ms, wait_ms))
        return Refusal(lag, self.max_lag, wait_ms)


class LagSource(Protocol):
    async def read(self) -> GroupLag: ...
    async def close(self) -> None: ...


class IngestGuard:
    """One per API: ``admit`` before publishing a request's events, ``accepted`` after."""

    def __init__(
        self,
        source: LagSource,
        rpc: RPCSettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.metrics = metrics
        self.clock = clock
        self.interval_s = rpc.ingest_lag_interval_s
        self.brake = IngestBrake(
            rpc.ingest_max_lag,
            retry_after_min_ms=rpc.admission_retry_after_min_ms,
            retry_after_max_ms=rpc.admission_retry_after_max_ms,
            stale_after_s=STALE_READS * rpc.ingest_lag_interval_s,
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def refresh(self) -> None:
        mark = self.brake.reading_begins()
        reading = await self.source.read()
        self.brake.observe(self.clock(), reading, mark)
        self._note()

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                await self.refresh()
                failures = 0
            except Exception as exc:
                failures += 1
                if failures == 1:  # once per outage, not every interval
                    log.warning("reading the ingest lag failed: %r", exc)
            await asyncio.sleep(self.interval_s)

    def lag(self) -> int | None:
        return self.brake.lag(self.clock())

    def admit(self, tenant: str) -> None:
        """Raise the 429 when the lag is past the bound; nothing of the request is sent."""
        refusal = self.brake.check(self.clock())
        if refusal is None:
            return
        self.metrics.ingest_refused.labels(tenant).inc()
        wait_ms = refusal.retry_after_ms
        raise HTTPException(
            429,
            f"ingest is behind: {refusal.lag} events accepted and not yet memorized (bound "
            f"{refusal.bound}); none of this request's events were accepted: send them again "
            f"after {wait_ms:.0f} ms",
            headers=retry_headers(wait_ms),
        )

    def accepted(self, events: int) -> None:
        self.brake.accepted(events)
        self._note()

    def _note(self) -> None:
        lag = self.lag()
        if lag is not None:
            self.metrics.ingest_lag.set(lag)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.source.close()
