"""How a processor survives bad messages and outages without losing or blocking anything.

- A message that does not validate goes to the DLQ at once, with the reason.
- A message whose handling raises goes to the DLQ after ``max_attempts`` tries (poison).
- An outage of a store (connection errors, timeouts, a Qdrant or HTTP service that cannot
  be reached or answers 429/502/503/504) is retried with capped backoff for as long as it
  lasts: the partition waits, nothing is acknowledged past it, nothing is lost.
- Every retry counts in ``memstream_retries_total{stage, kind}``: an outage shows there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import faust
import httpx
from pydantic import BaseModel, ValidationError
from qdrant_client.http.exceptions import UnexpectedResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.logs import event_id_of
from memstream.metrics import DLQ_REASONS, Metrics
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
    httpx.TransportError,  # connect/read/write errors and timeouts of any HTTP store
)
# Answers that mean "not now" rather than "never": a server overloaded, restarting or
# behind a proxy that lost it.
UNAVAILABLE_STATUS = frozenset({429, 502, 503, 504})
MAX_BACKOFF_S = 5.0
RETRY_KINDS = ("outage", "error")


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says a store is unreachable (wait it out) rather than the message is bad.

    Clients wrap transport errors: qdrant-client raises ``ResponseHandlingException`` with the
    httpx error in ``.source``; others chain it as ``__cause__``. Only explicit wrapping is
    followed, not ``__context__``: an error raised while handling an outage is its own error.
    """
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if isinstance(current, OUTAGE_ERRORS):
            return True
        if isinstance(current, UnexpectedResponse):  # qdrant-client: the server answered
            return current.status_code in UNAVAILABLE_STATUS
        source = getattr(current, "source", None)
        current = source if isinstance(source, BaseException) else current.__cause__
        seen += 1
    return False


MAX_REASON_CHARS = 2000
MAX_ORIGINAL_CHARS = 100_000


def describe_invalid(exc: ValidationError, value: bytes) -> str:
    """A dead letter's reason for a value that does not validate, naming each bad field.

    An empty value gets its own words: the JSON parser would call it "EOF ... column 0".
    """
    if not value.strip():
        return "empty value" if not value else "empty value (whitespace only)"
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"])
        # A whole-value error (not JSON, not an object) has no field to name.
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "invalid message: " + "; ".join(parts)


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, saying so at its end when it had to be cut."""
    if len(text) <= limit:
        return text
    marker = f" …[cut: {len(text)} characters in all]"
    return text[: max(limit - len(marker), 0)] + marker


class DeadLetters:
    """One stage's way to ``memstream.dlq``: every letter names the stage, topic and reason."""

    def __init__(
        self, dlq: faust.TopicT, metrics: Metrics, *, stage: str, source: faust.TopicT
    ) -> None:
        self.dlq = dlq
        self.metrics = metrics
        self.stage = stage
        self.source_topic = source.get_topic_name()
        # Exported at 0 from the start, so that an outage shows as a rise, not a new series.
        for kind in RETRY_KINDS:
            metrics.retries.labels(stage, kind)
        for reason_class in DLQ_REASONS:  # the first dead letter must be a rise for rate()
            metrics.dlq.labels(stage, reason_class)
        metrics.events.labels(stage, "dlq")

    async def decode(self, model: type[M], key: bytes | None, value: bytes | None) -> M | None:
        """The message as ``model``, or None once it has been dead-lettered as invalid."""
        if value is None:  # a null record (a Kafka tombstone): faust hands it over as None
            await self.send("empty value (null record)", key, b"", reason_class="validation")
            return None
        try:
            return model.model_validate_json(value)
        except ValidationError as exc:
            await self.send(describe_invalid(exc, value), key, value, reason_class="validation")
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
            reason=cut(reason, MAX_REASON_CHARS),
            topic=self.source_topic,
            key=key.decode("utf-8", "replace") if key else None,
            original=cut(value.decode("utf-8", "replace"), MAX_ORIGINAL_CHARS),
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
    metrics: Metrics | None = None,
) -> T:
    """Run ``work``; wait out outages indefinitely, give up on other errors after max_attempts."""
    attempt = 0
    backoff = 0.1
    while True:
        try:
            return await work()
        except Exception as exc:
            if is_outage(exc):
                kind = "outage"
                log.warning("store unavailable in %s, retrying in %.1fs: %r", stage, backoff, exc)
            else:
                attempt += 1
                if attempt >= max_attempts:
                    raise
                kind = "error"
                log.exception("error in %s (attempt %d of %d)", stage, attempt, max_attempts)
        if metrics is not None:
            metrics.retries.labels(stage, kind).inc()
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
