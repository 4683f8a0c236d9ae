"""The stage runtime: how every processor and worker survives bad messages and outages.

A stage is a handler plus one of four loops, which hold the rest once:

- ``Stage.per_message``: decode each message, run the handler, count its outcome;
- ``Stage.batched``: decode a batch (``take_events``), run the handler on what decoded,
  count how many it handled;
- ``Stage.pipelined``: as ``batched``, the handler in two halves, batch N+1's first half
  (the encoder's run) overlapping batch N's second (its sends);
- ``periodic``: a timer job that must outlive a bad run.

The rules, the same for every stage:

- A message that does not validate goes to the DLQ at once, with the reason (or, for a
  stage that only follows a topic another stage dead-letters, is counted as skipped).
- A message whose handling raises goes to the DLQ after ``max_attempts`` tries (poison),
  and the partition goes on.
- An outage of a store (connection errors, timeouts, a Qdrant or HTTP service that cannot
  be reached or answers 429/502/503/504) is retried with capped backoff for as long as it
  lasts: the partition waits, nothing is acknowledged past it, nothing is lost.
- Every retry counts in ``memstream_retries_total{stage, kind}``: an outage shows there.

A handler retries its own steps (``Stage.retry``): only it knows which of them may run
twice (a trigger already delivered must not be sent again by a retry of the whole event).
Offsets are faust's: a message is acknowledged once its handler has returned (the
pipelined loop: once its batch's sends are in the producer, which faust flushes before it
commits), in order, so a crash re-delivers everything whose handler had not returned (at
least once; handlers are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any, Generic, Literal, TypeVar, cast

import faust
import httpx
from faust.types import EventT
from pydantic import BaseModel, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.logs import event_id_of
from memstream.metrics import DLQ_REASONS, Metrics
from memstream.schemas import DeadLetter
from memstream.schemas.identity import key_problem
from memstream.streaming.broker import Taken, every, take_events, take_ready, take_ready_deferred

log = logging.getLogger("memstream.streams")
workers_log = logging.getLogger("memstream.workers")  # the periodic jobs are the workers'
T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")
M = TypeVar("M", bound=BaseModel)

# -- outage or bad message ----------------------------------------------------------------

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
        status = _qdrant_client_status(current)
        if status is not None:  # qdrant-client: the server answered
            return status in UNAVAILABLE_STATUS
        source = getattr(current, "source", None)
        current = source if isinstance(source, BaseException) else current.__cause__
        seen += 1
    return False


def _qdrant_client_status(error: BaseException) -> int | None:
    """The HTTP status of a qdrant-client ``UnexpectedResponse``, else None.

    Looked up, not imported: a process on Qdrant Edge never loads qdrant-client, and
    importing it here cost every process ~37 MiB RSS (grpc, protobuf, its pydantic
    models; issue 14). An error of its type can only exist once it is loaded.
    """
    exceptions = sys.modules.get("qdrant_client.http.exceptions")
    if exceptions is None or not isinstance(error, exceptions.UnexpectedResponse):
        return None
    return int(error.status_code)


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


# -- decoding -----------------------------------------------------------------------------

# Records that two stages of a process read are validated once: memorize and the archive
# both follow memstream.encoded in one consumer, and faust hands each the same bytes (an
# EncodedEvent's 384 floats cost ~25 us to validate). Models are frozen, so sharing one is
# safe; the memo holds the archive's lag behind memorize (its batches: up to 0.5 s).
DECODED_MEMO = 512


@lru_cache(maxsize=DECODED_MEMO)
def _validated(model: type[BaseModel], raw: bytes) -> BaseModel:
    return model.model_validate_json(raw)  # an error is raised, never cached


def validated(model: type[M], raw: bytes) -> M:
    """``model.model_validate_json(raw)``, memoised on the record's bytes (raises the same)."""
    return cast(M, _validated(model, raw))


class MisKeyed(ValueError):
    """A valid body under a key that is missing, malformed or another user's."""


def keyed(model: type[M], key: bytes | None, raw: bytes) -> M:
    """``validated``, and the record's key is its body's user (``schemas.identity``)."""
    value = validated(model, raw)
    owner: str | None = getattr(value, "user_key", None)  # the models of per-user topics
    if owner is not None and (problem := key_problem(key, owner)):
        raise MisKeyed(problem)
    return value


# -- dead letters -------------------------------------------------------------------------

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
            return keyed(model, key, value)
        except ValidationError as exc:
            await self.send(describe_invalid(exc, value), key, value, reason_class="validation")
        except MisKeyed as exc:
            await self.send(str(exc), key, value, reason_class="validation")
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


# -- the loops ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Received(Generic[M]):
    """A decoded message with its key and raw value (what a dead letter carries), and when
    the broker took the record in (its timestamp, epoch seconds; None when not known)."""

    value: M
    key: bytes | None
    raw: bytes
    arrived: float | None = None


def arrival(message: EventT[bytes]) -> float | None:
    """The record's timestamp: when its producer sent it (the encode stage passes its
    source record's on, so ``memstream.encoded`` carries when the event reached memstream)."""
    stamp = getattr(getattr(message, "message", None), "timestamp", None)
    return float(stamp) if stamp else None


# What a per-message handler did with its message: counted in memstream_events_total.
Outcome = Literal["ok", "skipped", "duplicate"]
OnMessage = Callable[[Received[M]], Awaitable[Outcome]]
# A batched handler returns how many of its messages it handled (the rest it dead-lettered).
OnBatch = Callable[[list[Received[M]]], Awaitable[int]]
# A pipelined stage's two halves: the work off the event loop (the encoder's run), then the
# publishing on it, which returns how many of its messages it handled.
OnPrepare = Callable[[list[Received[M]]], Awaitable[P]]
OnPublish = Callable[[list[Received[M]], P], Awaitable[int]]
Invalid = Literal["dead-letter", "skip"]


class Stage:
    """One stage of the pipeline: its name, its source topic, its dead letters and metrics."""

    def __init__(
        self,
        name: str,
        source: faust.TopicT,
        dlq: faust.TopicT,
        metrics: Metrics,
        *,
        declared: asyncio.Event | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.metrics = metrics
        # The stage's agent takes its first message once the topics are declared
        # (``Topics.declared``); None: at once.
        self.declared = declared
        self.dead_letters = DeadLetters(dlq, metrics, stage=name, source=source)

    async def wait_declared(self) -> None:
        if self.declared is not None:
            await self.declared.wait()

    async def retry(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work`` under the retry policy: outages waited out, errors tried 3 times."""
        return await with_retries(work, stage=self.name, metrics=self.metrics)

    async def poison(self, exc: BaseException, item: Received[Any]) -> None:
        await self.dead_letters.poison(exc, item.key, item.raw)

    async def one_by_one(
        self,
        items: Sequence[Received[M]],
        work: Callable[[Received[M]], Awaitable[R]],
        *,
        retry: bool,
    ) -> list[tuple[Received[M], R]]:
        """``work`` on each item alone, after its batch failed as a whole: one bad message
        must not sink its batch-mates. An item whose work fails is dead-lettered as poison."""
        done: list[tuple[Received[M], R]] = []
        for item in items:
            call = partial(work, item)
            try:
                result = await (self.retry(call) if retry else call())
            except Exception as exc:
                await self.poison(exc, item)
                continue
            done.append((item, result))
        return done

    async def decode(
        self, model: type[M], message: EventT[bytes], invalid: Invalid = "dead-letter"
    ) -> Received[M] | None:
        key, raw = message.key, message.value
        if invalid == "skip":
            # Another stage dead-letters this topic's bad records: one letter per message.
            try:
                value = keyed(model, key, raw)
            except ValueError:
                self.metrics.events.labels(self.name, "skipped").inc()
                return None
            return Received(value, key, raw, arrival(message))
        decoded = await self.dead_letters.decode(model, key, raw)
        return None if decoded is None else Received(decoded, key, raw, arrival(message))

    async def handle_message(
        self, model: type[M], handle: OnMessage[M], message: EventT[bytes]
    ) -> None:
        """One turn of the per-message loop."""
        started = time.perf_counter()
        item = await self.decode(model, message)
        if item is None:
            return
        try:
            outcome = await handle(item)
        except Exception as exc:
            await self.poison(exc, item)
            return
        self.metrics.events.labels(self.name, outcome).inc()
        if outcome == "ok":
            self.metrics.stage_latency.labels(self.name).observe(time.perf_counter() - started)

    def observe_age(self, items: Sequence[Received[Any]], at: str) -> None:
        """Each item's age since its record reached memstream (the SRE's freshness: how long
        a turn waits in the topics and stages before it can be retrieved)."""
        now = time.time()
        series = self.metrics.event_age.labels(self.name, at)
        for item in items:
            if item.arrived is not None:
                series.observe(max(0.0, now - item.arrived))

    async def handle_batch(
        self,
        model: type[M],
        handle: OnBatch[M],
        batch: Sequence[EventT[bytes]],
        invalid: Invalid = "dead-letter",
    ) -> None:
        """One turn of the batched loop."""
        started = time.perf_counter()
        items = [item for m in batch if (item := await self.decode(model, m, invalid))]
        if not items:
            return
        self.observe_age(items, "taken")
        handled = await handle(items)
        self.observe_age(items, "done")
        self.metrics.events.labels(self.name, "ok").inc(handled)
        self.metrics.batch_size.labels(self.name).observe(len(batch))
        self.metrics.stage_latency.labels(self.name).observe(time.perf_counter() - started)

    def per_message(
        self, app: faust.App, model: type[M], handle: OnMessage[M], *, agent: str
    ) -> None:
        """Register the agent that runs ``handle`` on each message of the source topic."""

        @app.agent(self.source, name=agent)
        async def run(stream: faust.StreamT[bytes]) -> None:
            await self.wait_declared()
            async for message in stream.events():
                await self.handle_message(model, handle, message)

    def batched(
        self,
        app: faust.App,
        model: type[M],
        handle: OnBatch[M],
        *,
        agent: str,
        batch_size: int,
        within_s: float,
        invalid: Invalid = "dead-letter",
        eager: bool = False,
    ) -> None:
        """Register the agent that runs ``handle`` on batches of up to ``batch_size``
        messages, each flushed after ``within_s`` at the latest.

        ``eager``: hand over what has arrived as soon as the handler is free (batches
        form while it works; ``take_ready``) rather than wait ``within_s`` for a full
        batch: for the latency-bound stages, not for those whose batches save work.
        """
        take = take_ready if eager else take_events

        @app.agent(self.source, name=agent)
        async def run(stream: faust.StreamT[bytes]) -> None:
            await self.wait_declared()
            async for batch in take(stream, batch_size, within_s):
                await self.handle_batch(model, handle, batch, invalid)

    def pipelined(
        self,
        app: faust.App,
        model: type[M],
        prepare: OnPrepare[M, P],
        publish: OnPublish[M, P],
        *,
        agent: str,
        batch_size: int,
        within_s: float,
    ) -> None:
        """Register the agent that takes batches as ``batched(eager=True)`` does, and runs
        batch N+1's ``prepare`` while batch N's ``publish`` runs (``run_pipelined``)."""

        @app.agent(self.source, name=agent)
        async def run(stream: faust.StreamT[bytes]) -> None:
            await self.wait_declared()
            batches = take_ready_deferred(stream, batch_size, within_s)
            async with contextlib.aclosing(batches):
                await self.run_pipelined(model, prepare, publish, batches)

    async def run_pipelined(
        self,
        model: type[M],
        prepare: OnPrepare[M, P],
        publish: OnPublish[M, P],
        batches: AsyncIterator[Taken],
    ) -> None:
        """The pipelined loop: batch N+1's ``prepare`` overlaps batch N's ``publish``.

        The encode stage's encoder sat idle while the loop serialized and sent a batch's
        records and took the next batch (issue 14: busy ~60% of a stage busy 96%). Batches
        stay whole (the encoder runs each shortest text first) and one ``prepare`` runs at
        a time. At least once: a batch is acked only after its ``publish`` returned (its
        records are in the producer, which faust flushes before it commits), and in order;
        ``publish`` calls run one at a time in batch order, so records keep their order.
        """
        publishing: asyncio.Future[None] | None = None
        work: asyncio.Future[P] | None = None
        try:
            async for taken in batches:
                started = time.perf_counter()
                items = [item for m in taken.events if (item := await self.decode(model, m))]
                self.observe_age(items, "taken")
                work = asyncio.ensure_future(prepare(items)) if items else None
                if publishing is not None:
                    # Batch N's publish ends before batch N+1's starts (and is acked first).
                    await publishing
                    publishing = None
                if work is None:
                    await taken.ack()  # all dead-lettered: nothing to wait for
                    continue
                prepared = await work
                work = None
                publishing = asyncio.ensure_future(
                    self._publish(publish, items, prepared, taken, started)
                )
            if publishing is not None:
                await publishing
        finally:
            # Cancelled (stopping) or failed: what is still running is dropped, unacked,
            # so it is redelivered.
            for left in (work, publishing):
                if left is not None and not left.done():
                    left.cancel()

    async def _publish(
        self,
        publish: OnPublish[M, P],
        items: list[Received[M]],
        prepared: P,
        taken: Taken,
        started: float,
    ) -> None:
        handled = await publish(items, prepared)
        self.observe_age(items, "done")
        await taken.ack()
        self.metrics.events.labels(self.name, "ok").inc(handled)
        self.metrics.batch_size.labels(self.name).observe(len(taken.events))
        self.metrics.stage_latency.labels(self.name).observe(time.perf_counter() - started)


def periodic(
    app: faust.App,
    metrics: Metrics,
    job: Callable[[], Awaitable[int]],
    *,
    stage: str,
    every_s: float,
    name: str,
) -> None:
    """Run ``job`` every ``every_s`` seconds; it returns how many things it changed.

    A periodic job must outlive a bad run: the error is logged and counted, and the next
    run catches up.
    """

    async def run() -> None:
        started = time.perf_counter()
        try:
            changed = await job()
        except Exception:
            workers_log.exception("%s run failed", stage)
            metrics.events.labels(stage, "error").inc()
            return
        metrics.events.labels(stage, "ok").inc(changed)
        metrics.stage_latency.labels(stage).observe(time.perf_counter() - started)

    every(app, every_s, run, name=name)
