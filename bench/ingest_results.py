"""What an ingest run is asked to measure and what it measured (``bench/ingest.py``
measures, ``bench/ingest_report.py`` writes it up)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The processes the pipeline runs in (the bench's driver is not one of them).
PIPELINE_PROCESSES = ("memstream", "broker", "valkey")


@dataclass(frozen=True)
class Params:
    sample_events: int  # of examples/sample_stream.jsonl (276 in all)
    generated_events: int  # replayed for throughput
    latency_probes: int  # single events posted at half load
    scaleout_events: int  # per scale-out run
    scaleout_rounds: int  # pairs of scale-out runs (1 process, then 2); the median is reported
    single_samples: int  # one-sentence encoder calls for the latency reference


@dataclass
class StreamRun:
    name: str
    events: int
    elapsed_s: float  # first publish -> settled
    memorized_s: float  # first publish -> every event memorized
    events_per_s: float
    cpu_s: dict[str, float]
    stages: dict[str, dict[str, float]]  # stage -> {"sum_s", "count"}
    encode_batch_mean: float
    triggers: float
    llm_calls: float
    machine_busy: float  # share of all CPU on the machine, anyone's, during the run
    # The encoder's own counters, every caller kind (turns, descriptions, queries):
    # texts asked, encoded (run through the model), cache_hits, runs.
    encoder: dict[str, float] = field(default_factory=dict)

    @property
    def encoder_texts_per_event(self) -> float:
        return self.encoder.get("texts", 0.0) / self.events if self.events else 0.0

    @property
    def pipeline_cpu_ms_per_event(self) -> float:
        """CPU of every pipeline process (memstream, broker, Valkey), not the bench driver."""
        used = sum(s for name, s in self.cpu_s.items() if name in PIPELINE_PROCESSES)
        return 1000 * used / self.events if self.events else 0.0


@dataclass
class Measured:
    encoder: dict[str, Any] = field(default_factory=dict)
    streams: list[StreamRun] = field(default_factory=list)
    latency: dict[str, Any] = field(default_factory=dict)
    scale: list[dict[str, Any]] = field(default_factory=list)
