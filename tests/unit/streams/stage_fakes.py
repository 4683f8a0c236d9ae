"""Fake topics for driving one turn of a stage's loop in a unit test (no broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from schemas import DeadLetter
from stores.stage import Stage


class RecordingTopic:
    """What a stage needs of a faust topic: its name, and ``send``, recorded in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes | None, bytes]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes) -> None:
        self.sent.append((key, value))

    def letters(self) -> list[DeadLetter]:
        return [DeadLetter.model_validate_json(v) for _, v in self.sent]


def message(value: bytes | None, key: bytes | None = b"acme:u1") -> Any:
    """A consumed record as the loops read it (``key``, ``value``)."""
    return SimpleNamespace(key=key, value=value)


def stage(name: str, source: str) -> tuple[Stage, RecordingTopic, Metrics]:
    """A stage reading ``source``, with its DLQ topic and a fresh metrics registry."""
    dlq, metrics = RecordingTopic("memstream.dlq"), Metrics(CollectorRegistry())
    return Stage(name, cast(Any, RecordingTopic(source)), cast(Any, dlq), metrics), dlq, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found
