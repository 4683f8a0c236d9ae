"""The retrieval benchmark's open-loop schedule, its one-process reference server and its driver."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import test_utils, web

from bench.retrieval_load import Driver, Run, poisson_arrivals, serve_open_loop
from memstream.settings import DEMO_API_KEY


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


def test_the_driver_waits_out_refusals_and_counts_answers_by_kind() -> None:
    """Against a small local server: a refusal's latency is kept apart and its Retry-After-Ms
    (jittered up by at most half) is the caller's wait; an answer's took_ms is kept; a 500,
    an answer without took_ms and a server that is gone are errors by kind, not raised.
    The requests carry the API key and share one kept-alive connection."""
    answers = [
        (503, {"detail": "busy"}, {"Retry-After-Ms": "250"}),
        (200, {"took_ms": 3.5}, {}),
        (500, {"detail": "boom"}, {}),
        (200, {"results": []}, {}),
    ]
    seen: list[tuple[str, dict[str, object]]] = []
    peers: set[object] = set()

    async def retrieve(request: web.Request) -> web.Response:
        seen.append((request.headers["Authorization"], await request.json()))
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        status, body, headers = answers[len(seen) - 1]
        return web.json_response(body, status=status, headers=headers)

    async def main() -> tuple[Run, list[float]]:
        app = web.Application()
        app.router.add_post("/v1/retrieve", retrieve)
        server = test_utils.TestServer(app, host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        run, waits = Run("4 answers", "closed", 1), []
        target = cast(Any, SimpleNamespace(url=url))
        async with Driver(target, "u-1", iter(())) as driver:
            for n in range(len(answers)):
                waits.append(await driver.one(run, f"q{n}", time.perf_counter()))
        await server.close()  # nothing listens there now
        async with Driver(target, "u-1", iter(())) as driver:
            waits.append(await driver.one(run, "q4", time.perf_counter()))
        return run, waits

    run, waits = asyncio.run(main())
    assert 0.25 <= waits[0] <= 0.375
    assert waits[1:] == [0.0] * 4
    assert len(run.shed_ms) == 1
    assert run.shed_kinds == {"HTTP 503": 1}
    assert run.took_ms == [3.5]
    assert len(run.latencies_ms) == 1
    assert run.error_kinds == {"HTTP 500": 1, "KeyError": 1, "ClientConnectorError": 1}
    assert [body["query"] for _, body in seen] == ["q0", "q1", "q2", "q3"]
    assert {key for key, _ in seen} == {f"Bearer {DEMO_API_KEY}"}
    assert len(peers) == 1  # one connection, kept alive
