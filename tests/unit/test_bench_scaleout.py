"""The scale-out benchmark's pure parts: which core each process gets, its row, its reading."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.plotting import scaleout_chart
from bench.scaleout import TARGET_RATIO, cores_for, markdown, median_pair, ratio, scale_rows


def run(
    workers: int, events_per_s: float, per_worker: list[float], round_: int = 0
) -> dict[str, Any]:
    events = int(sum(per_worker))
    elapsed = events / events_per_s
    cpu = [n * 0.006 for n in per_worker]  # 6 CPU ms per event
    return {
        "workers": workers,
        "cores": [[k] for k in range(workers)],
        "encoder_threads": 1,
        "events": events,
        "elapsed_s": elapsed,
        "events_per_s": events_per_s,
        "cpu_s": cpu,
        "cores_busy": [c / elapsed for c in cpu],
        "thread_cpu_s": [[c * 0.4, c * 0.45, c * 0.1, c * 0.05] for c in cpu],
        "broker_cpu_s": 1.5,
        "valkey_cpu_s": 0.2,
        "driver_cpu_s": 0.3,
        "per_worker": per_worker,
        "turns_in_redis": 954,
        "machine_busy": 0.9,
        "others_cores": 0.05,
        "round": round_,
    }


RUNS = [run(1, 160.0, [3000.0]), run(2, 272.0, [1380.0, 1620.0])]
# Three rounds in the order they ran: ratios 1.5, 2.0 and 1.7; the median is round 3's.
ROUNDS = [
    run(1, 200.0, [3000.0], 0),
    run(2, 300.0, [1500.0, 1500.0], 0),
    run(1, 150.0, [3000.0], 1),
    run(2, 300.0, [1500.0, 1500.0], 1),
    *(run(1, 160.0, [3000.0], 2), run(2, 272.0, [1380.0, 1620.0], 2)),
]


def test_each_process_gets_its_own_usable_core() -> None:
    usable = sorted(os.sched_getaffinity(0))
    assert cores_for(1) == [[usable[0]]]
    if len(usable) >= 2:
        assert cores_for(2) == [[usable[0]], [usable[1]]]


def test_more_processes_than_cores_share_them_visibly() -> None:
    usable = sorted(os.sched_getaffinity(0))
    cores = cores_for(len(usable) + 1)
    assert cores[-1] == [usable[0]]  # wraps around rather than leaving a process unpinned


def test_headline_row_is_two_processes_over_one() -> None:
    (row,) = scale_rows(RUNS)
    assert row.figure == "scale-out events/s, 2 processes / 1"
    assert row.ratio == pytest.approx(272.0 / 160.0)
    assert row.target == f">= {TARGET_RATIO}"
    assert "pinned" in row.reference_name
    assert scale_rows(RUNS[:1]) == []  # one run alone has no ratio


def test_the_headline_is_the_round_with_the_median_ratio() -> None:
    assert median_pair(ROUNDS) == (ROUNDS[4], ROUNDS[5])
    assert ratio(ROUNDS) == pytest.approx(1.7)
    (row,) = scale_rows(ROUNDS)
    assert (row.memstream, row.reference) == (272.0, 160.0)
    assert "median of 3 rounds" in row.reference_name
    text = markdown(ROUNDS)
    assert "the median of 3 rounds (1.50×, 2.00×, 1.70×;" in text
    assert "Reading round 3:" in text
    assert text.count("\n| 2 | 2 | 0 + 1 |") == 1  # every run has its row, with its round
    # Even counts take the lower middle pair; a lone run has no pair.
    assert median_pair(ROUNDS[:4]) == (ROUNDS[0], ROUNDS[1])
    assert median_pair(ROUNDS[:1]) is None


def test_reading_names_the_cores_the_split_and_what_shares_them() -> None:
    text = markdown(RUNS)
    assert f"**{ratio(RUNS):.2f}×**" in text
    assert "| 1 | 2 | 0 + 1 | 3000 |" in text  # round 1's two-process run, on cores 0 and 1
    assert "54% of the events" in text  # 1620 of 3000: the busier process's share
    assert "at most 1.85×" in text  # 3000 / 1620
    assert "not pinned" in text  # the broker and Valkey share the workers' cores
    assert "8.10 s in its busiest thread after the main one" in text  # 45% of 18 s
    assert "(the encoder's runner, where the one-thread model runs: 45% of its CPU)" in text
    assert "| 7.20, 8.10, 1.80 |" in text  # the 1-process run's threads: main first
    assert markdown(RUNS[:1]) == ""


def test_the_plot_labels_each_run_with_its_cores(tmp_path: Path) -> None:
    path = scaleout_chart(tmp_path / "scaleout.png", RUNS, TARGET_RATIO, "scale-out")
    assert path.stat().st_size > 0
