"""The admission limiter step by step, on an explicit clock: who runs, who waits, who is
refused and why, and where the limit settles on a server whose throughput has a knee."""

from __future__ import annotations

import pytest

from memstream.rpc.admission import Admission, AdmissionParams, Ticket


def fixed(limit: int, queue_ratio: float = 0.5) -> AdmissionParams:
    return AdmissionParams(
        initial_limit=limit, min_limit=limit, max_limit=limit, queue_ratio=queue_ratio
    )


def test_the_default_never_refuses_eight_in_flight() -> None:
    admission = Admission(AdmissionParams(), now=0.0)
    tickets = [admission.offer("acme", 0.0)[0] for _ in range(8)]
    assert [t.state for t in tickets] == ["running"] * 8
    assert admission.queued == 0


def test_past_the_limit_a_short_queue_then_refusal_and_a_freed_slot_starts_the_queued() -> None:
    admission = Admission(fixed(2), now=0.0)  # queue of 1
    first, second, third, fourth = (admission.offer("acme", 0.0)[0] for _ in range(4))
    assert (first.state, second.state, third.state) == ("running", "running", "waiting")
    assert (fourth.state, fourth.reason) == ("shed", "overload")

    changed = admission.finish(first, 0.1)

    assert changed == [third]
    assert third.state == "running"
    assert third.started == 0.1
    assert admission.in_flight == 2


def test_a_passed_deadline_is_refused_on_arrival_and_dropped_from_the_queue() -> None:
    admission = Admission(fixed(1, queue_ratio=2), now=0.0)
    assert admission.offer("acme", 1.0, deadline=1.0)[0].reason == "deadline"
    running, _ = admission.offer("acme", 1.0)
    late, _ = admission.offer("acme", 1.0, deadline=1.5)
    patient, _ = admission.offer("acme", 1.0, deadline=9.0)

    changed = admission.finish(running, 2.0)  # the late one's deadline has passed

    assert (late.state, late.reason, late.started) == ("shed", "deadline", None)
    assert patient.state == "running"
    assert changed == [late, patient]


def test_abandoning_frees_a_slot_or_a_queue_place_without_a_latency_sample() -> None:
    admission = Admission(fixed(1, queue_ratio=2), now=0.0)
    running, _ = admission.offer("acme", 0.0)
    waiting, _ = admission.offer("acme", 0.0)
    other, _ = admission.offer("acme", 0.0)

    assert admission.abandon(waiting, 0.5) == []
    assert (waiting.state, admission.queued) == ("shed", 1)
    assert admission.abandon(running, 0.6) == [other]
    assert admission.controller.latency_s == 0.0  # nothing was measured


def test_one_tenants_flood_does_not_starve_another() -> None:
    admission = Admission(fixed(4), now=0.0)  # limit 4 + queue 2 = capacity 6
    flood = [admission.offer("flood", 0.0)[0] for _ in range(6)]
    assert [t.state for t in flood] == ["running"] * 4 + ["waiting"] * 2
    # Alone, the flooding tenant is refused as an overload (503).
    assert admission.offer("flood", 0.0)[0].reason == "overload"

    # Another tenant arrives: it takes the flood's newest queue place (refused, 429) ...
    quiet, changed = admission.offer("quiet", 0.0)
    assert quiet.state == "waiting"
    assert changed == [flood[5]]
    assert flood[5].reason == "tenant"
    # ... the flood, over its share of the capacity, is refused as a tenant ...
    assert admission.offer("flood", 0.0)[0].reason == "tenant"
    # ... and the next free slot goes to the tenant with none in flight, not the older wait.
    assert admission.finish(flood[0], 0.1) == [quiet]
    assert flood[4].state == "waiting"


def test_a_tenant_under_its_share_is_queued_when_the_limit_is_full() -> None:
    admission = Admission(fixed(4), now=0.0)
    for tenant in ("a", "a", "b", "b"):
        assert admission.offer(tenant, 0.0)[0].state == "running"
    assert admission.offer("a", 0.0)[0].state == "waiting"  # held 2: 2 * 2 tenants < 6
    assert admission.offer("a", 0.0)[0].reason == "tenant"  # held 3: 3 * 2 >= 6
    assert admission.offer("b", 0.0)[0].state == "waiting"


def test_retry_after_is_the_drain_time_within_bounds() -> None:
    params = AdmissionParams(retry_after_min_ms=100.0, retry_after_max_ms=1000.0)
    admission = Admission(params, now=0.0)
    assert admission.retry_after_ms() == 100.0  # nothing measured yet: the floor
    tickets = [admission.offer("acme", 0.0)[0] for _ in range(32)]
    for ticket in tickets[:16]:
        admission.finish(ticket, 2.0)  # 2 s each, 16 in flight at a limit of 32: 1 s
    assert admission.retry_after_ms() == 1000.0


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="min <= initial <= max"):
        AdmissionParams(initial_limit=4, min_limit=8)
    with pytest.raises(ValueError, match="queue_ratio"):
        AdmissionParams(queue_ratio=-1)


# --- the limit's adaptation ---------------------------------------------------------------


def throughput(in_flight: int, knee: int = 16) -> float:
    """Requests/s of a batching server: rising to the knee, then slowly falling (each
    request past it only adds queue and overhead), like the RPC's closed loops."""
    if in_flight <= knee:
        return 160.0 * in_flight / knee
    return 160.0 * (1.0 - 0.01 * (in_flight - knee))


def drive(admission: Admission, callers: int, completions: int) -> list[int]:
    """A closed loop of ``callers`` on the model server: each refused caller comes back as
    the next arrival; completions come at the model's rate for what is in flight. Returns
    the limit after each completion."""
    now = 0.0
    running: list[Ticket] = []
    limits: list[int] = []
    for _ in range(callers):
        ticket, changed = admission.offer("acme", now)
        running += [t for t in [ticket, *changed] if t.state == "running" and t not in running]
    for _ in range(completions):
        now += 1.0 / throughput(len(running))
        done = running.pop(0)
        started = admission.finish(done, now)
        running += started
        # The caller comes back at once; the callers refused earlier keep trying too.
        for _ in range(callers - len(running) - admission.queued):
            ticket, changed = admission.offer("acme", now)
            running += [t for t in [ticket, *changed] if t.state == "running"]
        limits.append(admission.limit)
    return limits


def test_the_limit_falls_to_the_knee_from_above() -> None:
    admission = Admission(AdmissionParams(initial_limit=32), now=0.0)
    limits = drive(admission, callers=64, completions=3000)
    settled = limits[-1000:]
    assert min(settled) >= 12
    assert max(settled) <= 20


def test_the_limit_rises_to_the_knee_from_below() -> None:
    params = AdmissionParams(initial_limit=8, min_limit=8)
    limits = drive(Admission(params, now=0.0), callers=64, completions=3000)
    assert limits[0] == 8
    assert min(limits[-1000:]) >= 12
    assert max(limits[-1000:]) <= 20


def test_a_load_under_the_limit_leaves_it_alone() -> None:
    admission = Admission(AdmissionParams(initial_limit=32), now=0.0)
    limits = drive(admission, callers=6, completions=500)
    assert set(limits) == {32}
