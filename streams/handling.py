"""How a processor survives bad messages and outages without losing or blocking anything.

- A message that does not validate goes to the DLQ at once, with the reason.
- A message whose handling raises goes to the DLQ after ``max_attempts`` tries (poison).
- An outage of a store (connection errors, timeouts) is retried with capped backoff for as
  long as it lasts: the partition waits, nothing is acknowledged past it, nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import faust
from pydantic import BaseModel, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.logs import event_id_of
from memstream.metrics import Metrics
from schemas import DeadLetter

log = logging.getLogger("memstream.streams")
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    OSError,
    RedisConnectionError,
    RedisTimeoutError,
)
MAX_BACKOFF_S = 5.0


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{where}: {err['msg']}")
    return "invalid message: " + "; ".join(parts)


class DeadLetters:
    """One stage's way to ``memstream.dlq``: every letter names the stage, topic and reason."""

    def __init__(
        self, dlq: faust.TopicT, metrics: Metrics, *, stage: str, source: faust.TopicT
    ) -> None:
        self.dlq = dlq
        self.metrics = metrics
        self.stage = stage
        self.source_topic = source.get_topic_name()

    async def decode(self, model: type[M], key: bytes | None, value: bytes) -> M | None:
        """The message as ``model``, or None once it has been dead-lettered as invalid."""
        try:
            return model.model_validate_json(value)
        except ValidationError as exc:
            await self.send(describe_validation_error(exc), key, value, reason_class="validation")
            return None

    async def poison(self, exc: BaseException, key: bytes | None, value: bytes) -> None:
        """A valid message whose handling kept failing: park it, let the partition go on."""
        await self.send(f"{self.stage} failed: {exc!r}", key, value, reason_class="poison")

    async def send(
        self, reason: str, key: bytes | None, value: bytes, *, reason_class: str
    ) -> None:
        stage = self.stage
        letter = DeadLetter(
            stage=stage,
            reason=reason[:2000],
            topic=self.source_topic,
            key=key.decode("utf-8", "replace") if key else None,
            original=value.decode("utf-8", "replace")[:100_000],
            ts=datetime.now(UTC),
        )
        await self.dlq.send(key=key, value=letter.model_dump_json().encode())
        self.metrics.dlq.labels(stage, reason_class).inc()
        self.metrics.events.labels(stage, "dlq").inc()
        log.warning(
            "dead-lettered",
            extra={"stage": stage, "reason": letter.reason, "event_id": event_id_of(value)},
        )


async def with_retries(
    work: Callable[[], Awaitable[T]],
    *,
    stage: str,
    max_attempts: int = 3,
) -> T:
    """Run ``work``; wait out outages indefinitely, give up on other errors after max_attempts."""
    attempt = 0
    backoff = 0.1
    while True:
        try:
            return await work()
        except OUTAGE_ERRORS as exc:
            log.warning("store unavailable in %s, retrying in %.1fs: %r", stage, backoff, exc)
        except Exception:
            attempt += 1
            if attempt >= max_attempts:
                raise
            log.exception("error in %s (attempt %d of %d)", stage, attempt, max_attempts)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
