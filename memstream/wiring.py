"""The composition root: settings in, a running process's dependencies out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty); ``build_app`` builds one faust app and starts on it the stages of
``STAGES`` (the one table of them) that belong to the roles a process plays, on the
``Services`` they share; ``open_longterm`` picks the Qdrant backend. Nothing here holds an
algorithm, and no stage's construction: each stage builds its own from ``Services``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import faust

from memstream.metrics import Metrics
from memstream.roles import Role
from memstream.sampling import register_samplers
from memstream.settings import QdrantSettings, Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.llm import Consolidator, consolidator_from_settings
from memstream.stores.longterm import LongTermStore
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import Topics, create_app, create_topics, on_start
from memstream.streaming.locks import UserLocks
from memstream.streaming.services import Services, StageSpec
from memstream.streams import control, encode, memorize
from memstream.workers import archive, consolidate, reminders, strength

log = logging.getLogger("memstream")


# How a process opens its long-term store. The seam for fault injection: the reliability
# suite passes a wrapper of ``open_longterm`` whose store can be switched unreachable.
LongTermOpener = Callable[[QdrantSettings, Path], LongTermStore]


def open_longterm(settings: QdrantSettings, data_dir: Path) -> LongTermStore:
    """The configured backend; nothing is opened until the first call on it."""
    # Imported here so a process only loads the engine it uses.
    if settings.backend == "edge":
        from memstream.stores.qdrant_edge_store import QdrantEdgeStore

        return QdrantEdgeStore(Path(data_dir) / "qdrant" / settings.collection)
    from memstream.stores.qdrant_client_store import QdrantClientStore

    api_key = settings.api_key.get_secret_value() if settings.api_key else None
    return QdrantClientStore(settings.url, settings.collection, api_key=api_key)


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
        tombstone_prefix=r.tombstone_prefix or r.prefix,
        ttl_days=r.short_term_ttl_days,
        max_turns=r.short_term_max_turns,
        processed_ttl_days=r.processed_ttl_days,
        forgotten_ttl_days=r.forgotten_ttl_days,
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


def ingest_groups(settings: Settings) -> list[str]:
    """The consumer groups the processors (encode, memorize) may read the events in: theirs
    when they run with the consolidator (``memstream up``) or alone (``memstream worker``)."""
    layouts: list[frozenset[Role]] = [frozenset({"process", "consolidate"}), frozenset({"process"})]
    return [group_id(settings, roles) for roles in layouts]


def group_id(settings: Settings, roles: frozenset[Role]) -> str:
    app_id = app_id_for(roles, settings.kafka.topic_prefix)
    if settings.kafka.generation:  # a rebuilt generation reads the log in groups of its own
        app_id = f"{app_id}-{settings.kafka.generation}"
    return app_id


# Every stage of the pipeline, in the order they start: a new stage is one module (its
# ``STAGE = StageSpec(...)``, ``streaming.services``) and one line here.
STAGES: tuple[StageSpec, ...] = (
    encode.STAGE,
    memorize.STAGE,
    control.STAGE,
    consolidate.STAGE,
    archive.STAGE,
    strength.STAGE,
    reminders.STAGE,
)


def build_app(deps: Dependencies, stack: Stack, roles: frozenset[Role]) -> tuple[faust.App, Topics]:
    settings, metrics = deps.settings, deps.metrics
    app = create_app(settings, app_id=group_id(settings, roles), broker_url=stack.broker_url)
    topics = create_topics(app, settings)
    # What the consolidate role's stages share, built once before they start.
    consolidator: Consolidator | None = None
    if "consolidate" in roles:
        consolidator = consolidator_from_settings(
            settings.llm,
            on_fallback=lambda reason: metrics.llm_fallbacks.labels(reason).inc(),
            on_cut=lambda reason: metrics.consolidations_cut.labels(reason).inc(),
        )
    services = Services(
        settings=settings,
        metrics=metrics,
        encoder=deps.encoder,
        state=deps.state,
        longterm=deps.longterm,
        app=app,
        topics=topics,
        locks=UserLocks(),
        consolidator=consolidator,
    )
    for stage in STAGES:
        if stage.role in roles:
            stage.start(services)
    register_samplers(
        app,
        metrics,
        roles,
        interval_s=settings.metrics_interval_s,
        state=deps.state,
        longterm=deps.longterm,
        consolidator=consolidator,
        stages=[series for stage in STAGES if stage.role in roles for series in stage.series],
    )

    async def declare_topics() -> None:
        # Output-only topics (dlq, consolidated, ...) must exist before anyone reads them.
        for topic in topics.all():
            await topic.maybe_declare()
        await deps.longterm.ensure_collection(deps.encoder.dim)

    on_start(app, declare_topics)
    return app, topics
