"""Every Prometheus metric memstream exports, declared once against an injectable registry.

Tests build a ``Metrics`` on a fresh ``CollectorRegistry``; processes use the default one.
All names start with ``memstream_``; units are in the names (``_seconds``, ``_total``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

# Stage latencies range from sub-millisecond Redis writes to multi-second LLM calls.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.events = Counter(
            "memstream_events_total",
            "Messages handled, by stage and outcome (ok, duplicate, dlq, error).",
            ["stage", "outcome"],
            registry=registry,
        )
        self.stage_latency = Histogram(
            "memstream_stage_latency_seconds",
            "Time to handle one message or batch, by stage (encode and consolidate: per batch; "
            "memorize: per event; llm: per consolidator call).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "memstream_batch_size",
            "Messages per batch, by batched stage.",
            ["stage"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.dlq = Counter(
            "memstream_dlq_total",
            "Messages sent to the dead-letter topic, by stage and reason class.",
            ["stage", "reason"],
            registry=registry,
        )
        self.triggers = Counter(
            "memstream_triggers_total",
            "Recurrence triggers emitted, by reason.",
            ["reason"],
            registry=registry,
        )
        self.consolidations = Counter(
            "memstream_consolidations_total",
            "Memories written, by outcome (created, updated, unchanged, skipped).",
            ["outcome"],
            registry=registry,
        )
        self.llm_calls = Counter(
            "memstream_llm_calls_total",
            "Consolidator calls, by backend and outcome.",
            ["backend", "outcome"],
            registry=registry,
        )
        self.llm_tokens = Counter(
            "memstream_llm_tokens_total",
            "LLM tokens, by backend and kind (prompt, completion).",
            ["backend", "kind"],
            registry=registry,
        )
        self.retrieval_latency = Histogram(
            "memstream_retrieval_latency_seconds",
            "Retrieval time by phase (encode, fetch, rank, ...; total is the whole call).",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.http_requests = Counter(
            "memstream_http_requests_total",
            "RPC requests by route and status code.",
            ["route", "status"],
            registry=registry,
        )
        self.memories = Gauge(
            "memstream_longterm_memories",
            "Consolidated memories in the long-term store (sampled).",
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "memstream_consumer_lag",
            "Messages not yet committed, per consumer group and partition (sampled).",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.users = Gauge(
            "memstream_users",
            "Users with state in Redis (sampled).",
            registry=registry,
        )
        self.clusters = Gauge(
            "memstream_clusters",
            "Topic clusters over all users (sampled; estimated from a random sample of "
            "users when there are many).",
            registry=registry,
        )
        self.cluster_events = Counter(
            "memstream_cluster_events_total",
            "Clustering events, by kind: routing bands (merge, fuzzy, create, routed), fuzzy "
            "buffer flushes, maintenance runs and their splits, merges and archives, LLM "
            "routing calls (route_ok, route_error, route_limited).",
            ["event"],
            registry=registry,
        )
        self.shortterm_turns = Gauge(
            "memstream_shortterm_turns",
            "Short-term turns kept in Redis over all users (sampled; estimated like clusters).",
            registry=registry,
        )
        self.sample_errors = Counter(
            "memstream_sample_errors_total",
            "Failed periodic samples of gauges, by sampler (lag, state, longterm, llm).",
            ["sampler"],
            registry=registry,
        )
        self.retries = Counter(
            "memstream_retries_total",
            "Retried attempts, by stage and kind (outage: a store unreachable, retried with "
            "backoff until it answers; error: retried, then dead-lettered after a bounded count).",
            ["stage", "kind"],
            registry=registry,
        )


# Units of the catalogue table; names carry them too (``_seconds``, ``_total``).
UNITS = {
    "memstream_stage_latency_seconds": "seconds",
    "memstream_retrieval_latency_seconds": "seconds",
    "memstream_batch_size": "messages",
    "memstream_consumer_lag": "messages",
    "memstream_llm_tokens_total": "tokens",
    "memstream_longterm_memories": "memories",
    "memstream_users": "users",
    "memstream_clusters": "clusters",
    "memstream_shortterm_turns": "turns",
}

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


@dataclass(frozen=True)
class MetricDoc:
    name: str
    type: str
    labels: tuple[str, ...]
    meaning: str
    unit: str


def catalogue(metrics: Metrics | None = None) -> list[MetricDoc]:
    """Every metric ``Metrics`` declares, in declaration order."""
    metrics = metrics or Metrics(CollectorRegistry())
    docs: list[MetricDoc] = []
    for value in vars(metrics).values():
        if not isinstance(value, Counter | Gauge | Histogram):
            continue
        name = value._name  # prometheus_client strips ``_total`` from counters' ``_name``
        if isinstance(value, Counter):
            name += "_total"
        docs.append(
            MetricDoc(
                name=name,
                type=value._type,
                labels=tuple(value._labelnames),
                meaning=value._documentation,
                unit=UNITS.get(name, "count"),
            )
        )
    return docs


def catalogue_markdown(metrics: Metrics | None = None) -> str:
    """The table in ``docs/metrics.md`` (a test checks that the file matches this)."""
    lines = [
        "# Metrics",
        "",
        "Every metric memstream exports (`memstream/metrics.py`; regenerate this file with",
        "`python -m memstream.metrics > docs/metrics.md`). Histograms also export `_bucket`,",
        "`_sum` and `_count` series. Processes with the `process` role sample lag and Redis",
        "gauges, those with the `consolidate` role the long-term gauge and LLM tokens, every",
        "`settings.metrics_interval_s`.",
        "",
        "| metric | type | labels | meaning | unit |",
        "| --- | --- | --- | --- | --- |",
    ]
    for d in catalogue(metrics):
        labels = ", ".join(f"`{label}`" for label in d.labels) or "—"
        lines.append(f"| `{d.name}` | {d.type} | {labels} | {d.meaning} | {d.unit} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(catalogue_markdown(), end="")
