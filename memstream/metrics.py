"""Every Prometheus metric memstream exports, declared once against an injectable registry.

Tests build a ``Metrics`` on a fresh ``CollectorRegistry``; processes use the default one.
All names start with ``memstream_``; units are in the names (``_seconds``, ``_total``).
"""

from __future__ import annotations

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
            "Time to handle one message (or one batch, for batched stages), by stage.",
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
            "Retrieval time by phase (encode, shortterm, longterm, rank, total).",
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
