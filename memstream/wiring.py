"""The composition root: settings in, a running process's services out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty). ``ServiceBuilder`` is the one place a process's services are
built: a generation's clients (``Dependencies``), the faust app with the stages of
``STAGES`` (the one table of them) that belong to the roles a process plays, on the
``Services`` they share, and the API; the API's ``GenerationFollower`` asks it for the
retriever of the generation it switches to. ``open_longterm`` picks the Qdrant backend.
Each adapter gets the settings sections it reads; nothing here holds an algorithm, and no
stage's construction: each stage builds its own from ``Services``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import faust
from fastapi import FastAPI

from memstream.metrics import Metrics
from memstream.roles import Role
from memstream.rpc.feedback import FeedbackSink
from memstream.rpc.ingest import IngestGuard
from memstream.rpc.intake import Intake
from memstream.rpc.retrieval import QueryEncoder, Retriever, exemplars_of
from memstream.rpc.server import ApiDeps, create_api
from memstream.sampling import register_samplers
from memstream.settings import EncoderSettings, QdrantSettings, RedisSettings, Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.llm import Consolidator, consolidator_from_settings
from memstream.stores.longterm import LongTermStore
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import (
    ConsumerGroupLag,
    EventPublisher,
    Topics,
    create_app,
    create_topics,
    on_start,
)
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


def open_state(redis: RedisSettings, url: str, *, cluster_cache_users: int) -> RedisState:
    """The short-term state ``redis`` describes, at ``url`` (the resolved address: ``redis.url``
    is empty when the stack runs an embedded server)."""
    return RedisState.from_url(
        url,
        prefix=redis.prefix,
        tombstone_prefix=redis.tombstone_prefix or redis.prefix,
        ttl_days=redis.short_term_ttl_days,
        max_turns=redis.short_term_max_turns,
        processed_ttl_days=redis.processed_ttl_days,
        forgotten_ttl_days=redis.forgotten_ttl_days,
        cluster_cache_users=cluster_cache_users,
    )


@dataclass
class Dependencies:
    """One generation's long-lived clients, shared by the roles of a process."""

    settings: Settings  # as resolved for the generation (``generations.apply_generation``)
    metrics: Metrics
    encoder: OnnxEncoder
    state: RedisState
    longterm: LongTermStore


@dataclass
class ServiceBuilder:
    """Builds a process's services, the one place that does: a generation's clients, the
    faust app and its stages, the API.

    ``run_process`` builds every process with one, ``memstream serve`` too, and the API's
    ``GenerationFollower`` asks the serving process's for the retriever of the generation
    it switches to. Clients opened for a generation are kept for the life of the process:
    switches are rare, and a switch back reuses them. ``open_store`` replaces how the
    long-term store is opened (the reliability suite's fault injection).
    """

    stack: Stack
    metrics: Metrics
    open_store: LongTermOpener = open_longterm
    _encoders: dict[EncoderSettings, OnnxEncoder] = field(default_factory=dict)
    _states: dict[str, RedisState] = field(default_factory=dict)
    _stores: dict[str, LongTermStore] = field(default_factory=dict)

    def dependencies(self, settings: Settings) -> Dependencies:
        """The clients of the generation ``settings`` are resolved for; nothing connects yet."""
        if settings.encoder not in self._encoders:
            self._keep_encoder(settings.encoder, OnnxEncoder.from_settings(settings.encoder))
        state = self._states.get(settings.redis.prefix)
        if state is None:
            state = self._states[settings.redis.prefix] = open_state(
                settings.redis,
                self.stack.redis_url,
                cluster_cache_users=settings.cluster.cache_users,
            )
        longterm = self._stores.get(settings.qdrant.collection)
        if longterm is None:
            longterm = self.open_store(settings.qdrant, settings.data_dir)
            self._stores[settings.qdrant.collection] = longterm
        return Dependencies(
            settings, self.metrics, self._encoders[settings.encoder], state, longterm
        )

    def _keep_encoder(self, settings: EncoderSettings, encoder: OnnxEncoder) -> None:
        self._encoders[settings] = encoder
        self.metrics.watch_encoder(encoder.stats)

    async def open_generation(self, settings: Settings) -> Dependencies:
        """``dependencies`` from a running loop (the model loads in a thread), with the
        store's collection declared. A store that fails to declare it is closed and
        forgotten, so the next try opens it again (an Edge shard a rebuild still locks)."""
        if settings.encoder not in self._encoders:
            encoder = await asyncio.to_thread(OnnxEncoder.from_settings, settings.encoder)
            self._keep_encoder(settings.encoder, encoder)
        opened = settings.qdrant.collection not in self._stores
        deps = self.dependencies(settings)
        try:
            await deps.longterm.ensure_collection(deps.encoder.dim)
        except Exception:
            if opened:
                del self._stores[settings.qdrant.collection]
                await deps.longterm.close()
            raise
        return deps

    async def retriever(self, settings: Settings) -> Retriever:
        """The API's retriever over the generation ``settings`` are resolved for."""
        deps = await self.open_generation(settings)
        rpc = settings.rpc
        return Retriever(
            queries=QueryEncoder(deps.encoder),
            state=deps.state,
            longterm=deps.longterm,
            metrics=self.metrics,
            short_term_candidates=rpc.short_term_candidates,
            short_term_mode=rpc.short_term_mode,
            turn_cache_users=rpc.turn_cache_users,
            turn_cache_bytes=int(rpc.turn_cache_mb * 2**20),
            slow_ms=rpc.slow_retrieval_ms,
            exemplars=await asyncio.to_thread(exemplars_of, deps.encoder),
        )

    async def start_api(self, settings: Settings) -> FastAPI:
        """The API with started clients; ``stop_api`` stops them. Its ingest lag is read
        from whichever of the processors' possible consumer groups lags least."""
        broker_url = self.stack.broker_url
        publisher = EventPublisher(broker_url)
        await publisher.start()
        lag = ConsumerGroupLag(
            broker_url,
            ingest_groups(settings),
            [settings.kafka.topic("events"), settings.kafka.topic("encoded")],
        )
        await lag.start()
        ingest = IngestGuard(lag, settings.rpc, self.metrics)
        ingest.start()
        deps = ApiDeps(
            rpc=settings.rpc,
            kafka=settings.kafka,
            retriever=await self.retriever(settings),
            publisher=publisher,
            metrics=self.metrics,
            feedback=FeedbackSink(publisher, settings.kafka.topic("feedback")),
            ingest=ingest,
        )
        if settings.intake_journal():
            deps.intake = Intake(
                settings.rpc,
                data_dir=settings.data_dir,
                topic=settings.kafka.topic("events"),
                state=lambda: deps.retriever.state,
                publisher=publisher,
                metrics=self.metrics,
            )
            # Recovered before the API listens: a user's journaled events go out before new ones.
            await deps.intake.start()
        api = create_api(deps)
        _freeze_startup_objects()
        return api

    def build_app(self, deps: Dependencies, roles: frozenset[Role]) -> tuple[faust.App, Topics]:
        """The faust app with the stages of ``roles`` started on it, over ``deps``."""
        settings, metrics = deps.settings, deps.metrics
        app = create_app(
            settings.kafka,
            app_id=group_id(settings, roles),
            broker_url=self.stack.broker_url,
            data_dir=settings.data_dir,
        )
        topics = create_topics(app, settings.kafka)
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
            await topics.declare()
            await deps.longterm.ensure_collection(deps.encoder.dim)

        on_start(app, declare_topics)
        return app, topics

    async def close(self) -> None:
        """Close the stores of every generation opened."""
        for state in self._states.values():
            await state.close()
        for store in self._stores.values():
            await store.close()


async def stop_api(api: FastAPI) -> None:
    """Stop what ``ServiceBuilder.start_api`` started."""
    deps: ApiDeps = api.state.deps
    follower = getattr(api.state, "generation_follower", None)
    if follower is not None:
        follower[1].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower[1]
    if deps.feedback is not None:  # drained while its publisher still runs
        await deps.feedback.close()
    if deps.ingest is not None:
        await deps.ingest.close()
    if deps.intake is not None:
        await deps.intake.close()
    await deps.publisher.close()


def _freeze_startup_objects() -> None:
    """Keep what the process built to start (modules, FastAPI's routes and pydantic's
    schemas, the clients, the model's Python side) out of every later collection: it lives
    as long as the process, yet each full collection walked all of it. Measured in
    ``memstream serve`` under the retrieval benchmark's one-caller load: one full
    collection per run stalled the loop 80-160 ms; none came with the startup frozen."""
    gc.collect()  # garbage left by the startup goes now, not frozen with the rest
    gc.freeze()


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
