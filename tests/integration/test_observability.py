"""Metrics on real processes: every catalogued series is exported and moves during a replay,
and a real Prometheus (Debian's package) scrapes every process, loads the alert rules and
evaluates every dashboard query.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from memstream.launch import Process, on_free_port, with_overrides
from memstream.metrics import catalogue
from memstream.ops.demo import SAMPLE_STREAM
from memstream.ops.replay import replay_file
from memstream.roles import ROLE_SETS
from memstream.settings import DEMO_API_KEY, Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis, free_port
from memstream.streaming.broker import EventPublisher
from tests.integration.process import MemstreamProcess, wait_for
from tests.unit.test_observability_files import DASHBOARD, PROMETHEUS, dashboard_exprs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Series that cannot move in this configuration (extractive consolidator: no tokens; no
# failing sampler), with why. They must still be exported.
STILL = {
    "memstream_llm_tokens_total": "the extractive consolidator uses no tokens",
    "memstream_llm_fallbacks_total": "only an LLM's unusable answer falls back to extractive",
    "memstream_sample_errors_total": "no sampler fails here (asserted zero)",
    "memstream_retries_total": "no store fails in a plain replay (make reliability: outages)",
    "memstream_consumer_lag": "0 once caught up; sampled, so a short replay may never show it",
    "memstream_role": "constant 1 per role the process plays",
    "memstream_start_time_seconds": "set once, when the process starts",
    "memstream_encoder_cache_hits_total": "only a repeated cluster description hits the cache",
    "memstream_consolidations_cut_total": "only input past the consolidator's bounds is cut",
    "memstream_rpc_shed_total": "only an overload sheds (tests/integration/test_admission.py)",
    "memstream_rpc_concurrency_limit": "steps only after windows the limit held back",
    "memstream_rpc_in_flight": "0 between requests",
    "memstream_rpc_ingest_lag": "0 once caught up; read every 0.5 s, so a short replay may "
    "never show it (tests/integration/test_ingest_backpressure.py)",
    "memstream_rpc_ingest_refused_total": "only a lag past rpc.ingest_max_lag refuses "
    "(tests/integration/test_ingest_backpressure.py)",
    "memstream_rpc_journal_bytes": "the intake journal is off with a configured broker "
    "(rpc.journal auto; tests/integration/test_intake_journal.py)",
    "memstream_rpc_journal_segments": "the intake journal is off with a configured broker",
    "memstream_rpc_journal_recovered_total": "only a start after a crash recovers "
    "(tests/integration/test_intake_journal.py)",
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


# The roles run apart, as in production: which catalogued series each process owns. Every
# catalogued metric must be owned by one of them (a new metric: add it here).
EVERY_PROCESS = (
    "memstream_role",
    "memstream_start_time_seconds",
)
# The roles that encode: the worker turns and descriptions, serve the queries (the
# consolidator encodes nothing: a memory's vector is its source turns' mean).
ENCODING = (
    "memstream_encoder_texts_total",
    "memstream_encoder_encoded_total",
    "memstream_encoder_cache_hits_total",
    "memstream_encoder_runs_total",
    "memstream_encoder_run_seconds_total",
)
OWNED = {
    "worker": {
        "memstream_events_total",
        "memstream_stage_latency_seconds",
        "memstream_batch_size",
        "memstream_event_age_seconds",
        "memstream_dlq_total",
        "memstream_triggers_total",
        "memstream_consumer_lag",
        "memstream_users",
        "memstream_clusters",
        "memstream_shortterm_turns",
        "memstream_sample_errors_total",
        "memstream_cluster_events_total",
        "memstream_retries_total",
        *EVERY_PROCESS,
        *ENCODING,
    },
    "consolidator": {
        "memstream_events_total",
        "memstream_stage_latency_seconds",
        "memstream_batch_size",
        "memstream_event_age_seconds",
        "memstream_consolidations_total",
        "memstream_llm_calls_total",
        "memstream_llm_tokens_total",
        "memstream_llm_fallbacks_total",
        "memstream_consolidations_cut_total",
        "memstream_consolidation_input_tokens_total",
        "memstream_longterm_memories",
        "memstream_consumer_lag",
        "memstream_sample_errors_total",
        "memstream_retries_total",
        *EVERY_PROCESS,
    },
    "serve": {
        "memstream_retrieval_latency_seconds",
        "memstream_http_requests_total",
        "memstream_rpc_admitted_total",
        "memstream_rpc_shed_total",
        "memstream_rpc_queue_seconds",
        "memstream_rpc_concurrency_limit",
        "memstream_rpc_in_flight",
        "memstream_rpc_ingest_lag",
        "memstream_rpc_ingest_refused_total",
        "memstream_rpc_journal_bytes",
        "memstream_rpc_journal_segments",
        "memstream_rpc_journal_recovered_total",
        *EVERY_PROCESS,
        *ENCODING,
    },
}


@dataclass
class Split:
    """``memstream worker``, ``consolidator`` and ``serve`` as three processes on one stream.

    Each has its own Qdrant Edge folder (Edge is one-process), so the API's long-term
    store stays empty here: this is about every process's metrics and probes, not answers.
    """

    settings: Settings
    urls: dict[str, str]  # role -> base URL of its HTTP listener

    def metrics(self, role: str) -> str:
        return f"{self.urls[role]}/metrics"


@pytest.fixture(scope="module")
def split(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Split]:
    tmp = tmp_path_factory.mktemp("split")
    shared = unique_settings(broker, redis_server, tmp / "data")
    procs: dict[str, Process] = {}
    try:
        for name in ("worker", "consolidator", "serve"):
            roles = ROLE_SETS[name]
            own = on_free_port(with_overrides(shared, {"data_dir": tmp / name}), roles)
            procs[name] = Process(own, roles, log_path=tmp / f"{name}.log").spawn()
        for proc in procs.values():
            proc.ready(90, "/readyz")
        yield Split(procs["serve"].settings, {name: proc.url for name, proc in procs.items()})
    finally:
        for proc in procs.values():
            proc.stop()


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


def publish_sample(settings: Settings) -> None:
    """The sample stream and one invalid event (the DLQ must count it)."""

    async def publish() -> None:
        await replay_file(
            SAMPLE_STREAM, settings.kafka.broker, settings.kafka.topic("events"), progress=False
        )
        bad = EventPublisher(settings.kafka.broker)
        await bad.start()
        try:
            await bad.publish_many(settings.kafka.topic("events"), [("t:u", b"not an event")])
        finally:
            await bad.close()

    asyncio.run(publish())


def assert_moving(before: Samples, after: Samples, names: set[str], where: str) -> None:
    for doc in catalogue():
        if doc.name not in names:
            continue
        now = by_metric(after, doc.name, doc.type)
        assert now, f"{doc.name} is not exported by {where}"
        if doc.name in STILL:
            continue
        was = by_metric(before, doc.name, doc.type)
        moved = [labels for labels, v in now.items() if v != was.get(labels, 0.0)]
        assert moved, f"{doc.name} did not move in {where} during the replay"


def test_every_catalogued_series_is_present_and_moving(up: MemstreamProcess) -> None:
    metrics_url = f"{up.url}/metrics"
    before = scrape(metrics_url)
    settings = up.settings
    publish_sample(settings)
    with up.client() as http:
        assert http.post("/v1/retrieve", json={"user_id": "cust-ana", "query": "order"}).is_success

    def settled() -> Samples | None:
        now = scrape(metrics_url)
        memories = now.get(("memstream_longterm_memories", ()), 0)
        dlq = sum(v for (n, _), v in now.items() if n == "memstream_dlq_total")
        return now if memories > 0 and dlq > 0 else None

    after = wait_for(settled, 60, "consolidated memories and a dead letter in /metrics")
    assert_moving(before, after, {doc.name for doc in catalogue()}, "memstream up")
    errors = by_metric(after, "memstream_sample_errors_total", "counter")
    assert errors
    assert not any(errors.values()), errors
    lag = by_metric(after, "memstream_consumer_lag", "gauge")
    topics = {dict(labels)["topic"] for labels in lag}
    assert settings.kafka.topic("events") in topics
    assert settings.kafka.topic("triggers") in topics


def test_split_processes_each_export_their_series_and_answer_probes(split: Split) -> None:
    """worker, consolidator and serve apart: each one's series are present and moving."""
    owned = set().union(*OWNED.values())
    assert owned == {doc.name for doc in catalogue()}, "assign every catalogued metric a role"
    before = {role: scrape(split.metrics(role)) for role in split.urls}
    publish_sample(split.settings)
    with httpx.Client(
        base_url=split.urls["serve"], headers={"Authorization": f"Bearer {DEMO_API_KEY}"}
    ) as http:
        assert http.post("/v1/retrieve", json={"user_id": "cust-ana", "query": "order"}).is_success

    def settled() -> dict[str, Samples] | None:
        now = {role: scrape(split.metrics(role)) for role in split.urls}
        memories = now["consolidator"].get(("memstream_longterm_memories", ()), 0)
        dlq = sum(v for (n, _), v in now["worker"].items() if n == "memstream_dlq_total")
        return now if memories > 0 and dlq > 0 else None

    after = wait_for(settled, 90, "memories in the consolidator and a dead letter in the worker")
    for role, names in OWNED.items():
        assert_moving(before[role], after[role], names, f"memstream {role}")
    for role in ("worker", "consolidator"):
        live = httpx.get(f"{split.urls[role]}/healthz", timeout=5)
        assert live.status_code == 200, live.text
        assert live.json()["ok"]
        ready = httpx.get(f"{split.urls[role]}/readyz", timeout=5).json()
        assert ready["ok"], ready
        checks = {"loop", "consumer", "redis"} | ({"qdrant"} if role == "consolidator" else set())
        assert ready["checks"] == dict.fromkeys(checks, True), ready
    assert httpx.get(f"{split.urls['worker']}/nothing", timeout=5).status_code == 404


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_real_prometheus_scrapes_every_process(
    up: MemstreamProcess, split: Split, tmp_path: Path
) -> None:
    shutil.copy(PROMETHEUS / "rules.yml", tmp_path / "rules.yml")
    jobs = {"memstream-up": up.url} | {f"memstream-{r}": url for r, url in split.urls.items()}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [url.removeprefix("http://")]}]}
            for job, url in jobs.items()
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
            ok = len(targets) == len(jobs) and all(t["health"] == "up" for t in targets)
            return targets if ok else None

        targets = wait_for(all_up, 45, "every target up in Prometheus")
        assert {t["labels"]["job"] for t in targets} == set(jobs)

        def query(expr: str) -> dict:
            body = httpx.get(f"{api}/query", params={"query": expr}, timeout=5).json()
            assert body["status"] == "success", (expr, body)
            return body["data"]

        for job in ("memstream-up", "memstream-worker", "memstream-consolidator"):
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
