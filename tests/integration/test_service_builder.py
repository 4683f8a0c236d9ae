"""The one builder of a process's services: a generation's clients are opened once and
shared (the stages and the API use the same ones); a switch to another generation opens
that generation's stores beside them, and a switch back finds the first ones again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from memstream.generations import Generation, apply_generation
from memstream.metrics import Metrics
from memstream.schemas import Feedback
from memstream.settings import Settings
from memstream.stores.embedded import free_port
from memstream.wiring import ServiceBuilder, Stack, stop_api


async def test_a_generation_is_opened_once_and_a_switch_back_reuses_it(tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path)  # Qdrant Edge: a store is a folder under data_dir
    rebuilt = Generation(
        name="v2",
        redis_prefix="ms.v2",
        collection="memories_v2",
        encoder=base.encoder.model_dump(),
        cluster=base.cluster.model_dump(),
        recurrence=base.recurrence.model_dump(),
        state="ready",
    )
    # Nothing is contacted for Redis: its client connects on first use.
    stack = Stack("kafka://127.0.0.1:1", f"redis://127.0.0.1:{free_port()}")
    builder = ServiceBuilder(stack, Metrics(CollectorRegistry()))
    try:
        first = builder.dependencies(base)
        serving = await builder.retriever(base)
        assert serving.state is first.state
        assert serving.longterm is first.longterm
        assert serving.queries.encoder is first.encoder

        switched = await builder.retriever(apply_generation(base, rebuilt))
        assert switched.state is not first.state
        assert switched.longterm is not first.longterm
        assert switched.queries.encoder is first.encoder  # same model settings: same encoder

        back = await builder.retriever(base)
        assert back.state is first.state
        assert back.longterm is first.longterm
    finally:
        await builder.close()


async def test_stopping_the_api_publishes_the_feedback_it_was_offered(
    settings_factory: Callable[..., Settings],
) -> None:
    settings = settings_factory()
    builder = ServiceBuilder(
        Stack(settings.kafka.broker, settings.redis.url), Metrics(CollectorRegistry())
    )
    try:
        api = await builder.start_api(settings)
        sink = api.state.deps.feedback
        offered = Feedback(
            feedback_id="f1",
            tenant_id="t1",
            user_id="u1",
            memory_ids=[],
            turn_ids=["e1"],
            ts=datetime(2026, 1, 1, tzinfo=UTC),
        )
        assert sink.offer(offered)
        await stop_api(api)  # the reply's feedback still lingers in the sink's batch
        assert (sink.sent, sink.dropped) == (1, 0)
        assert not sink.offer(offered)  # its publisher is closed: refused, not raised later
    finally:
        await builder.close()
