"""The stage table (``wiring.STAGES``): each stage starts from ``Services`` alone, a role's
stages register their agents and timers in the table's order, and a consolidate stage
started without the role's consolidator says so."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.settings import Settings
from memstream.stores.llm import ExtractiveConsolidator
from memstream.stores.qdrant_client_store import QdrantClientStore
from memstream.streaming import stage as stage_module
from memstream.streaming.broker import create_app, create_topics
from memstream.streaming.locks import UserLocks
from memstream.streaming.services import Services
from memstream.wiring import STAGES
from memstream.workers import consolidate
from tests.fakes import FakeShortTermState, HashEncoder

AGENTS = {
    "process": ["memstream.encode", "memstream.memorize", "memstream.control"],
    "consolidate": ["memstream.consolidate", "memstream.archive", "memstream.feedback"],
}
TIMERS = {"process": [], "consolidate": ["memstream.decay", "memstream.reminders"]}


def services(*, consolidator: bool = True) -> Services:
    settings = Settings()
    app = create_app(
        settings.kafka,
        app_id="stage-table-test",
        broker_url="kafka://localhost:9",
        data_dir=settings.data_dir,
    )
    return Services(
        settings=settings,
        metrics=Metrics(CollectorRegistry()),
        encoder=HashEncoder(),
        state=FakeShortTermState(),
        longterm=QdrantClientStore(":memory:", "memories"),  # nothing opened until used
        app=app,
        topics=create_topics(app, settings.kafka),
        locks=UserLocks(),
        consolidator=ExtractiveConsolidator() if consolidator else None,
    )


@pytest.mark.parametrize("role", ["process", "consolidate"])
def test_a_roles_stages_start_in_the_tables_order(
    role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    timers: list[str | None] = []

    def every(app: Any, interval_s: float, job: Any, *, name: str | None = None) -> None:
        timers.append(name)

    monkeypatch.setattr(stage_module, "every", every)
    s = services()
    for spec in STAGES:
        if spec.role == role:
            spec.start(s)
    assert list(s.app.agents) == AGENTS[role]
    assert timers == TIMERS[role]


def test_a_consolidate_stage_needs_the_roles_consolidator() -> None:
    with pytest.raises(RuntimeError, match="consolidator"):
        consolidate.STAGE.start(services(consolidator=False))
