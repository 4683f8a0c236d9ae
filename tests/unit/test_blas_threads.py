"""memstream's processes run numpy's BLAS on one thread (``memstream.runtime.one_blas_thread``)."""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

from memstream.runtime import one_blas_thread


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_blas_thread_limits_every_loaded_blas_to_one_thread() -> None:
    assert blas_threads(), "numpy's BLAS is loaded (memstream.runtime imports numpy)"
    with threadpool_limits(limits=None, user_api="blas"):  # puts back what the test changes
        one_blas_thread()
        assert blas_threads() == [1] * len(blas_threads())
