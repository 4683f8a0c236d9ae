"""The LLM router against a tiny scripted OpenAI-compatible server (aiohttp, 127.0.0.1):
answers become routes, and every failure (HTTP error, timeout, nonsense, rate limit) yields
``None`` -- the fuzzy buffer decides -- with the outcome counted. Last, the memorize step on
real Valkey asks the router only for a fuzzy memory and follows its answer."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from memory.clustering import NEW, ClusterParams, RouteOption
from memory.recurrence import RecurrenceParams
from memstream.settings import ClusterSettings, LLMSettings
from schemas import EncodedEvent, InteractionEvent
from stores.embedded import EmbeddedRedis
from stores.redis_state import RedisState
from stores.router import LLMRouter, TokenBucket, parse_route, router_from_settings
from streams.memorize import Memorizer

OPTIONS = [RouteOption("c3", "refund kettle", 0.7), RouteOption("c8", "courier delay", 0.68)]


def test_parse_route() -> None:
    assert parse_route("2", OPTIONS) == "c8"
    assert parse_route(" 1.", OPTIONS) == "c3"
    assert parse_route("0", OPTIONS) == NEW
    assert parse_route("New topic", OPTIONS) == NEW
    assert parse_route("7", OPTIONS) is None
    assert parse_route("maybe", OPTIONS) is None


def test_token_bucket_limits_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=1.0, burst=2, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 1.0
    assert [bucket.take(), bucket.take()] == [True, False]


def test_no_router_without_an_llm_backend() -> None:
    assert router_from_settings(LLMSettings(), ClusterSettings()) is None


class Script:
    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            return web.Response(status=answer)
        if answer == "slow":
            await asyncio.sleep(1.0)
            answer = "1"
        return web.json_response(
            {
                "choices": [{"message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 1},
            }
        )


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Script]]:
    script = Script()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}/v1", script
    await runner.cleanup()


def make_router(url: str, outcomes: list[str], **cluster: Any) -> LLMRouter:
    router = router_from_settings(
        LLMSettings(backend="openai", base_url=url, model="m"),
        ClusterSettings(route_timeout_s=0.3, **cluster),
        on_call=outcomes.append,
    )
    assert router is not None
    return router


async def test_answers_become_routes_and_failures_none(server: tuple[str, Script]) -> None:
    url, script = server
    outcomes: list[str] = []
    router = make_router(url, outcomes)
    script.answers = ["2", "0", 500, "slow", "a kettle?"]
    try:
        assert await router.route("where is my courier", OPTIONS) == "c8"
        assert await router.route("something else", OPTIONS) == NEW
        assert await router.route("x", OPTIONS) is None  # HTTP 500, no retry
        assert await router.route("x", OPTIONS) is None  # timed out
        assert await router.route("x", OPTIONS) is None  # names nothing
    finally:
        await router.close()
    assert outcomes == ["ok", "ok", "error", "error", "ok"]
    assert router.usage.prompt_tokens == 30 * 3
    sent = script.requests[0]
    assert sent["model"] == "m"
    assert "refund kettle" in sent["messages"][-1]["content"]


async def test_rate_limit_skips_the_call(server: tuple[str, Script]) -> None:
    url, script = server
    outcomes: list[str] = []
    router = make_router(url, outcomes, route_burst=1, route_calls_per_s=0.001)
    script.answers = ["1"]
    try:
        assert await router.route("x", OPTIONS) == "c3"
        assert await router.route("x", OPTIONS) is None
    finally:
        await router.close()
    assert outcomes == ["ok", "limited"]
    assert len(script.requests) == 1


async def test_descriptions_are_at_most_ten_words(server: tuple[str, Script]) -> None:
    url, script = server
    router = make_router(url, [])
    script.answers = ['"Refunds for a broken kettle bought online in the spring sale of 2026"']
    try:
        name = await router.describe("refund kettle broken")
    finally:
        await router.close()
    assert name == "Refunds for a broken kettle bought online in the spring"


async def test_memorize_routes_fuzzy_memories_through_the_llm(
    server: tuple[str, Script], redis_server: EmbeddedRedis
) -> None:
    """The memorize step asks the router only for a fuzzy memory, and follows its answer."""
    url, script = server
    outcomes: list[str] = []
    router = make_router(url, outcomes)
    state = RedisState.from_url(redis_server.url, prefix=f"rt{uuid.uuid4().hex[:6]}")
    params = ClusterParams(merge_threshold=0.75, create_threshold=0.65, create_threshold_min=0.5)
    memorizer = Memorizer(state, params, RecurrenceParams(), window=200, router=router)
    base = np.eye(8, dtype=np.float32)
    fuzzy = 0.7 * base[0] + np.sqrt(1 - 0.7**2) * base[1]  # cosine 0.7 to the first
    script.answers = ["0"]  # "none of these": open a new cluster
    try:
        bands = []
        for i, vector in enumerate([base[0], base[0], fuzzy]):
            event = InteractionEvent(
                event_id=f"e{i}",
                tenant_id="t",
                user_id="u",
                session_id="s1",
                role="user",
                text=f"turn {i} about a kettle",
                ts=datetime(2026, 11, 1, 9, i, tzinfo=UTC),
            )
            encoded = EncodedEvent(event=event, embedding=vector.tolist(), model_id="m")
            decision = await memorizer.decide(encoded)
            assert decision is not None
            assert decision.clustering is not None
            bands.append((decision.clustering.band, decision.clustering.cluster_id))
            await memorizer.apply(decision)
    finally:
        await router.close()
        await state.close()
    assert bands == [("create", "c0"), ("merge", "c0"), ("routed", "c1")]
    assert outcomes == ["ok"]  # asked once: only the fuzzy memory
    assert "turn 2 about a kettle" in script.requests[0]["messages"][-1]["content"]
