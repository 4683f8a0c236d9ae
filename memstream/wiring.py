"""The composition root: settings in, a running process's dependencies out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty); ``build_app`` builds one faust app with the agents of the roles a
process plays, each wired to its stores. Nothing here holds an algorithm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import faust

from memory.clustering import ClusterParams
from memory.recurrence import RecurrenceParams
from memstream.metrics import Metrics
from memstream.sampling import register_samplers
from memstream.settings import Settings
from stores.embedded import EmbeddedBroker, EmbeddedRedis
from stores.encoder import OnnxEncoder
from stores.llm import Consolidator, consolidator_from_settings
from stores.longterm import LongTermStore, open_longterm
from stores.redis_state import RedisState
from streams.app import Topics, create_app, create_topics
from streams.encode import register_encode
from streams.memorize import Memorizer, register_memorize
from workers.consolidate import ConsolidationWorker, register_consolidate

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


def open_state(settings: Settings, redis_url: str) -> RedisState:
    r = settings.redis
    return RedisState.from_url(
        redis_url,
        prefix=r.prefix,
        ttl_days=r.short_term_ttl_days,
        max_turns=r.short_term_max_turns,
        processed_ttl_days=r.processed_ttl_days,
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
    app = create_app(settings, app_id=app_id_for(roles), broker_url=stack.broker_url)
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
            cluster_params=ClusterParams(
                merge_threshold=settings.cluster.merge_threshold,
                create_threshold=settings.cluster.create_threshold,
            ),
            recurrence_params=RecurrenceParams(
                min_similar=settings.recurrence.min_similar,
                similarity=settings.recurrence.similarity,
                entity_min_turns=settings.recurrence.entity_min_turns,
                entity_half_life_days=settings.recurrence.entity_half_life_days,
            ),
            window=settings.recurrence.window_turns,
        )
        register_memorize(app, topics, memorizer, metrics)
    if "consolidate" in roles:
        c = settings.consolidation
        consolidator = consolidator_from_settings(settings.llm)
        worker = ConsolidationWorker(
            state=deps.state,
            longterm=deps.longterm,
            consolidator=consolidator,
            encoder=deps.encoder,
            metrics=metrics,
            max_turns=c.max_turns,
            max_concurrency=c.max_concurrency,
        )
        register_consolidate(
            app, topics, worker, metrics, batch_size=c.batch_size, within_s=c.batch_within_s
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
