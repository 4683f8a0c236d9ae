"""Pure helpers of the operations code: lag arithmetic, histogram quantiles, JSON log lines."""

from __future__ import annotations

import json
import logging
import math

from faust.types import TP

from memstream.logs import JsonFormatter, event_id_of
from memstream.ops.top import quantile
from memstream.sampling import lag_by_partition


def test_lag_counts_from_the_commit_or_from_the_start() -> None:
    a, b = TP("memstream.events", 0), TP("memstream.events", 1)
    lag = lag_by_partition({a: 120, b: 40}, {a: 100, b: None}, {b: 10})
    assert lag == {a: 20, b: 30}
    assert lag_by_partition({a: 5}, {a: 9}, {}) == {a: 0}  # never negative


def test_quantile_interpolates_like_promql() -> None:
    buckets = {0.1: 50.0, 0.2: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == 0.1
    assert math.isclose(quantile(0.75, buckets), 0.15)
    assert math.isnan(quantile(0.5, {0.1: 0.0, math.inf: 0.0}))


def test_json_log_line_carries_extras_and_exception() -> None:
    record = logging.LogRecord("memstream.x", logging.WARNING, __file__, 1, "hi %s", ("you",), None)
    record.event_id = "e-1"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "hi you"
    assert entry["event_id"] == "e-1"
    assert entry["level"] == "warning"
    assert "ValueError: boom" in entry["exc"]


def test_event_id_of_messages() -> None:
    assert event_id_of(b'{"event_id": "a"}') == "a"
    assert event_id_of(b'{"event": {"event_id": "b"}}') == "b"
    assert event_id_of(b"not json") is None
    assert event_id_of(b"[1]") is None
