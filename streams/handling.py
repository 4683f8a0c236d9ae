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
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.logs import event_id_of
from memstream.metrics import Metrics
from schemas import DeadLetter

log = logging.getLogger("memstream.streams")
T = TypeVar("T")

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
    """Sends undeliverable messages to ``memstream.dlq`` with their reason."""

    def __init__(self, topic: faust.TopicT, metrics: Metrics) -> None:
        self.topic = topic
        self.metrics = metrics

    async def send(
        self,
        *,
        stage: str,
        reason: str,
        source_topic: str,
        key: bytes | None,
        value: bytes,
        reason_class: str,
    ) -> None:
        letter = DeadLetter(
            stage=stage,
            reason=reason[:2000],
            topic=source_topic,
            key=key.decode("utf-8", "replace") if key else None,
            original=value.decode("utf-8", "replace")[:100_000],
            ts=datetime.now(UTC),
        )
        await self.topic.send(key=key, value=letter.model_dump_json().encode())
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
