"""memstream's processes run numpy's BLAS on one thread and a short GIL switch interval
(``memstream.runtime.tune_process_threads``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from memstream.runtime import GIL_SWITCH_INTERVAL_S, tune_process_threads


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.fixture
def tuned() -> Iterator[None]:
    """``tune_process_threads()`` for one test; what it changed is put back after."""
    interval = sys.getswitchinterval()
    with threadpool_limits(limits=None, user_api="blas"):
        tune_process_threads()
        yield
    sys.setswitchinterval(interval)


def test_every_loaded_blas_runs_on_one_thread(tuned: None) -> None:
    assert blas_threads(), "numpy's BLAS is loaded (memstream.runtime imports numpy)"
    assert blas_threads() == [1] * len(blas_threads())


def test_the_gil_switch_interval_is_the_short_one(tuned: None) -> None:
    assert GIL_SWITCH_INTERVAL_S < 0.005  # shorter than CPython's default
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
