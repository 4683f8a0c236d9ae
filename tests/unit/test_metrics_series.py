"""Series an SRE's queries rely on exist before the first event; internal topics show no lag.

- every labelled series with known label values is exported at zero from the start
  (``rate()`` and the dead-letter alert see the first event as a rise, not a new series);
- the known stage names are the code's own stage constants;
- batch-size percentiles of single-event batches read 1, not 0.5;
- faust's ``-__assignor-__leader`` topic (and Kafka's ``__…``) stay out of the lag gauge;
- ``memstream top`` heads each frame with roles, uptime and time, and shows HTTP rates;
- the encoder's running totals are exported, copied at each scrape.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from faust.types import TP
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memstream.metrics import BATCH_BUCKETS, DLQ_REASONS, Metrics, StageSeries
from memstream.ops.top import Scrape, heading, http_rates, quantile, render
from memstream.rpc.server import ApiDeps, create_api
from memstream.sampling import LagSampler, is_internal_topic
from memstream.settings import KafkaSettings, RPCSettings
from memstream.stores.encoder import EncoderStats
from memstream.streams import control, encode, memorize
from memstream.wiring import STAGES
from memstream.workers import archive, consolidate, reminders, strength


def samples(metrics: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


def series_of(role: str) -> list[StageSeries]:
    """What ``wiring.ServiceBuilder.build_app`` declares for a process playing ``role``."""
    return [series for stage in STAGES if stage.role == role for series in stage.series]


def test_dead_letter_and_event_series_are_zero_before_any_event() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.declare_roles(
        ["process", "consolidate"], series_of("process") + series_of("consolidate")
    )
    found = samples(metrics)
    dlq = found["memstream_dlq_total"]
    dead_lettering = {
        s.name for s in series_of("process") + series_of("consolidate") if s.dead_letters
    }
    assert dead_lettering == {"encode", "memorize", "control", "consolidate", "archive", "feedback"}
    for stage in dead_lettering:
        for reason in DLQ_REASONS:
            assert dlq[(("reason", reason), ("stage", stage))] == 0.0
    assert found["memstream_batch_size_count"][(("stage", "encode"),)] == 0.0
    events = found["memstream_events_total"]
    assert events[(("outcome", "ok"), ("stage", "encode"))] == 0.0
    assert events[(("outcome", "duplicate"), ("stage", "memorize"))] == 0.0
    assert found["memstream_triggers_total"][(("reason", "entity"),)] == 0.0
    assert found["memstream_consolidations_total"][(("outcome", "created"),)] == 0.0
    assert found["memstream_cluster_events_total"][(("event", "split"),)] == 0.0
    assert found["memstream_role"] == {(("role", "consolidate"),): 1.0, (("role", "process"),): 1.0}
    assert found["memstream_start_time_seconds"][()] > 0


def test_a_process_declares_only_its_roles_series() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.declare_roles(["consolidate"], series_of("consolidate"))
    stages = {dict(k)["stage"] for k in samples(metrics)["memstream_events_total"]}
    assert stages == {"consolidate", "archive", "feedback", "decay", "reminders"}


def test_the_api_declares_its_routes_and_phases_at_zero() -> None:
    metrics = Metrics(CollectorRegistry())
    create_api(
        ApiDeps(
            rpc=RPCSettings(),
            kafka=KafkaSettings(),
            retriever=cast(Any, None),
            publisher=cast(Any, None),
            metrics=metrics,
        )
    )
    found = samples(metrics)
    http = found["memstream_http_requests_total"]
    assert http[(("route", "/v1/retrieve"), ("status", "200"))] == 0.0
    assert http[(("route", "/v1/retrieve"), ("status", "500"))] == 0.0
    assert http[(("route", "/v1/events"), ("status", "202"))] == 0.0
    assert found["memstream_retrieval_latency_seconds_count"][(("phase", "total"),)] == 0.0
    assert found["memstream_role"] == {(("role", "serve"),): 1.0}


def test_known_stages_are_the_code_stage_constants() -> None:
    constants = {
        encode.NAME,
        memorize.NAME,
        control.NAME,
        consolidate.NAME,
        archive.NAME,
        strength.FEEDBACK_NAME,
        strength.DECAY_NAME,
        reminders.NAME,
    }
    declared = [series.name for stage in STAGES for series in stage.series]
    assert sorted(declared) == sorted(constants)  # each once


def bucket_counts(values: list[int]) -> dict[float, float]:
    """Cumulative counts per upper bound, as ``memstream_batch_size_bucket`` exports them."""
    bounds = [*BATCH_BUCKETS, float("inf")]
    return {b: float(sum(1 for v in values if v <= b)) for b in bounds}


@pytest.mark.parametrize("size", [1, 2])
def test_batch_size_percentiles_of_constant_batches_read_the_size(size: int) -> None:
    buckets = bucket_counts([size] * 40)
    assert quantile(0.5, buckets) == pytest.approx(size)  # PromQL's interpolation (top.py)
    assert abs(quantile(0.99, buckets) - size) < 0.5


def test_internal_topics_are_recognised() -> None:
    assert is_internal_topic("memstream-__assignor-__leader")
    assert is_internal_topic("__consumer_offsets")
    assert not is_internal_topic("memstream.events")
    assert not is_internal_topic("t1a2b3c4.encoded")


async def test_lag_sampler_leaves_internal_topics_out() -> None:
    events, leader = TP("memstream.events", 0), TP("memstream-__assignor-__leader", 0)

    class FakeConsumer:
        _committed_offset = {events: 3, leader: 0}  # noqa: RUF012 - read like faust's

        def assignment(self) -> set[TP]:
            return {events, leader}

        async def highwaters(self, *tps: TP) -> dict[TP, int]:
            return {tp: 10 for tp in tps}

        async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
            return {tp: 0 for tp in tps}

    app = SimpleNamespace(consumer=FakeConsumer(), conf=SimpleNamespace(id="memstream"))
    metrics = Metrics(CollectorRegistry())
    await LagSampler(cast(Any, app), metrics).sample()
    lag = samples(metrics)["memstream_consumer_lag"]
    assert {dict(k)["topic"] for k in lag} == {"memstream.events"}
    assert next(iter(lag.values())) == 7.0


def test_top_heads_frames_with_roles_uptime_and_time_and_shows_http_rates() -> None:
    before = Scrape(
        at=100.0,
        wall=1_780_000_000.0,
        values={
            "memstream_http_requests_total": {
                (("route", "/v1/retrieve"), ("status", "200")): 10.0,
                (("route", "/v1/retrieve"), ("status", "500")): 0.0,
            }
        },
    )
    now = Scrape(
        at=102.0,
        wall=1_780_000_002.0,
        values={
            "memstream_role": {(("role", "serve"),): 1.0, (("role", "process"),): 1.0},
            "memstream_start_time_seconds": {(): 1_780_000_002.0 - 3725.0},
            "memstream_http_requests_total": {
                (("route", "/v1/retrieve"), ("status", "200")): 18.0,
                (("route", "/v1/retrieve"), ("status", "422")): 2.0,
                (("route", "/v1/retrieve"), ("status", "500")): 1.0,
            },
        },
    )
    title = heading(now, "http://127.0.0.1:8080/metrics")
    assert "roles: process, serve" in title
    assert "up 1h02m05s" in title
    assert "2026-05-28 20:26:42 UTC" in title
    total, client, server = http_rates(now, before)["/v1/retrieve"]
    assert total == pytest.approx(5.5)  # (8 + 2 + 1) requests over 2 s
    assert client == pytest.approx(1.0)
    assert server == pytest.approx(0.5)
    assert len(render(now, before, "u").renderables) == 4  # stages, HTTP, retrieval, state


def test_encoder_totals_are_zero_at_first_and_read_as_of_the_scrape() -> None:
    """The encoder's counters exist from the start and a scrape reads the totals of that
    moment, not of the last sampling tick (the ingest benchmark reads right after settling)."""
    metrics = Metrics(CollectorRegistry())
    stats = EncoderStats()
    metrics.watch_encoder(stats)
    found = samples(metrics)
    for kind in ("query", "ingest"):
        for name in ("texts", "encoded", "cache_hits"):
            assert found[f"memstream_encoder_{name}_total"][(("kind", kind),)] == 0.0
    stats.texts["ingest"] += 7
    stats.cache_hits["ingest"] += 2
    stats.encoded["ingest"] += 5
    stats.texts["query"] += 1
    stats.encoded["query"] += 1
    stats.runs += 3
    stats.run_seconds += 0.25
    found = samples(metrics)
    assert found["memstream_encoder_texts_total"] == {
        (("kind", "ingest"),): 7.0,
        (("kind", "query"),): 1.0,
    }
    assert found["memstream_encoder_cache_hits_total"][(("kind", "ingest"),)] == 2.0
    assert found["memstream_encoder_encoded_total"][(("kind", "ingest"),)] == 5.0
    assert found["memstream_encoder_runs_total"][()] == 3.0
    assert found["memstream_encoder_run_seconds_total"][()] == pytest.approx(0.25)
    assert samples(metrics)["memstream_encoder_runs_total"][()] == 3.0  # copied once, not twice
