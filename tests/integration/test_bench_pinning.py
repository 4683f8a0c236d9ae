"""The scale-out benchmark pins each worker to its core: every thread it starts stays there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.scaleout import PINNED, cores_for
from bench.services import Memstream, services

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_a_pinned_worker_runs_every_thread_on_its_core(tmp_path: Path) -> None:
    (core,) = cores_for(1)
    with services(tmp_path / "services") as svc:
        worker = Memstream("worker", svc, tmp_path / "worker", overrides=PINNED, cpus=core)
        worker.start()  # ready() refuses a process whose affinity is not ``core``
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{worker.pid}/task")]
            # faust's consumer thread, onnxruntime's runner, the executor: all started by now
            assert len(threads) > 1
            assert {frozenset(os.sched_getaffinity(t)) for t in threads} == {frozenset(core)}
            assert worker.metrics().get("memstream_events_total") == 0  # it serves /metrics
        finally:
            worker.stop()
