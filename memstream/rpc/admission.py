"""Admission control for the expensive RPC: admit what the process can serve, shed the rest.

Pure bookkeeping -- no asyncio, no HTTP, no clock of its own (every call takes ``now``) --
so that it is tested step by step; ``rpc.gate`` puts it in front of ``POST /v1/retrieve``.

- **The limit** on retrievals in flight follows Little's law rather than a latency
  threshold. Retrieval micro-batches its query encodes, so latency grows with concurrency
  long before throughput stops growing (BENCHMARKS.md, 10k/user: 1 caller p50 16 ms at
  62/s, 16 callers p50 102 ms at 154/s): a limiter that treats a rise over the unloaded
  latency as queueing (Vegas, gradient) would cap concurrency far below the throughput
  knee. No limit at all is worse: 64 callers got p99 2.9 s and 97/s. So every ``window``
  completions that the limit constrained, the limit takes a hill-climbing step on the
  delivered rate, biased down: it keeps going down while the rate stays within
  ``tolerance`` of the best of the last ``history`` windows (same throughput, less
  latency), and keeps going up only while that gains throughput. The limit settles at
  the smallest concurrency that keeps the best throughput, the knee, and follows it
  when the machine gets faster or slower. Windows the limit did not constrain (fewer
  callers than the limit) change nothing: they say nothing about capacity.
- **A short queue** (``queue_ratio`` x the limit) absorbs bursts; beyond it a request is
  refused at once (``overload``), so a refusal costs microseconds, not a wait.
- **Per-tenant fairness**: while the limit is contended, a tenant holding (in flight plus
  queued) its share of the capacity (limit + queue, split evenly among the tenants that
  hold any) is refused (``tenant``); a tenant under its share may push a queued request of
  a tenant over its share out of a full queue; a freed slot goes to the queued tenant with
  the fewest in flight. One tenant's flood cannot starve another.
- **Deadlines**: a request whose deadline has passed, on arrival or while queued, is
  dropped (``deadline``), never started.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

ShedReason = Literal["overload", "tenant", "deadline"]
SHED_REASONS: tuple[ShedReason, ...] = ("overload", "tenant", "deadline")
State = Literal["waiting", "running", "done", "shed"]


@dataclass(frozen=True)
class AdmissionParams:
    """The limiter's knobs (``rpc.admission_*`` settings). ``min_limit`` is what is never
    refused: the default, 8, covers the benchmarks' and the tests' 4-8 requests in flight."""

    initial_limit: int = 16
    min_limit: int = 8
    max_limit: int = 128
    queue_ratio: float = 0.5  # queued requests allowed, per request of the limit
    window: int = 40  # completions per adaptation step
    history: int = 20  # steps over which the best throughput is remembered
    tolerance: float = 0.07  # a rate within this share of the best counts as the best
    step_ratio: float = 0.1  # a step moves the limit by this share of it (at least 1)
    retry_after_min_ms: float = 1000.0
    retry_after_max_ms: float = 5_000.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("admission limits need 1 <= min <= initial <= max")
        if self.queue_ratio < 0 or self.window < 1 or self.history < 1:
            raise ValueError("admission queue_ratio >= 0, window >= 1 and history >= 1")
        if not 0 <= self.tolerance < 1 or not 0 < self.step_ratio < 1:
            raise ValueError("admission tolerance in [0, 1), step_ratio in (0, 1)")
        if not 0 <= self.retry_after_min_ms <= self.retry_after_max_ms:
            raise ValueError("admission retry-after needs 0 <= min <= max")


class LimitController:
    """The concurrency limit, stepped by the throughput of the windows it constrained."""

    def __init__(self, params: AdmissionParams, now: float) -> None:
        self.params = params
        self.limit = params.initial_limit
        self.latency_s = 0.0  # moving average of service times, for Retry-After
        self._best: deque[float] = deque(maxlen=params.history)
        self._since = now
        self._done = 0
        self._pressed = 0  # arrivals of this window that found the limit full
        self._samples = 0
        self._direction = -1  # the last step's: -1 fewer in flight, +1 more
        self._previous = 0.0  # the last constrained window's rate

    def pressed(self) -> None:
        """An arrival found every slot taken: the limit constrains this window."""
        self._pressed += 1

    def sample(self, now: float, latency_s: float) -> None:
        """One admitted request finished after ``latency_s`` of service."""
        self._samples += 1
        self.latency_s += (latency_s - self.latency_s) / min(self._samples, 10)
        self._done += 1
        if self._done < self.params.window:
            return
        elapsed = now - self._since
        # Constrained: at least a quarter as many arrivals found it full as finished.
        if elapsed > 0 and 4 * self._pressed >= self._done:
            self._step(self._done / elapsed)
        self._since, self._done, self._pressed = now, 0, 0

    def _step(self, rate: float) -> None:
        """Hill-climb with a bias to fewer in flight: going down continues while the rate
        stays within ``tolerance`` of the best; going up continues only while it gains
        more than half that over the last window. Blocked at a bound, it turns round (so
        a limit that starts at its floor still finds a knee above it)."""
        p = self.params
        self._best.append(rate)
        if self._direction < 0:
            keep = rate >= (1.0 - p.tolerance) * max(self._best)
        else:
            keep = rate > (1.0 + p.tolerance / 2) * self._previous
        direction = self._direction if keep else -self._direction
        step = max(1, int(self.limit * p.step_ratio))
        moved = min(p.max_limit, max(p.min_limit, self.limit + direction * step))
        if moved == self.limit:
            direction = -direction
            moved = min(p.max_limit, max(p.min_limit, self.limit + direction * step))
        self.limit, self._direction, self._previous = moved, direction, rate


@dataclass(eq=False)
class Ticket:
    """One request's passage: waiting -> running -> done, or shed (with its reason)."""

    tenant: str
    arrived: float
    deadline: float | None
    seq: int
    state: State = "waiting"
    started: float | None = None
    reason: ShedReason | None = None


@dataclass
class Admission:
    """In-flight and queued requests per tenant under one adaptive limit.

    Each call returns the tickets whose state it changed besides the caller's own (queued
    ones started or shed), so the glue can wake their waiters."""

    params: AdmissionParams
    now: float
    controller: LimitController = field(init=False)
    in_flight: int = 0
    _running: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, deque[Ticket]] = field(default_factory=dict)
    _queued: int = 0
    _seq: int = 0

    def __post_init__(self) -> None:
        self.controller = LimitController(self.params, self.now)

    @property
    def limit(self) -> int:
        return self.controller.limit

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def queue_cap(self) -> int:
        return int(self.limit * self.params.queue_ratio)

    def held(self, tenant: str) -> int:
        """The tenant's requests in flight and queued."""
        return self._running.get(tenant, 0) + len(self._waiting.get(tenant, ()))

    def offer(
        self, tenant: str, now: float, deadline: float | None = None
    ) -> tuple[Ticket, list[Ticket]]:
        """A new request: its ticket is running, waiting (queued) or shed."""
        self._seq += 1
        ticket = Ticket(tenant, now, deadline, self._seq)
        if deadline is not None and deadline <= now:
            return self._shed(ticket, "deadline"), []
        if self.in_flight >= self.limit:
            self.controller.pressed()
        if self.in_flight < self.limit and not self._queued:
            self._start(ticket, now)
            return ticket, []
        changed: list[Ticket] = []
        tenants = self._active() | {tenant}
        capacity = self.limit + self.queue_cap
        if len(tenants) > 1 and self.held(tenant) * len(tenants) >= capacity:
            return self._shed(ticket, "tenant"), []
        if self._queued >= self.queue_cap:
            victim = self._over_share_victim(tenant, len(tenants), capacity)
            if victim is None:
                return self._shed(ticket, "overload"), []
            self._remove(victim)
            changed.append(self._shed(victim, "tenant"))
        self._waiting.setdefault(tenant, deque()).append(ticket)
        self._queued += 1
        changed += [t for t in self._pump(now) if t is not ticket]
        return ticket, changed

    def finish(self, ticket: Ticket, now: float) -> list[Ticket]:
        """A running request is done: its service time feeds the limit; queued ones start."""
        assert ticket.started is not None, ticket.state
        self._release(ticket)
        self.controller.sample(now, now - ticket.started)
        return self._pump(now)

    def abandon(self, ticket: Ticket, now: float, reason: ShedReason = "deadline") -> list[Ticket]:
        """The request went away (its deadline passed, its caller left) before it was done:
        a queued one leaves the queue (shed), a running one frees its slot (no sample)."""
        if ticket.state == "waiting":
            self._remove(ticket)
            self._shed(ticket, reason)
        elif ticket.state == "running":
            self._release(ticket)
        return self._pump(now)

    def retry_after_ms(self) -> float:
        """How long a refused caller should wait: the time the work ahead of it takes to
        drain at the current limit, within the configured bounds."""
        p = self.params
        drain_ms = 1000 * self.controller.latency_s * (self.in_flight + self._queued) / self.limit
        return min(p.retry_after_max_ms, max(p.retry_after_min_ms, drain_ms))

    # --- internals -----------------------------------------------------------------------

    def _active(self) -> set[str]:
        return set(self._running) | set(self._waiting)  # both drop a tenant once it is empty

    def _over_share_victim(self, tenant: str, tenants: int, capacity: int) -> Ticket | None:
        """The newest queued request of the tenant furthest over its share, if the
        arriving tenant is under its own."""
        if tenants < 2 or self.held(tenant) * tenants >= capacity:
            return None
        over = [t for t, q in self._waiting.items() if q and self.held(t) * tenants > capacity]
        if not over:
            return None
        worst = max(over, key=lambda t: (self.held(t), t))
        return self._waiting[worst][-1]

    def _pump(self, now: float) -> list[Ticket]:
        """Start queued requests while slots are free: the tenant with the fewest in flight
        first, oldest first within a tenant; drop those whose deadline has passed."""
        changed: list[Ticket] = []
        while self._queued and self.in_flight < self.limit:
            tenant = min(
                (t for t, q in self._waiting.items() if q),
                key=lambda t: (self._running.get(t, 0), self._waiting[t][0].seq),
            )
            ticket = self._waiting[tenant].popleft()
            self._queued -= 1
            if not self._waiting[tenant]:
                del self._waiting[tenant]
            if ticket.deadline is not None and ticket.deadline <= now:
                changed.append(self._shed(ticket, "deadline"))
                continue
            self._start(ticket, now)
            changed.append(ticket)
        return changed

    def _start(self, ticket: Ticket, now: float) -> None:
        ticket.state, ticket.started = "running", now
        self.in_flight += 1
        self._running[ticket.tenant] = self._running.get(ticket.tenant, 0) + 1

    def _release(self, ticket: Ticket) -> None:
        ticket.state = "done"
        self.in_flight -= 1
        self._running[ticket.tenant] -= 1
        if not self._running[ticket.tenant]:
            del self._running[ticket.tenant]

    def _remove(self, ticket: Ticket) -> None:
        queue = self._waiting[ticket.tenant]
        queue.remove(ticket)
        self._queued -= 1
        if not queue:
            del self._waiting[ticket.tenant]

    @staticmethod
    def _shed(ticket: Ticket, reason: ShedReason) -> Ticket:
        ticket.state, ticket.reason = "shed", reason
        return ticket
