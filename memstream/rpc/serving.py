"""Running the API: standalone (``memstream serve``) or inside a faust worker (``memstream up``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator, Sequence

import uvicorn
from fastapi import FastAPI

from memstream.metrics import Metrics
from memstream.rpc.feedback import FeedbackSink
from memstream.rpc.ingest import IngestGuard
from memstream.rpc.intake import Intake
from memstream.rpc.retrieval import QueryEncoder, Retriever, exemplars_of
from memstream.rpc.server import ApiDeps, create_api
from memstream.settings import Settings
from memstream.stores.longterm import LongTermStore
from memstream.stores.short_term import ShortTermState
from memstream.stores.text_encoder import TextEncoder
from memstream.streaming.broker import ConsumerGroupLag, EventPublisher


class GuestServer(uvicorn.Server):
    """uvicorn in a process whose signals belong to its host (the faust worker)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def start_api(
    settings: Settings,
    *,
    broker_url: str,
    encoder: TextEncoder,
    state: ShortTermState,
    longterm: LongTermStore,
    metrics: Metrics,
    ingest_groups: Sequence[str],
) -> tuple[FastAPI, EventPublisher]:
    """Build the API with started clients; the caller stops them with ``stop_api``.

    ``ingest_groups``: the consumer groups that may be the processors' (it depends on the
    roles they run with); the ingest lag is read from whichever of them lags least."""
    publisher = EventPublisher(broker_url)
    await publisher.start()
    lag = ConsumerGroupLag(
        broker_url, ingest_groups, [settings.topic("events"), settings.topic("encoded")]
    )
    await lag.start()
    ingest = IngestGuard(lag, settings.rpc, metrics)
    ingest.start()
    await longterm.ensure_collection(encoder.dim)
    retriever = Retriever(
        queries=QueryEncoder(encoder),
        state=state,
        longterm=longterm,
        metrics=metrics,
        short_term_candidates=settings.rpc.short_term_candidates,
        short_term_mode=settings.rpc.short_term_mode,
        turn_cache_users=settings.rpc.turn_cache_users,
        turn_cache_bytes=int(settings.rpc.turn_cache_mb * 2**20),
        slow_ms=settings.rpc.slow_retrieval_ms,
        exemplars=await asyncio.to_thread(exemplars_of, encoder),
    )
    feedback = FeedbackSink(publisher, settings.topic("feedback"))
    deps = ApiDeps(
        settings=settings,
        retriever=retriever,
        publisher=publisher,
        metrics=metrics,
        feedback=feedback,
        ingest=ingest,
    )
    if settings.intake_journal():
        deps.intake = Intake(
            settings, state=lambda: deps.retriever.state, publisher=publisher, metrics=metrics
        )
        # Recovered before the API listens: a user's journaled events go out before new ones.
        await deps.intake.start()
    api = create_api(deps)
    _freeze_startup_objects()
    return api, publisher


async def stop_api(api: FastAPI, publisher: EventPublisher) -> None:
    """Stop what ``start_api`` started."""
    deps: ApiDeps = api.state.deps
    if deps.ingest is not None:
        await deps.ingest.close()
    if deps.intake is not None:
        await deps.intake.close()
    await publisher.close()


def _freeze_startup_objects() -> None:
    """Keep what the process built to start (modules, FastAPI's routes and pydantic's
    schemas, the clients, the model's Python side) out of every later collection: it lives
    as long as the process, yet each full collection walked all of it. Measured in
    ``memstream serve`` under the retrieval benchmark's one-caller load: one full
    collection per run stalled the loop 80-160 ms; none came with the startup frozen."""
    gc.collect()  # garbage left by the startup goes now, not frozen with the rest
    gc.freeze()


def make_server(api: FastAPI, settings: Settings, *, guest: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        api,
        host=settings.rpc.host,
        port=settings.rpc.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    return GuestServer(config) if guest else uvicorn.Server(config)
