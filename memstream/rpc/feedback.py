"""Reporting what a retrieval used to ``memstream.feedback``, off the reply's path.

The reply never waits for the broker: ``offer`` puts the ``Feedback`` on a bounded queue and
returns; one background task drains it. When the broker is slow or down and the queue is
full, feedback is dropped (and counted in ``dropped``): a strength boost lost is cheaper
than a bot kept waiting. Keyed ``tenant:user`` like every topic, so the memorize processor
that owns the user applies the boost (one writer per user).

The drain publishes what gathered within ``linger_s`` of the first item as one batch: one
produce request (and one broker wake-up) per batch, not per retrieval. One request per
retrieval cost the serve process a socket round trip, and the broker its work, right while
the next query was encoding on the same two cores. A boost applied 20 ms later changes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from memstream.schemas import Feedback
from memstream.streaming.broker import EventPublisher

log = logging.getLogger("memstream.rpc")
LINGER_S = 0.02  # how long the drain gathers feedback after the first before publishing
MAX_BATCH = 512  # feedback records per publish


class FeedbackSink:
    def __init__(
        self,
        publisher: EventPublisher,
        topic: str,
        *,
        max_pending: int = 10_000,
        linger_s: float = LINGER_S,
    ) -> None:
        self.publisher = publisher
        self.topic = topic
        self.linger_s = linger_s
        self._queue: asyncio.Queue[Feedback] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0
        self._closed = False

    def offer(self, feedback: Feedback) -> bool:
        """Queue it for publishing; False (and dropped) when the queue is full or closed."""
        if not feedback.memory_ids and not feedback.turn_ids:
            return True
        if self._closed:  # its publisher may be closed too: a late reply reports nothing
            self.dropped += 1
            return False
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())
        try:
            self._queue.put_nowait(feedback)
        except asyncio.QueueFull:
            self.dropped += 1
            return False
        return True

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            try:
                if self.linger_s > 0:
                    await asyncio.sleep(self.linger_s)
                while len(batch) < MAX_BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                await self.publisher.publish_many(
                    self.topic,
                    [(f.user_key, f.model_dump_json().encode()) for f in batch],
                )
                self.sent += len(batch)
            except Exception as exc:  # the broker's trouble must not end the drain
                self.dropped += len(batch)
                log.warning("feedback not published: %r", exc)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until what was offered so far is published (tests, shutdown)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)

    async def close(self) -> None:
        """Publish what was offered, then refuse more; before the publisher closes."""
        self._closed = True
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
