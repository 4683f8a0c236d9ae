"""The ``control`` processor: operator and API commands every stage obeys.

``forget_user`` is published by ``DELETE /v1/users/{user}`` (and ``memstream forget``) after
the RPC has already deleted the user. Handling it here again makes the forget stick against
what was in flight: the tombstone makes ``memorize`` drop the user's events stamped before
the forget (in the topics, or replayed later), and the deletes sweep whatever a processor
wrote between the RPC's delete and now. Every step is idempotent, so a redelivered command
changes nothing. ``pin_memory`` is left to the consolidation workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import faust

from memstream.metrics import Metrics
from schemas import Control
from stores.longterm import LongTermStore
from stores.redis_state import RedisState
from streams.app import Topics
from streams.handling import DeadLetters, with_retries

STAGE = "control"


@dataclass(frozen=True)
class Forgotten:
    redis_keys_deleted: int
    memories_deleted: int
    turns_deleted: int = 0  # archived turns


async def forget_user(
    state: RedisState, longterm: LongTermStore, tenant_id: str, user_id: str, at: float
) -> Forgotten:
    """Tombstone first (so nothing new is memorized or archived meanwhile), then delete
    everywhere: short-term turns, clusters, recurrence counters and pending triggers in
    Redis, the user's memories and archived turns in the long-term store."""
    await state.mark_forgotten(tenant_id, user_id, at)
    keys = await state.delete_user(tenant_id, user_id)
    memories = await longterm.delete_user(tenant_id, user_id)
    turns = await longterm.delete_turns(tenant_id, user_id)
    return Forgotten(keys, memories, turns)


def register_control(
    app: faust.App,
    topics: Topics,
    state: RedisState,
    longterm: LongTermStore,
    metrics: Metrics,
) -> None:
    dead_letters = DeadLetters(topics.dlq, metrics, stage=STAGE, source=topics.control)

    @app.agent(topics.control, name="memstream.control")
    async def control(stream: faust.StreamT[bytes]) -> None:
        async for message in stream.events():
            started = time.perf_counter()
            command = await dead_letters.decode(Control, message.key, message.value)
            if command is None:
                continue
            if command.action != "forget_user":
                metrics.events.labels(STAGE, "skipped").inc()
                continue
            try:
                await with_retries(
                    partial(
                        forget_user,
                        state,
                        longterm,
                        command.tenant_id,
                        command.user_id,
                        command.ts.timestamp(),
                    ),
                    stage=STAGE,
                    metrics=metrics,
                )
            except Exception as exc:
                await dead_letters.poison(exc, message.key, message.value)
                continue
            metrics.events.labels(STAGE, "ok").inc()
            metrics.stage_latency.labels(STAGE).observe(time.perf_counter() - started)
