"""Periodic samples behind the gauges of ``memstream.metrics``: consumer lag, Redis and Qdrant.

Registered as faust timers by ``register_samplers``: a process with the ``process`` role
samples its consumer lag and the Redis state gauges, one with the ``consolidate`` role its
lag, the long-term gauge and the LLM token counters. A failed sample is counted and logged;
it never stops the process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection, Iterable, Mapping
from typing import cast

import faust
from faust.types import TP

from memstream.metrics import Metrics, StageSeries
from memstream.schemas.identity import parse_user_key
from memstream.stores.llm import Consolidator
from memstream.stores.longterm import LongTermStore
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import every

log = logging.getLogger("memstream.sampling")

# Beyond this many users, cluster and turn totals are estimated from a random sample.
STATE_SAMPLE_USERS = 1000


def is_internal_topic(name: str) -> bool:
    """Kafka's own (``__consumer_offsets``) and faust's (``<app>-__assignor-__leader``) topics:
    bookkeeping that nobody processes, so their "lag" is noise on the dashboard."""
    return name.startswith("__") or "-__" in name


def lag_by_partition(
    highwaters: dict[TP, int], committed: dict[TP, int | None], earliest: dict[TP, int]
) -> dict[TP, int]:
    """Messages not yet committed per partition; with no commit yet, all since the earliest."""
    lag: dict[TP, int] = {}
    for tp, high in highwaters.items():
        done = committed.get(tp)
        start = done if done is not None else earliest.get(tp, 0)
        lag[tp] = max(0, int(high) - int(start))
    return lag


class LagSampler:
    """Sets ``memstream_consumer_lag`` for every partition the app's consumer owns."""

    def __init__(self, app: faust.App, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._seen: set[tuple[str, str, str]] = set()

    async def sample(self) -> None:
        consumer = self.app.consumer
        assigned = sorted(tp for tp in consumer.assignment() if not is_internal_topic(tp.topic))
        lag: dict[TP, int] = {}
        if assigned:
            highwaters = dict(await consumer.highwaters(*assigned))
            offsets: Mapping[TP, int | None] = getattr(consumer, "_committed_offset", {})
            committed = {tp: offsets.get(tp) for tp in assigned}
            missing = [tp for tp in assigned if committed[tp] is None]
            earliest = dict(await consumer.earliest_offsets(*missing)) if missing else {}
            lag = lag_by_partition(highwaters, committed, earliest)
        self._publish(lag.items())

    def _publish(self, lag: Iterable[tuple[TP, int]]) -> None:
        group = str(self.app.conf.id)
        now: set[tuple[str, str, str]] = set()
        for tp, value in lag:
            labels = (group, tp.topic, str(tp.partition))
            self.metrics.consumer_lag.labels(*labels).set(value)
            now.add(labels)
        for gone in self._seen - now:  # partitions moved to another process
            self.metrics.consumer_lag.remove(*gone)
        self._seen = now


async def sample_state(state: RedisState, metrics: Metrics) -> None:
    """Users, clusters and short-term turns in Redis (estimated beyond STATE_SAMPLE_USERS)."""
    users_key = f"{state.prefix}:users"
    total_users = int(await state.redis.scard(users_key))
    # Every member when they are few, a random sample (without repeats) when they are many.
    wanted = min(total_users, STATE_SAMPLE_USERS)
    members = cast(list[bytes], await state.redis.srandmember(users_key, wanted) if wanted else [])
    pipe = state.redis.pipeline(transaction=False)
    for member in members:
        tenant, user = parse_user_key(member.decode())
        pipe.hlen(state._key(tenant, user, "clusters"))
        pipe.zcard(state._key(tenant, user, "timeline"))
    counts = await pipe.execute() if members else []
    clusters, turns = sum(counts[0::2]), sum(counts[1::2])
    scale = total_users / len(members) if members else 0.0
    metrics.users.set(total_users)
    metrics.clusters.set(round(clusters * scale))
    metrics.shortterm_turns.set(round(turns * scale))


class LLMUsageSampler:
    """Moves the LLM token counters by what the consolidator's running totals grew."""

    def __init__(self, consolidator: Consolidator, metrics: Metrics) -> None:
        self.consolidator = consolidator
        self.metrics = metrics
        self._last = {"prompt": 0, "completion": 0}
        for kind in self._last:  # present from the start, at zero
            metrics.llm_tokens.labels(consolidator.name, kind)

    def sample(self) -> None:
        usage = self.consolidator.usage
        for kind, total in (
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
        ):
            grown = total - self._last[kind]
            if grown > 0:
                self.metrics.llm_tokens.labels(self.consolidator.name, kind).inc(grown)
            self._last[kind] = total


def register_samplers(
    app: faust.App,
    metrics: Metrics,
    roles: Collection[str],
    *,
    interval_s: float,
    state: RedisState,
    longterm: LongTermStore,
    consolidator: Consolidator | None = None,
    stages: Iterable[StageSeries] = (),
) -> None:
    """Timers that keep the sampled gauges current in a process playing ``roles`` and
    running ``stages``."""
    lag = LagSampler(app, metrics)
    usage = LLMUsageSampler(consolidator, metrics) if consolidator is not None else None
    metrics.declare_roles(roles, stages)
    for sampler in ("lag", "state", "longterm"):  # present from the start, at zero
        metrics.sample_errors.labels(sampler)
    if "consolidate" in roles and consolidator is not None:
        metrics.llm_calls.labels(consolidator.name, "ok")
        metrics.llm_calls.labels(consolidator.name, "error")

    async def guarded(name: str, coro: Awaitable[object]) -> None:
        try:
            await coro
        except Exception as exc:
            metrics.sample_errors.labels(name).inc()
            log.debug("sampling %s failed: %r", name, exc)

    async def sample_gauges() -> None:
        if app.consumer is not None and any(r in roles for r in ("process", "consolidate")):
            await guarded("lag", lag.sample())
        if "process" in roles:
            await guarded("state", sample_state(state, metrics))
        if "consolidate" in roles:
            await guarded("longterm", _sample_longterm(longterm, metrics))
            if usage is not None:
                usage.sample()

    every(app, interval_s, sample_gauges)


async def _sample_longterm(longterm: LongTermStore, metrics: Metrics) -> None:
    metrics.memories.set(await longterm.count())
