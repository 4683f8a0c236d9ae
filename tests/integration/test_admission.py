"""Admission control of ``POST /v1/retrieve`` on the real API over real stores and encoder.

Each test builds its own app (the limiter's state is the app's) with a fixed limit, so that
an overload is a few requests at once; requests go through the ASGI app in process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from memstream.client import AsyncMemoryClient
from memstream.metrics import Metrics
from memstream.rpc.retrieval import QueryEncoder, Retriever
from memstream.rpc.server import ApiDeps, create_api
from memstream.settings import DEMO_API_KEY, DEMO_TENANT, RPCSettings, Settings
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import EventPublisher

pytestmark = pytest.mark.integration
HEADERS = {"Authorization": f"Bearer {DEMO_API_KEY}"}


@dataclass
class Served:
    transport: httpx.ASGITransport
    registry: CollectorRegistry

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    @property
    def retrievals_done(self) -> float:
        return self.value("memstream_retrieval_latency_seconds_count", phase="total")


Serve = Callable[..., Served]


@pytest.fixture(scope="module")
async def serve(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Serve]:
    """Apps over one set of stores; ``serve(admission_min_limit=1, ...)`` sets ``rpc``."""
    unique = uuid.uuid4().hex[:8]
    base: dict[str, Any] = {
        "data_dir": tmp_path_factory.mktemp("admission"),
        "kafka": {"broker": broker.url, "topic_prefix": f"adm{unique}", "partitions": 1},
        "redis": {"url": redis_server.url, "prefix": f"adm{unique}"},
    }
    settings = Settings(**base)
    encoder = OnnxEncoder.from_settings(settings.encoder)
    state = RedisState.from_url(redis_server.url, prefix=settings.redis.prefix)
    longterm = QdrantEdgeStore(Path(settings.data_dir) / "shard")
    await longterm.ensure_collection(encoder.dim)
    publisher = EventPublisher(broker.url)
    await publisher.start()

    def make(**rpc: Any) -> Served:
        registry = CollectorRegistry()
        metrics = Metrics(registry)
        retriever = Retriever(
            queries=QueryEncoder(encoder),
            state=state,
            longterm=longterm,
            metrics=metrics,
            short_term_candidates=500,
        )
        app = create_api(
            ApiDeps(RPCSettings.model_validate(rpc), settings.kafka, retriever, publisher, metrics)
        )
        return Served(httpx.ASGITransport(app=app), registry)

    yield make
    await publisher.close()
    await longterm.close()
    await state.close()


def limit(n: int, **more: Any) -> dict[str, Any]:
    return {
        "admission_initial_limit": n,
        "admission_min_limit": n,
        "admission_max_limit": n,
        "admission_queue_ratio": 0.0,
        **more,
    }


async def test_overload_gets_a_fast_503_with_retry_after_and_no_work(serve: Serve) -> None:
    served = serve(**limit(1))
    async with httpx.AsyncClient(transport=served.transport, base_url="http://api") as http:

        async def ask(i: int) -> tuple[httpx.Response, float]:
            body = {"user_id": "u1", "query": f"where is parcel number {i} {uuid.uuid4().hex}"}
            started = time.perf_counter()
            response = await http.post("/v1/retrieve", json=body, headers=HEADERS)
            return response, time.perf_counter() - started

        answers = await asyncio.gather(*(ask(i) for i in range(8)))

    ok = [r for r, _ in answers if r.status_code == 200]
    shed = [(r, s) for r, s in answers if r.status_code == 503]
    assert len(ok) + len(shed) == 8
    assert ok  # the admitted ones are served
    assert shed  # eight at once on a limit of one, no queue
    for response, seconds in shed:
        assert int(response.headers["Retry-After"]) >= 1
        assert float(response.headers["Retry-After-Ms"]) >= 1000
        assert "overloaded" in response.json()["detail"]
        assert seconds < 0.5  # refused at once (loose: the machine is shared)
    # The refused did no work: only the admitted retrievals ran.
    assert served.retrievals_done == len(ok)
    assert served.value("memstream_rpc_admitted_total") == len(ok)
    assert served.value("memstream_rpc_shed_total", reason="overload", tenant=DEMO_TENANT) == len(
        shed
    )


async def test_a_deadline_under_a_millisecond_is_the_callers_mistake(serve: Serve) -> None:
    """A budget spent before the server reads the request is a 422, never a 5xx; one that
    runs out in the queue is dropped unstarted (``tests/unit/rpc/test_admission_limiter``)."""
    served = serve()  # the defaults: nothing is refused for load
    async with httpx.AsyncClient(transport=served.transport, base_url="http://api") as http:
        body = {"user_id": "u1", "query": "is my refund through"}
        spent = await http.post(
            "/v1/retrieve", json=body, headers={**HEADERS, "X-Request-Deadline-Ms": "0"}
        )
        in_time = await http.post(
            "/v1/retrieve", json=body, headers={**HEADERS, "X-Request-Deadline-Ms": "5000"}
        )
        malformed = await http.post(
            "/v1/retrieve", json=body, headers={**HEADERS, "X-Request-Deadline-Ms": "soon"}
        )

    assert spent.status_code == 422
    assert "X-Request-Deadline-Ms" in spent.text
    assert in_time.status_code == 200
    assert malformed.status_code == 422
    assert served.retrievals_done == 1


async def test_the_client_retries_after_retry_after_until_served(serve: Serve) -> None:
    served = serve(**limit(1, admission_retry_after_min_ms=30.0))
    clients = [
        AsyncMemoryClient("http://api", DEMO_API_KEY, retries=10, transport=served.transport)
        for _ in range(3)
    ]
    try:
        # The model's first run is the slowest by far: warmed, a served retrieval takes
        # milliseconds, well inside what ten retries wait.
        await clients[0].retrieve("u1", "warm-up")
        answers = await asyncio.gather(
            *(
                c.retrieve("u1", f"gift card balance {i} {uuid.uuid4().hex}")
                for i, c in enumerate(clients)
            )
        )
    finally:
        for client in clients:
            await client.close()

    assert len(answers) == 3  # every caller served in the end ...
    shed = served.value("memstream_rpc_shed_total", reason="overload", tenant=DEMO_TENANT)
    assert shed >= 1  # ... though some were refused first and came back
    assert served.value("memstream_rpc_admitted_total") == 3 + 1  # and the warm-up
