"""The progress scheduler: faults fire at shares of the turns stored, in order, and say so."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from reliability.progress import Action, Fault, Span, Step, due, fire, plan


def test_a_plan_fires_by_turn_count_and_ends_a_window_before_the_next_begins() -> None:
    steps = plan([(0.25, None), (0.3, 0.6), (0.6, 0.8)], 1000)
    assert steps == [
        Step(250, 0, ending=False),
        Step(300, 1, ending=False),
        Step(600, 1, ending=True),  # before the window that begins at the same count
        Step(600, 2, ending=False),
        Step(800, 2, ending=True),
    ]


def test_a_zero_length_window_begins_before_it_ends() -> None:
    assert plan([(0.5, 0.5)], 10) == [Step(5, 0, ending=False), Step(5, 0, ending=True)]


def test_due_fires_the_steps_reached_in_order_never_a_later_one_first() -> None:
    steps = plan([(0.2, 0.5), (0.9, None)], 100)
    assert due(steps, 0, 19) == 0
    assert due(steps, 0, 60) == 2  # the begin and the end of the window, both reached
    assert due(steps, 2, 60) == 2
    assert due(steps, 2, -1) == 2  # a store that cannot answer counts nothing
    assert due(steps, 2, 100) == 3


async def _noop(_: object) -> str:
    return "done"


@pytest.mark.parametrize(
    ("start", "until", "end"), [(-0.1, None, None), (0.5, 0.4, _noop), (0.2, 0.4, None)]
)
def test_a_fault_outside_the_stream_or_half_a_window_is_refused(
    start: float, until: float | None, end: Action | None
) -> None:
    with pytest.raises(ValueError, match="bad: "):
        Fault("bad", start, _noop, until, end)


def test_labels_come_from_the_counts_reached_not_from_the_plan() -> None:
    window = Span("Qdrant unreachable", 1500, 452, 903, 12.44, window=True)
    assert window.label == "Qdrant unreachable from 30% to 60% of turns stored (12.4 s)"
    assert window.counts == "452 → 903 of 1500 turns"
    point = Span("SIGKILL stream, restarted", 1500, 1500, 1500, 8.9, late=True)
    assert point.label == (
        "SIGKILL stream, restarted at 100% of turns stored (8.9 s), stream stalled before it"
    )


async def test_fire_runs_each_fault_at_its_share_and_records_where_it_ran() -> None:
    stored = 0
    calls: list[tuple[str, int]] = []

    async def count() -> int:
        nonlocal stored
        stored += 10  # the stream moves on between two polls
        return stored

    def action(name: str) -> Callable[[object], Awaitable[str]]:
        async def run(_: object) -> str:
            calls.append((name, stored))
            return name

        return run

    spans = await fire(
        [
            Fault("kill", 0.5, action("kill")),
            Fault("outage", 0.2, action("down"), 0.4, action("up")),
        ],
        None,
        100,
        count,
        deadline=float("inf"),
        poll_s=0,
    )
    assert [name for name, _ in calls] == ["down", "up", "kill"]
    assert all(at >= want for (_, at), want in zip(calls, (20, 40, 50), strict=True))
    outage, kill = spans  # in the order they began
    assert (outage.what, outage.started_at, outage.window) == ("outage", 20, True)
    assert outage.ended_at is not None
    assert outage.ended_at >= 40
    assert outage.lines == ("down", "up")
    assert kill.started_at >= 50
    assert (kill.window, kill.late) == (False, False)


async def test_past_the_deadline_every_window_still_closes() -> None:
    ended: list[str] = []

    async def stuck() -> int:
        return 3  # the stream stalled at 3 of 100 turns

    async def up(_: object) -> str:
        ended.append("up")
        return "up"

    spans = await fire(
        [Fault("frozen", 0.2, _noop, 0.4, up)], None, 100, stuck, deadline=0.0, poll_s=0
    )
    assert ended == ["up"]
    assert spans[0].late
    assert spans[0].ended_at == 3
    assert spans[0].label.endswith("stream stalled before it")
