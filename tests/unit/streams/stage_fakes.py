"""Fake topics for driving one turn of a stage's loop in a unit test (no broker), and a fake
feed of batches for the pipelined loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, Literal, cast

from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.schemas import DeadLetter
from memstream.schemas.identity import user_key
from memstream.streaming.broker import Taken
from memstream.streaming.stage import Stage


class RecordingTopic:
    """What a stage needs of a faust topic: its name, and ``send``, recorded in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes | None, bytes]] = []
        self.timestamps: list[float | None] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(
        self, *, key: bytes | None, value: bytes, timestamp: float | None = None
    ) -> None:
        self.sent.append((key, value))
        self.timestamps.append(timestamp)

    def letters(self) -> list[DeadLetter]:
        return [DeadLetter.model_validate_json(v) for _, v in self.sent]


ARRIVED = 1_714_564_800.0  # every fake record's broker timestamp


def message(value: bytes | None, key: bytes | Literal["owner"] | None = "owner") -> Any:
    """A consumed record as the loops read it (``key``, ``value``); keyed by default as a
    producer keys it: the body's user (``schemas.identity.user_key``) when it names one."""
    if key == "owner":
        key = _owner_key(value)
    return SimpleNamespace(key=key, value=value, message=SimpleNamespace(timestamp=ARRIVED))


def _owner_key(value: bytes | None) -> bytes:
    try:
        doc = json.loads(value or b"")
        doc = doc.get("event", doc)
        return user_key(doc["tenant_id"], doc["user_id"]).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return b"acme:u1"


def stage(name: str, source: str) -> tuple[Stage, RecordingTopic, Metrics]:
    """A stage reading ``source``, with its DLQ topic and a fresh metrics registry."""
    dlq, metrics = RecordingTopic("memstream.dlq"), Metrics(CollectorRegistry())
    return Stage(name, cast(Any, RecordingTopic(source)), cast(Any, dlq), metrics), dlq, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


class AckingStream:
    """What ``Taken.ack`` needs of a faust stream: ``ack``, recorded in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def ack(self, event: Any) -> bool:
        self.log.append(f"ack {event.name}")
        return True


class Feed:
    """Batches handed to the loop one at a time, when the test says so."""

    def __init__(self, log: list[str]) -> None:
        self.queue: asyncio.Queue[Taken | None] = asyncio.Queue()
        self.stream = AckingStream(log)

    def put(self, name: str, *values: bytes) -> None:
        events = [
            SimpleNamespace(name=f"{name}{i}", **vars(message(v))) for i, v in enumerate(values)
        ]
        self.queue.put_nowait(Taken(cast(Any, events), cast(Any, self.stream)))

    def end(self) -> None:
        self.queue.put_nowait(None)

    async def batches(self) -> AsyncIterator[Taken]:
        while (taken := await self.queue.get()) is not None:
            yield taken
