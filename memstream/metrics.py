"""Every Prometheus metric memstream exports, declared once against an injectable registry.

Tests build a ``Metrics`` on a fresh ``CollectorRegistry``; processes use the default one.
All names start with ``memstream_``; units are in the names (``_seconds``, ``_total``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

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
# Batch sizes are whole numbers: bounds half-way between them, so that PromQL's linear
# interpolation inside a bucket reads a bucket of ones as 1 (p50) rather than 0.5, and
# (2.5, 4.5] as sizes 3..4. Whole-number bounds made a stream of single events read 0.5.
BATCH_BUCKETS = (0.5, 1.5, 2.5, 4.5, 8.5, 16.5, 32.5, 64.5, 128.5, 256.5)

# Label values known before anything happens, exported at zero from the start so that the
# first event is a rise of an existing series (``rate()`` and alerts see it), not a new one.
DLQ_REASONS = ("validation", "poison")
CONSOLIDATION_OUTCOMES = ("created", "updated", "unchanged", "deferred", "skipped")
CLUSTER_EVENTS = ("merge", "fuzzy", "create", "routed", "flush", "maintenance", "split", "archive")
# schemas.memories.TriggerReason, spelt out: the kernel imports nothing of the project.
TRIGGER_REASONS = ("semantic", "cluster", "entity", "pin", "eager")
LLM_FALLBACK_REASONS = ("truncated", "invalid_json", "schema")  # stores.llm.FallbackReason
CONSOLIDATION_CUT_REASONS = ("input", "budget")  # memory.extractive.Cut
RETRIEVAL_PHASES = ("encode", "fetch", "rank", "total")
ENCODER_KINDS = ("query", "ingest")  # stores.encoder.EncoderStats' caller kinds
SHED_REASONS = ("overload", "tenant", "deadline")  # rpc.admission.ShedReason
EVENT_AGE_POINTS = ("taken", "done")


@dataclass(frozen=True)
class StageSeries:
    """A stage's labelled series, exported at zero by a process that runs it: its ``stage``
    label, its outcomes, whether it dead-letters and whether it handles batches. Each stage
    declares its own (``streaming.services.StageSpec``)."""

    name: str
    outcomes: tuple[str, ...] = ("ok", "dlq")
    dead_letters: bool = True
    batched: bool = False


class EncoderCounts(Protocol):
    """What ``stores.encoder.EncoderStats`` holds: running totals since the encoder was built."""

    @property
    def texts(self) -> Mapping[str, int]: ...
    @property
    def cache_hits(self) -> Mapping[str, int]: ...
    @property
    def encoded(self) -> Mapping[str, int]: ...
    @property
    def runs(self) -> int: ...
    @property
    def run_seconds(self) -> float: ...


class _BeforeScrape:
    """A collector that exports nothing and runs hooks first: registered before every
    metric, so a scrape reads totals copied at that very moment (a timer's copy would be
    up to ``metrics_interval_s`` old, and the benchmark reads right after it settles)."""

    def __init__(self) -> None:
        self.hooks: list[Callable[[], None]] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        for hook in self.hooks:
            hook()
        return []


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self._before_scrape = _BeforeScrape()
        registry.register(self._before_scrape)
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
        self.event_age = Histogram(
            "memstream_event_age_seconds",
            "Age of an event (since its record reached memstream) when a stage took it "
            "(at=taken) and when the stage had handled it (at=done); memorize's done is "
            "event -> retrievable.",
            ["stage", "at"],
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
            "Memories written, by outcome (created, updated, unchanged, deferred, skipped).",
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
        self.llm_fallbacks = Counter(
            "memstream_llm_fallbacks_total",
            "LLM answers that stayed unusable after one repair ask, so the extractive "
            "consolidator wrote the memory, by reason of the last one (truncated, invalid_json, "
            "schema).",
            ["reason"],
            registry=registry,
        )
        self.consolidations_cut = Counter(
            "memstream_consolidations_cut_total",
            "Extractive consolidations (the backend or the LLM's fallback) that stopped short, "
            "by reason: input (turns too long or too many sentences, promises or open actions: "
            "read in part) or budget (the comparison budget ran out). The memory is still "
            "written, from what was read.",
            ["reason"],
            registry=registry,
        )
        self.consolidation_input_tokens = Counter(
            "memstream_consolidation_input_tokens_total",
            "Tokens of the prompts consolidations are (or, extractive, would be) sent: the "
            "rules, the key, the current memory and the turns, counted with the encoder's "
            "tokenizer whatever the backend, so gated and eager runs compare.",
            ["backend"],
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
        self.admitted = Counter(
            "memstream_rpc_admitted_total",
            "Retrievals admitted by the RPC's admission control (run at once or after a wait "
            "in its queue).",
            registry=registry,
        )
        self.shed = Counter(
            "memstream_rpc_shed_total",
            "Retrievals refused without doing the work, by reason (overload: 503, the limit "
            "and its queue full; tenant: 429, the tenant holds its fair share; deadline: 504, "
            "the caller's deadline passed first) and tenant.",
            ["reason", "tenant"],
            registry=registry,
        )
        self.queue_time = Histogram(
            "memstream_rpc_queue_seconds",
            "Time an admitted retrieval waited in the admission queue (0: a slot was free).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.concurrency_limit = Gauge(
            "memstream_rpc_concurrency_limit",
            "The admission control's current limit on retrievals in flight (adaptive).",
            registry=registry,
        )
        self.in_flight = Gauge(
            "memstream_rpc_in_flight",
            "Retrievals in flight (admitted, not yet answered).",
            registry=registry,
        )
        self.ingest_lag = Gauge(
            "memstream_rpc_ingest_lag",
            "Events accepted and not yet memorized, as the RPC reads it from the broker: the "
            "processors' consumer-group lag on the events and encoded topics, plus what this "
            "process accepted since (the measure rpc.ingest_max_lag bounds).",
            registry=registry,
        )
        self.ingest_refused = Counter(
            "memstream_rpc_ingest_refused_total",
            "POST /v1/events requests refused whole with a 429 because the ingest lag was "
            "past rpc.ingest_max_lag, by tenant.",
            ["tenant"],
            registry=registry,
        )
        self.journal_bytes = Gauge(
            "memstream_rpc_journal_bytes",
            "Bytes of the RPC's intake journal on disk (rpc.journal): accepted events kept "
            "until they are memorized; bounded by the pipeline's lag.",
            registry=registry,
        )
        self.journal_segments = Gauge(
            "memstream_rpc_journal_segments",
            "Segment files of the RPC's intake journal on disk.",
            registry=registry,
        )
        self.journal_recovered = Counter(
            "memstream_rpc_journal_recovered_total",
            "Events the RPC re-published from its intake journal at start: accepted by an "
            "earlier process and not memorized (lost with the broker, or never sent).",
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
            "buffer flushes, maintenance runs and their splits, merges and archives.",
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
        self.encoder_texts = Counter(
            "memstream_encoder_texts_total",
            "Texts handed to the process's encoder, by caller kind (query: the RPC's; ingest: "
            "turns, cluster descriptions), cache hits included.",
            ["kind"],
            registry=registry,
        )
        self.encoder_encoded = Counter(
            "memstream_encoder_encoded_total",
            "Texts the encoder ran through the model, by caller kind (not cache hits, nor a "
            "text repeated in one call).",
            ["kind"],
            registry=registry,
        )
        self.encoder_cache_hits = Counter(
            "memstream_encoder_cache_hits_total",
            "Texts the encoder answered from its vector cache, by caller kind.",
            ["kind"],
            registry=registry,
        )
        self.encoder_runs = Counter(
            "memstream_encoder_runs_total",
            "Model runs (onnxruntime Session.run calls) of the encoder.",
            registry=registry,
        )
        self.encoder_run_seconds = Counter(
            "memstream_encoder_run_seconds_total",
            "Wall time inside the encoder's model runs.",
            registry=registry,
        )
        self.role = Gauge(
            "memstream_role",
            "1 for each role this process plays (process, consolidate, serve).",
            ["role"],
            registry=registry,
        )
        self.start_time = Gauge(
            "memstream_start_time_seconds",
            "When this process started, Unix time (wall clock); uptime = time() - this.",
            registry=registry,
        )
        self.start_time.set(time.time())

    def watch_encoder(self, stats: EncoderCounts) -> None:
        """Export the encoder's running totals, copied at every scrape (series at zero now)."""
        last: dict[tuple[str, str], float] = {}
        lock = threading.Lock()  # two scrapes at once must not both add the same growth
        by_kind = (
            ("texts", self.encoder_texts),
            ("encoded", self.encoder_encoded),
            ("cache_hits", self.encoder_cache_hits),
        )

        def grow(counter: Counter, key: tuple[str, str], total: float) -> None:
            grown = total - last.get(key, 0.0)
            if grown > 0:
                counter.inc(grown)
                last[key] = total

        def copy() -> None:
            with lock:
                for field, counter in by_kind:
                    totals: Mapping[str, int] = getattr(stats, field)
                    for kind in ENCODER_KINDS:
                        grow(counter.labels(kind), (field, kind), totals.get(kind, 0))
                grow(self.encoder_runs, ("runs", ""), stats.runs)
                grow(self.encoder_run_seconds, ("run_seconds", ""), stats.run_seconds)

        for _, counter in by_kind:
            for kind in ENCODER_KINDS:
                counter.labels(kind)
        self._before_scrape.hooks.append(copy)

    def declare_roles(self, roles: Iterable[str], stages: Iterable[StageSeries] = ()) -> None:
        """Mark the roles played and export their labelled series, and those of the
        ``stages`` the process runs, at zero."""
        for role in roles:
            self.role.labels(role).set(1)
            self._declare_role_series(role)
        for stage in stages:
            self._declare_stage(stage)

    def _declare_stage(self, stage: StageSeries) -> None:
        """A stage's series at zero: its outcomes, latency, dead letters and batch size."""
        for outcome in stage.outcomes:
            self.events.labels(stage.name, outcome)
        self.stage_latency.labels(stage.name)
        if stage.dead_letters:
            for reason in DLQ_REASONS:
                self.dlq.labels(stage.name, reason)
        if stage.batched:
            self.batch_size.labels(stage.name)
            for at in EVENT_AGE_POINTS:
                self.event_age.labels(stage.name, at)

    def _declare_role_series(self, role: str) -> None:
        """The series only one role exports (not per stage), at zero."""
        if role == "process":
            for reason in TRIGGER_REASONS:
                self.triggers.labels(reason)
            for event in CLUSTER_EVENTS:
                self.cluster_events.labels(event)
        elif role == "consolidate":
            for outcome in CONSOLIDATION_OUTCOMES:
                self.consolidations.labels(outcome)
            self.stage_latency.labels("llm")
            for reason in LLM_FALLBACK_REASONS:
                self.llm_fallbacks.labels(reason)
            for reason in CONSOLIDATION_CUT_REASONS:
                self.consolidations_cut.labels(reason)
        elif role == "serve":
            for phase in RETRIEVAL_PHASES:
                self.retrieval_latency.labels(phase)

    def declare_tenants(self, tenants: Iterable[str]) -> None:
        """Export the shed and ingest-refusal series of the tenants the API keys name at zero."""
        for tenant in tenants:
            for reason in SHED_REASONS:
                self.shed.labels(reason, tenant)
            self.ingest_refused.labels(tenant)


# Units of the catalogue table; names carry them too (``_seconds``, ``_total``).
UNITS = {
    "memstream_stage_latency_seconds": "seconds",
    "memstream_retrieval_latency_seconds": "seconds",
    "memstream_event_age_seconds": "seconds",
    "memstream_batch_size": "messages",
    "memstream_consumer_lag": "messages",
    "memstream_llm_tokens_total": "tokens",
    "memstream_consolidation_input_tokens_total": "tokens",
    "memstream_longterm_memories": "memories",
    "memstream_users": "users",
    "memstream_clusters": "clusters",
    "memstream_shortterm_turns": "turns",
    "memstream_start_time_seconds": "seconds",
    "memstream_role": "flag",
    "memstream_encoder_texts_total": "texts",
    "memstream_encoder_encoded_total": "texts",
    "memstream_encoder_cache_hits_total": "texts",
    "memstream_encoder_runs_total": "runs",
    "memstream_encoder_run_seconds_total": "seconds",
    "memstream_rpc_admitted_total": "requests",
    "memstream_rpc_shed_total": "requests",
    "memstream_rpc_queue_seconds": "seconds",
    "memstream_rpc_concurrency_limit": "requests",
    "memstream_rpc_in_flight": "requests",
    "memstream_rpc_ingest_lag": "events",
    "memstream_rpc_ingest_refused_total": "requests",
    "memstream_rpc_journal_bytes": "bytes",
    "memstream_rpc_journal_segments": "segments",
    "memstream_rpc_journal_recovered_total": "events",
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
