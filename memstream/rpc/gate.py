"""``rpc.admission`` in front of a route: waiting, HTTP refusals, metrics.

A refused request is answered at once, before any of its work: 503 (``overload``) or 429
(``tenant``) with ``Retry-After`` (whole seconds, as HTTP defines it) and ``Retry-After-Ms``
(the precise hint, which ``memstream.client`` prefers), or 504 when its deadline passed first.
The deadline is the caller's ``X-Request-Deadline-Ms`` header: a budget in milliseconds
from when the server reads the request (relative, so no clock sync is needed); a queued
request is answered 504 when its budget runs out, without being started.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable

from fastapi import HTTPException

from memstream.metrics import Metrics
from memstream.rpc.admission import Admission, AdmissionParams, ShedReason, Ticket
from memstream.settings import RPCSettings

DEADLINE_HEADER = "X-Request-Deadline-Ms"
RETRY_AFTER_MS_HEADER = "Retry-After-Ms"
STATUS: dict[ShedReason, int] = {"overload": 503, "tenant": 429, "deadline": 504}


def retry_headers(wait_ms: float) -> dict[str, str]:
    """How long a refused caller should wait: ``Retry-After`` in whole seconds (at least 1,
    as HTTP defines it) and ``Retry-After-Ms`` to the millisecond."""
    return {
        "Retry-After": str(max(1, math.ceil(wait_ms / 1000))),
        RETRY_AFTER_MS_HEADER: str(round(wait_ms)),
    }


def params_of(rpc: RPCSettings) -> AdmissionParams:
    return AdmissionParams(
        initial_limit=rpc.admission_initial_limit,
        min_limit=rpc.admission_min_limit,
        max_limit=rpc.admission_max_limit,
        queue_ratio=rpc.admission_queue_ratio,
        retry_after_min_ms=rpc.admission_retry_after_min_ms,
        retry_after_max_ms=rpc.admission_retry_after_max_ms,
    )


class Gate:
    """One per API: ``async with gate.slot(tenant, budget_ms):`` around the work."""

    def __init__(
        self,
        params: AdmissionParams,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        self.admission = Admission(params, clock())
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        metrics.concurrency_limit.set(self.admission.limit)

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, budget_ms: float | None) -> AsyncIterator[None]:
        now = self.clock()
        deadline = None if budget_ms is None else now + budget_ms / 1000
        ticket, changed = self.admission.offer(tenant, now, deadline)
        self._wake(changed)
        if ticket.state == "waiting":
            await self._wait(ticket, deadline)
        if ticket.state != "running":  # shed on arrival or while queued
            self._refuse(ticket)
        assert ticket.started is not None
        self.metrics.admitted.inc()
        self.metrics.queue_time.observe(ticket.started - ticket.arrived)
        self._note()
        done = False
        try:
            yield
            done = True
        finally:
            now = self.clock()
            if done:
                self._wake(self.admission.finish(ticket, now))
            else:  # failed or cancelled: free the slot, but a failure says nothing of speed
                self._wake(self.admission.abandon(ticket, now))
            self._note()

    async def _wait(self, ticket: Ticket, deadline: float | None) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        timeout = None if deadline is None else max(0.0, deadline - self.clock())
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            # Its deadline came first; if it was started in the same loop turn, it goes too.
            self._wake(self.admission.abandon(ticket, self.clock(), "deadline"))
            ticket.state, ticket.reason = "shed", "deadline"
        except asyncio.CancelledError:  # the caller went away while queued
            self._wake(self.admission.abandon(ticket, self.clock(), "deadline"))
            raise
        finally:
            self._waiters.pop(ticket, None)

    def _wake(self, changed: list[Ticket]) -> None:
        for ticket in changed:
            future = self._waiters.get(ticket)
            if future is not None and not future.done():
                future.set_result(None)

    def _refuse(self, ticket: Ticket) -> None:
        reason = ticket.reason or "overload"
        self.metrics.shed.labels(reason, ticket.tenant).inc()
        if reason == "deadline":
            raise HTTPException(
                504,
                f"the request's deadline ({DEADLINE_HEADER}) passed before its work started; "
                "it was not done",
            )
        wait_ms = self.admission.retry_after_ms()
        headers = retry_headers(wait_ms)
        if reason == "tenant":
            detail = (
                f"tenant {ticket.tenant!r} holds its fair share of the retrieval capacity; "
                f"retry after {wait_ms:.0f} ms"
            )
        else:
            detail = (
                f"overloaded: {self.admission.in_flight} retrievals in flight (limit "
                f"{self.admission.limit}) and {self.admission.queued} queued; retry after "
                f"{wait_ms:.0f} ms"
            )
        raise HTTPException(STATUS[reason], detail, headers=headers)

    def _note(self) -> None:
        self.metrics.in_flight.set(self.admission.in_flight)
        self.metrics.concurrency_limit.set(self.admission.limit)
