"""The retrieval benchmark's open-loop schedule and its one-process reference server."""

from __future__ import annotations

import time

from bench.retrieval_load import Run, poisson_arrivals, serve_open_loop


def test_poisson_arrivals_are_one_schedule_for_a_seed() -> None:
    first = poisson_arrivals(40.0, 5.0, seed=7)
    assert first == poisson_arrivals(40.0, 5.0, seed=7)  # memstream and its reference
    assert first != poisson_arrivals(40.0, 5.0, seed=8)
    assert first == sorted(first)
    assert first[0] > 0
    assert first[-1] <= 5.0
    assert 120 < len(first) < 280  # 200 expected; P(outside) is far below 1e-6


def test_reference_that_falls_behind_queues_and_counts_the_wait() -> None:
    service_s = 0.02
    served: list[str] = []

    def handle(text: str) -> None:
        served.append(text)
        time.sleep(service_s)

    # Four queries at once, then one long after: a FIFO with one worker.
    run = serve_open_loop("ref", 4.0, [0.0, 0.0, 0.0, 0.0, 0.2], list("abcde"), handle)

    assert served == list("abcde")
    # The k-th of the burst waits for the k before it: latency from its scheduled arrival.
    for k in range(4):
        assert run.latencies_ms[k] >= (k + 1) * service_s * 1000
        assert run.took_ms[k] >= service_s * 1000
    assert run.latencies_ms[3] > run.took_ms[3] + 2 * service_s * 1000
    # The late one finds the queue empty: its latency is its service time.
    assert run.latencies_ms[4] - run.took_ms[4] < run.latencies_ms[3] - run.took_ms[3]
    assert run.errors == 0


def test_a_run_reports_its_errors_by_kind() -> None:
    run = Run("64 callers", "closed", 64)
    run.fail("HTTP 500")
    run.fail("ReadTimeout")
    run.fail("HTTP 500")
    report = run.report()
    assert report["errors"] == 3
    assert report["error_kinds"] == {"HTTP 500": 2, "ReadTimeout": 1}
