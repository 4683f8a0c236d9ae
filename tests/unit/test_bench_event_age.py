"""The ingest benchmark's breakdown of event -> retrievable: quantiles read back from the
stages' ``memstream_event_age_seconds`` buckets between two scrapes, as PromQL reads them."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from bench.ingest import age_deltas, histogram_quantile
from memstream.launch import Samples
from memstream.metrics import Metrics


def test_a_quantile_is_linear_within_its_bucket() -> None:
    buckets = [(0.01, 0.0), (0.1, 50.0), (1.0, 100.0), (math.inf, 100.0)]
    assert math.isclose(histogram_quantile(buckets, 0.5), 0.1)
    assert math.isclose(histogram_quantile(buckets, 0.25), 0.055)
    assert math.isclose(histogram_quantile(buckets, 0.95), 0.91)
    assert math.isnan(histogram_quantile([(0.1, 0.0), (math.inf, 0.0)], 0.5))
    # Past the last finite bound: its bound, as PromQL answers.
    assert histogram_quantile([(0.1, 1.0), (math.inf, 4.0)], 0.9) == 0.1


def test_the_hops_are_what_was_observed_between_the_scrapes() -> None:
    metrics = Metrics(CollectorRegistry())

    def scrape() -> Samples:
        return Samples(generate_latest(metrics.registry).decode())

    metrics.event_age.labels("memorize", "done").observe(5.0)  # before: not counted
    before = scrape()
    for age in (0.02, 0.03, 0.04, 0.2):
        metrics.event_age.labels("memorize", "done").observe(age)
    metrics.event_age.labels("encode", "taken").observe(0.004)
    hops = age_deltas(before, scrape())
    done = hops["memorize done"]
    assert done["n"] == 4
    assert math.isclose(done["mean"], 72.5)
    assert 25.0 <= done["p50"] <= 50.0  # in the (25, 50] ms bucket
    assert 100.0 <= done["p95"] <= 250.0
    assert hops["encode taken"]["n"] == 1
    assert math.isnan(hops["encode done"]["mean"])
