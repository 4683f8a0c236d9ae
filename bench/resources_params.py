"""What a resources run is asked to load and measure (``bench/resources.py`` measures,
``bench/resources_report.py`` writes it up)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Params:
    sample_events: int  # of examples/sample_stream.jsonl (276 in all), replayed
    memories: int  # long-term, bulk-loaded
    memory_users: int
    short_term_turns: int  # in all: bulk-loaded + replayed
    turn_users: int  # users holding the bulk-loaded turns (and asked in retrievals)
    generated_events: int  # replayed through the pipeline
    retrievals: int
