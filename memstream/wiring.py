"""The composition root: settings in, a running process's dependencies out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty); ``build_app`` builds one faust app with the agents of the roles a
process plays, each wired to its stores. Nothing here holds an algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Literal

import faust

from memory.clustering import ClusterParams
from memory.links import LinkParams
from memory.recurrence import RecurrenceParams
from memory.strength import StrengthParams
from memstream.metrics import Metrics
from memstream.sampling import register_samplers
from memstream.settings import ClusterSettings, QdrantSettings, Settings
from stores.broker import Topics, create_app, create_topics, on_start
from stores.embedded import EmbeddedBroker, EmbeddedRedis
from stores.encoder import OnnxEncoder
from stores.llm import Consolidator, consolidator_from_settings
from stores.longterm import LongTermStore, open_longterm
from stores.redis_state import RedisState
from streams.control import register_control
from streams.encode import register_encode
from streams.memorize import Memorizer, register_memorize
from workers.archive import ArchiveWorker, register_archive
from workers.consolidate import ConsolidationWorker, register_consolidate
from workers.locks import UserLocks
from workers.reminders import ReminderWorker, register_reminders
from workers.strength import StrengthWorker, register_strength

log = logging.getLogger("memstream")

Role = Literal["process", "consolidate", "serve"]
ALL_ROLES: frozenset[Role] = frozenset({"process", "consolidate", "serve"})

# How a process opens its long-term store. The seam for fault injection: the reliability
# suite passes a wrapper of ``open_longterm`` whose store can be switched unreachable.
LongTermOpener = Callable[[QdrantSettings, Path], LongTermStore]


@dataclass
class Stack:
    """Where the broker and Redis are; embedded services are started and owned here."""

    broker_url: str
    redis_url: str
    embedded: list[EmbeddedBroker | EmbeddedRedis] = field(default_factory=list)

    @classmethod
    def start(cls, settings: Settings) -> Stack:
        stack = cls(settings.kafka.broker, settings.redis.url)
        try:
            if not stack.broker_url:
                broker = EmbeddedBroker(settings.data_dir / "broker").start()
                stack.embedded.append(broker)
                stack.broker_url = broker.url
            if not stack.redis_url:
                redis = EmbeddedRedis(settings.data_dir / "redis").start()
                stack.embedded.append(redis)
                stack.redis_url = redis.url
        except Exception:
            stack.stop()
            raise
        return stack

    def stop(self) -> None:
        for service in reversed(self.embedded):
            service.stop()
        self.embedded.clear()


def cluster_params(c: ClusterSettings) -> ClusterParams:
    return ClusterParams(
        merge_threshold=c.merge_threshold,
        create_threshold=c.create_threshold,
        buffer_size=c.buffer_size,
        buffer_max_age_s=c.buffer_max_age_s,
        maintain_every=c.maintain_every,
        cluster_merge_threshold=c.cluster_merge_threshold,
        split_min_size=c.split_min_size,
        split_dispersion=c.split_dispersion,
        energy_half_life_days=c.energy_half_life_days,
        archive_energy=c.archive_energy,
        merge_threshold_max=c.merge_threshold_max,
        create_threshold_min=c.create_threshold_min,
        description_keywords=c.description_keywords,
    )


def strength_params(settings: Settings) -> StrengthParams:
    m = settings.maintenance
    return StrengthParams(
        boost=m.strength_boost,
        decay=m.strength_decay,
        floor=m.strength_floor,
        interval_s=m.decay_interval_s,
    )


def open_state(settings: Settings, redis_url: str) -> RedisState:
    r = settings.redis
    return RedisState.from_url(
        redis_url,
        prefix=r.prefix,
        tombstone_prefix=r.tombstone_prefix or r.prefix,
        ttl_days=r.short_term_ttl_days,
        max_turns=r.short_term_max_turns,
        processed_ttl_days=r.processed_ttl_days,
        cluster_cache_users=settings.cluster.cache_users,
    )


@dataclass
class Dependencies:
    """The long-lived clients one process shares between its roles."""

    settings: Settings
    metrics: Metrics
    encoder: OnnxEncoder
    state: RedisState
    longterm: LongTermStore

    @classmethod
    def build(
        cls,
        settings: Settings,
        stack: Stack,
        metrics: Metrics,
        *,
        open_store: LongTermOpener = open_longterm,
    ) -> Dependencies:
        encoder = OnnxEncoder.from_settings(settings.encoder)
        metrics.watch_encoder(encoder.stats)
        return cls(
            settings=settings,
            metrics=metrics,
            encoder=encoder,
            state=open_state(settings, stack.redis_url),
            longterm=open_store(settings.qdrant, settings.data_dir),
        )


def app_id_for(roles: frozenset[Role], topic_prefix: str) -> str:
    """The consumer group (and faust's transactional ids): processors and consolidators are
    separate groups when they run apart, and two deployments with their own topic prefix on
    one Kafka never share a group (they would rebalance each other's partitions)."""
    stream_roles = sorted(r for r in roles if r != "serve")
    return topic_prefix if len(stream_roles) > 1 else f"{topic_prefix}-{stream_roles[0]}"


def build_app(deps: Dependencies, stack: Stack, roles: frozenset[Role]) -> tuple[faust.App, Topics]:
    settings, metrics = deps.settings, deps.metrics
    app_id = app_id_for(roles, settings.kafka.topic_prefix)
    if settings.kafka.generation:  # a rebuilt generation reads the log in groups of its own
        app_id = f"{app_id}-{settings.kafka.generation}"
    app = create_app(settings, app_id=app_id, broker_url=stack.broker_url)
    topics = create_topics(app, settings)
    consolidator: Consolidator | None = None
    if "process" in roles:
        register_encode(
            app,
            topics,
            deps.encoder,
            metrics,
            batch_size=settings.encoder.batch_size,
            within_s=settings.encoder.batch_within_s,
        )
        memorizer = Memorizer(
            state=deps.state,
            cluster_params=cluster_params(settings.cluster),
            recurrence_params=RecurrenceParams(
                min_similar=settings.recurrence.min_similar,
                similarity=settings.recurrence.similarity,
                entity_min_turns=settings.recurrence.entity_min_turns,
                entity_half_life_days=settings.recurrence.entity_half_life_days,
                eager=settings.recurrence.eager,
            ),
            window=settings.recurrence.window_turns,
            common_phrase_users=settings.recurrence.common_phrase_users,
            # A cluster's description often repeats; the cache gives the same bytes back.
            embed=partial(deps.encoder.encode, cache=True),
        )
        register_memorize(app, topics, memorizer, metrics)
        # Forget commands: the partition owner drops the user's in-flight data too.
        register_control(app, topics, deps.state, deps.longterm, metrics)
    if "consolidate" in roles:
        c = settings.consolidation
        locks = UserLocks()
        consolidator = consolidator_from_settings(
            settings.llm, on_fallback=lambda reason: metrics.llm_fallbacks.labels(reason).inc()
        )
        worker = ConsolidationWorker(
            state=deps.state,
            longterm=deps.longterm,
            consolidator=consolidator,
            encoder=deps.encoder,
            metrics=metrics,
            max_turns=c.max_turns,
            max_concurrency=c.max_concurrency,
            locks=locks,
            links=LinkParams(similarity=c.link_similarity, max_links=c.max_links),
            strength=strength_params(settings),
        )
        register_consolidate(
            app, topics, worker, metrics, batch_size=c.batch_size, within_s=c.batch_within_s
        )
        # Every turn to the archive tier, so the hot tier in Redis may expire (event time).
        r = settings.redis
        register_archive(
            app,
            topics,
            ArchiveWorker(deps.state, deps.longterm),
            metrics,
            batch_size=r.archive_batch_size,
            within_s=r.archive_within_s,
        )
        # Strength upkeep and reminders write long-term memories too: same role, same locks.
        m = settings.maintenance
        register_strength(
            app,
            topics,
            StrengthWorker(deps.longterm, deps.state, locks, strength_params(settings)),
            metrics,
            decay_every_s=m.decay_every_s,
        )
        register_reminders(
            app,
            topics,
            ReminderWorker(deps.longterm, deps.state, timedelta(seconds=m.reminder_max_late_s)),
            metrics,
            every_s=m.reminders_every_s,
        )
    register_samplers(
        app,
        metrics,
        roles,
        interval_s=settings.metrics_interval_s,
        state=deps.state,
        longterm=deps.longterm,
        consolidator=consolidator,
    )

    async def declare_topics() -> None:
        # Output-only topics (dlq, consolidated, ...) must exist before anyone reads them.
        for topic in topics.all():
            await topic.maybe_declare()
        await deps.longterm.ensure_collection(deps.encoder.dim)

    on_start(app, declare_topics)
    return app, topics
