"""The composition root: settings in, a running process's dependencies out.

``Stack`` resolves where the broker and Redis are (starting embedded ones when the settings
leave their URLs empty); ``build_app`` builds one faust app with the agents of the roles a
process plays, each wired to its stores; ``open_longterm`` picks the Qdrant backend, and
``engine_params`` builds the engine's parameter types in memory/ from the settings' engine
sections. Nothing here holds an algorithm.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import faust
import numpy as np
from pydantic import BaseModel

from memstream.memory.clustering import ClusterParams
from memstream.memory.links import LinkParams
from memstream.memory.recurrence import RecurrenceParams
from memstream.memory.strength import StrengthParams
from memstream.metrics import Metrics
from memstream.sampling import register_samplers
from memstream.settings import (
    ClusterSettings,
    ConsolidationSettings,
    QdrantSettings,
    RecurrenceSettings,
    Settings,
)
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.llm import Consolidator, consolidator_from_settings
from memstream.stores.longterm import LongTermStore
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import Topics, create_app, create_topics, on_start
from memstream.streams.control import register_control
from memstream.streams.encode import register_encode
from memstream.streams.memorize import Memorizer, register_memorize
from memstream.workers.archive import ArchiveWorker, register_archive
from memstream.workers.consolidate import ConsolidationWorker, register_consolidate
from memstream.workers.locks import UserLocks
from memstream.workers.reminders import ReminderWorker, register_reminders
from memstream.workers.strength import StrengthWorker, register_strength

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger("memstream")
P = TypeVar("P", bound="DataclassInstance")
S = TypeVar("S", bound=BaseModel)

Role = Literal["process", "consolidate", "serve"]
ALL_ROLES: frozenset[Role] = frozenset({"process", "consolidate", "serve"})

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


# --- the engine's parameters from the settings' engine sections (memstream/settings.py) --


def engine_fields(section: type[BaseModel]) -> list[str]:
    """The fields of an engine section: those declared ``None`` (= the engine's default)."""
    return [name for name, f in section.model_fields.items() if f.default is None]


def engine_params(params: type[P], section: BaseModel, **renamed: str) -> P:
    """``params`` with what ``section`` sets; ``renamed`` maps a params field to the section's
    name for it. An engine field the type lacks is an error, not a setting silently dropped."""
    name_in_section = {f.name: renamed.get(f.name, f.name) for f in dataclasses.fields(params)}
    by_section = {v: k for k, v in name_in_section.items()}
    if stray := sorted(set(engine_fields(type(section))) - set(by_section)):
        raise TypeError(f"{type(section).__name__}: {params.__name__} has no field for {stray}")
    values: dict[str, Any] = {
        by_section[name]: value
        for name in engine_fields(type(section))
        if (value := getattr(section, name)) is not None
    }
    return params(**values)


def written_out(section: S, params: DataclassInstance) -> S:
    """``section`` with each engine field left None set to the engine's value (a rebuilt
    generation records what built it, whatever a later version's defaults are)."""
    unset = [n for n in engine_fields(type(section)) if getattr(section, n) is None]
    values = section.model_dump() | {n: getattr(params, n) for n in unset}
    return type(section).model_validate(values)  # validated: the engine's type may be wider


def description_encoder(
    settings: Settings, encoder: OnnxEncoder
) -> Callable[[Sequence[str]], np.ndarray] | None:
    """What embeds new cluster descriptions at ingest: only the hierarchical retrieval reads
    them (``memory.hierarchy.rank_clusters``); in the other modes they were 15% more
    encoder texts per event (full bench, 1.18 per event) that nothing used. Clusters
    without one rank by their centroid, so a switch to hierarchical later only ranks
    the clusters described before it by centroid until their description next changes."""
    if settings.rpc.short_term_mode != "hierarchical":
        return None
    # A cluster's description often repeats; the cache gives the same bytes back.
    return partial(encoder.encode, cache=True)


def cluster_params(c: ClusterSettings) -> ClusterParams:
    return engine_params(ClusterParams, c)


def recurrence_params(r: RecurrenceSettings) -> RecurrenceParams:
    return engine_params(RecurrenceParams, r)


def link_params(c: ConsolidationSettings) -> LinkParams:
    return engine_params(LinkParams, c, similarity="link_similarity")


def strength_params(settings: Settings) -> StrengthParams:
    return engine_params(
        StrengthParams,
        settings.maintenance,
        boost="strength_boost",
        decay="strength_decay",
        floor="strength_floor",
        interval_s="decay_interval_s",
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


def build_app(deps: Dependencies, stack: Stack, roles: frozenset[Role]) -> tuple[faust.App, Topics]:
    settings, metrics = deps.settings, deps.metrics
    app = create_app(settings, app_id=group_id(settings, roles), broker_url=stack.broker_url)
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
            recurrence_params=recurrence_params(settings.recurrence),
            window=settings.recurrence.window_turns,
            embed=description_encoder(settings, deps.encoder),
        )
        # memorize takes the batches the encode stage makes (one Redis read and one
        # transaction per user per batch); a short wait, as events arrive already batched.
        register_memorize(
            app,
            topics,
            memorizer,
            metrics,
            batch_size=settings.encoder.batch_size,
            within_s=min(settings.encoder.batch_within_s, 0.02),
        )
        # Forget commands: the partition owner drops the user's in-flight data too.
        register_control(app, topics, deps.state, deps.longterm, metrics)
    if "consolidate" in roles:
        c = settings.consolidation
        locks = UserLocks()
        consolidator = consolidator_from_settings(
            settings.llm,
            on_fallback=lambda reason: metrics.llm_fallbacks.labels(reason).inc(),
            on_cut=lambda reason: metrics.consolidations_cut.labels(reason).inc(),
        )
        worker = ConsolidationWorker(
            state=deps.state,
            longterm=deps.longterm,
            consolidator=consolidator,
            encoder=deps.encoder,
            metrics=metrics,
            max_turns=c.max_turns,
            max_concurrency=c.max_concurrency,
            min_interval_s=c.min_interval_s,
            locks=locks,
            links=link_params(c),
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
