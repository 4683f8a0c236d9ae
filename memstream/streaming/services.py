"""What every stage is: a ``StageSpec`` (its role and how it starts), started on ``Services``.

A stage module (``streams/*``, ``workers/*``) exposes one ``STAGE = StageSpec(...)``; its
``start`` builds the stage's handler from ``Services`` (the engine's parameters from the
settings, its batch sizes and timers) and registers it on one of ``streaming.stage``'s
loops. ``memstream.wiring.STAGES`` is the one table of them, started in its order for the
roles a process plays: a new stage is one module and one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import faust

from memstream.metrics import Metrics, StageSeries
from memstream.roles import StageRole
from memstream.settings import Settings
from memstream.stores.llm import Consolidator
from memstream.stores.longterm import LongTermStore
from memstream.stores.short_term import ShortTermState
from memstream.stores.text_encoder import TextEncoder
from memstream.streaming.broker import Topics
from memstream.streaming.locks import UserLocks
from memstream.streaming.stage import Stage


@dataclass(frozen=True)
class Services:
    """What the stages of one process share: the stores and the app they register on, and
    the objects a role's stages share, built once before any stage starts."""

    # Whole, unlike the adapters' sections: the stages between them read seven of its
    # sections (the engines' parameters, batch sizes, timers), each stage its own few.
    settings: Settings
    metrics: Metrics
    encoder: TextEncoder
    state: ShortTermState
    longterm: LongTermStore
    app: faust.App
    topics: Topics
    # The consolidate role's: consolidation, strength upkeep and reminders write long-term
    # memories under the same per-user locks; the consolidator is None where the process
    # does not play the role.
    locks: UserLocks
    consolidator: Consolidator | None = None

    def stage(self, name: str, source: faust.TopicT) -> Stage:
        """The stage ``name`` reading ``source``, dead-lettering to ``memstream.dlq``."""
        return Stage(name, source, self.topics.dlq, self.metrics, declared=self.topics.declared)

    def role_consolidator(self) -> Consolidator:
        """The consolidate role's consolidator (an error where it was not built)."""
        if self.consolidator is None:
            raise RuntimeError("the consolidate role's stages start without a consolidator")
        return self.consolidator


@dataclass(frozen=True)
class StageSpec:
    """One stage: the role whose processes run it, how it starts (registers its agents and
    timers on ``Services.app``), and the series its metrics carry, exported at zero by every
    process that runs it."""

    role: StageRole
    start: Callable[[Services], None]
    series: tuple[StageSeries, ...]
