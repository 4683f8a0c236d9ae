"""Metrics on real processes: every catalogued series is exported and moves during a replay,
and a real Prometheus (Debian's package) scrapes every process, loads the alert rules and
evaluates every dashboard query.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from memstream.demo import SAMPLE_STREAM
from memstream.metrics import catalogue
from memstream.replay import replay_file
from memstream.settings import Settings
from rpc.publisher import EventPublisher
from stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from tests.integration.process import MemstreamProcess, settings_env, wait_for
from tests.unit.test_observability_files import DASHBOARD, PROMETHEUS, dashboard_exprs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Series that cannot move in this configuration (extractive consolidator: no tokens; no
# failing sampler), with why. They must still be exported.
STILL = {
    "memstream_llm_tokens_total": "the extractive consolidator uses no tokens",
    "memstream_sample_errors_total": "no sampler fails here (asserted zero)",
    "memstream_consumer_lag": "0 once caught up; sampled, so a short replay may never show it",
}


def unique_settings(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, data_dir: Path, **extra: object
) -> Settings:
    unique = uuid.uuid4().hex[:8]
    return Settings(
        data_dir=data_dir,
        metrics_interval_s=0.5,
        kafka={"broker": broker.url, "topic_prefix": f"t{unique}", "partitions": 2},
        redis={"url": redis_server.url, "prefix": f"t{unique}"},
        rpc={"port": free_port()},
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def up(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MemstreamProcess]:
    tmp = tmp_path_factory.mktemp("observed")
    process = MemstreamProcess(
        unique_settings(broker, redis_server, tmp / "data"), tmp / "up.log"
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def worker(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A separate ``memstream worker`` with its own /metrics listener (and own topics)."""
    tmp = tmp_path_factory.mktemp("worker")
    settings = unique_settings(broker, redis_server, tmp / "data", metrics_port=free_port())
    with (tmp / "worker.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "worker"],
            env={**os.environ, **settings_env(settings)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{settings.metrics_port}/metrics"

    def serving() -> bool:
        assert proc.poll() is None, (tmp / "worker.log").read_text()[-3000:]
        try:
            return "memstream_consumer_lag{" in httpx.get(url, timeout=1).text  # assigned
        except httpx.HTTPError:
            return False

    try:
        wait_for(serving, 60, "memstream worker /metrics with its partitions")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def scrape(url: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def by_metric(samples: Samples, name: str, type_: str) -> dict[tuple[tuple[str, str], ...], float]:
    wanted = {name}
    if type_ == "histogram":
        wanted = {name + "_count"}
    elif type_ == "counter":
        wanted = {name}  # the parser keeps ``_total`` on counter samples
    return {labels: v for (n, labels), v in samples.items() if n in wanted}


def test_every_catalogued_series_is_present_and_moving(up: MemstreamProcess) -> None:
    metrics_url = f"{up.url}/metrics"
    before = scrape(metrics_url)
    settings = up.settings

    async def publish() -> None:
        await replay_file(
            SAMPLE_STREAM, settings.kafka.broker, settings.topic("events"), progress=False
        )
        bad = EventPublisher(settings.kafka.broker)  # one invalid event: the DLQ must count it
        await bad.start()
        try:
            await bad.publish_many(settings.topic("events"), [("t:u", b"not an event")])
        finally:
            await bad.close()

    asyncio.run(publish())
    with up.client() as http:
        assert http.post("/v1/retrieve", json={"user_id": "cust-ana", "query": "order"}).is_success

    def settled() -> Samples | None:
        now = scrape(metrics_url)
        memories = now.get(("memstream_longterm_memories", ()), 0)
        dlq = sum(v for (n, _), v in now.items() if n == "memstream_dlq_total")
        return now if memories > 0 and dlq > 0 else None

    after = wait_for(settled, 60, "consolidated memories and a dead letter in /metrics")
    for doc in catalogue():
        now = by_metric(after, doc.name, doc.type)
        assert now, f"{doc.name} is not exported"
        if doc.name in STILL:
            continue
        was = by_metric(before, doc.name, doc.type)
        moved = [labels for labels, v in now.items() if v != was.get(labels, 0.0)]
        assert moved, f"{doc.name} did not move during the replay"
    errors = by_metric(after, "memstream_sample_errors_total", "counter")
    assert errors
    assert not any(errors.values()), errors
    lag = by_metric(after, "memstream_consumer_lag", "gauge")
    topics = {dict(labels)["topic"] for labels in lag}
    assert settings.topic("events") in topics
    assert settings.topic("triggers") in topics


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_real_prometheus_scrapes_every_process(
    up: MemstreamProcess, worker: str, tmp_path: Path
) -> None:
    shutil.copy(PROMETHEUS / "rules.yml", tmp_path / "rules.yml")
    worker_target = worker.removeprefix("http://").removesuffix("/metrics")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            {
                "job_name": "memstream-serve",
                "static_configs": [{"targets": [up.url.removeprefix("http://")]}],
            },
            {"job_name": "memstream-worker", "static_configs": [{"targets": [worker_target]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    with (tmp_path / "prometheus.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def all_up() -> list[dict] | None:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                targets = httpx.get(f"{api}/targets", timeout=2).json()["data"]["activeTargets"]
            except (httpx.HTTPError, ValueError, KeyError):
                return None
            ok = len(targets) == 2 and all(t["health"] == "up" for t in targets)
            return targets if ok else None

        targets = wait_for(all_up, 45, "every target up in Prometheus")
        assert {t["labels"]["job"] for t in targets} == {"memstream-serve", "memstream-worker"}

        def query(expr: str) -> dict:
            body = httpx.get(f"{api}/query", params={"query": expr}, timeout=5).json()
            assert body["status"] == "success", (expr, body)
            return body["data"]

        for job in ("memstream-worker", "memstream-serve"):
            series = f'memstream_consumer_lag{{job="{job}"}}'
            wait_for(lambda s=series: query(s)["result"], 20, f"{series} in Prometheus")
        groups = httpx.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert rules
        assert all(r["health"] in ("ok", "unknown") for r in rules), rules
        if DASHBOARD.exists():  # every dashboard query parses and runs on the real server
            for expr in dashboard_exprs():
                query(expr.replace("$__rate_interval", "1m").replace("$__interval", "1m"))
    finally:
        proc.terminate()
        proc.wait(15)
