"""The composition root: settings in, a running process's dependencies out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty); ``build_app`` builds one faust app with the agents of the roles a
process plays, each wired to its stores. Nothing here holds an algorithm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import faust

from memory.clustering import ClusterParams
from memory.links import LinkParams
from memory.recurrence import RecurrenceParams
from memory.strength import StrengthParams
from memstream.metrics import Metrics
from memstream.sampling import register_samplers
from memstream.settings import ClusterSettings, Settings
from stores.embedded import EmbeddedBroker, EmbeddedRedis
from stores.encoder import OnnxEncoder
from stores.llm import Consolidator, consolidator_from_settings
from stores.longterm import LongTermStore, open_longterm
from stores.redis_state import RedisState
from streams.app import Topics, create_app, create_topics
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
    def build(cls, settings: Settings, stack: Stack, metrics: Metrics) -> Dependencies:
        return cls(
            settings=settings,
            metrics=metrics,
            encoder=OnnxEncoder.from_settings(settings.encoder),
            state=open_state(settings, stack.redis_url),
            longterm=open_longterm(settings.qdrant, settings.data_dir),
        )


def app_id_for(roles: frozenset[Role]) -> str:
    """Processors and consolidators are separate consumer groups when they run apart."""
    stream_roles = sorted(r for r in roles if r != "serve")
    return "memstream" if len(stream_roles) > 1 else f"memstream-{stream_roles[0]}"


def build_app(deps: Dependencies, stack: Stack, roles: frozenset[Role]) -> tuple[faust.App, Topics]:
    settings, metrics = deps.settings, deps.metrics
    app_id = app_id_for(roles)
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
            embed=deps.encoder.encode,
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
            StrengthWorker(deps.longterm, locks, strength_params(settings)),
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

    @app.task
    async def declare_topics() -> None:
        # Output-only topics (dlq, consolidated, ...) must exist before anyone reads them.
        for topic in topics.all():
            await topic.maybe_declare()
        await deps.longterm.ensure_collection(deps.encoder.dim)

    return app, topics
