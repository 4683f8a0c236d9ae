"""Protocol test of our OpenAI-compatible client against a tiny scripted HTTP server.

The server (aiohttp, in-process, 127.0.0.1) speaks the ``/v1/chat/completions`` protocol
and answers from a script: a valid memory, a 500, invalid JSON, an answer cut off at
``max_tokens``... It checks what our client sends, how it retries an outage, how it repairs
a bad answer once and then falls back to the extractive consolidator (and counts it). No
model runs here; a real llama.cpp model server is tested apart.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from memstream.memory.consolidation import consolidate_extractive
from memstream.metrics import LLM_FALLBACK_REASONS, Metrics
from memstream.schemas import ConsolidatedMemory, MemoryContent, StoredTurn
from memstream.settings import LLMSettings
from memstream.stores.llm import (
    ExtractiveConsolidator,
    FallbackReason,
    LLMError,
    OpenAICompatibleConsolidator,
    consolidator_from_settings,
    memory_json_schema,
    schema_output_tokens,
)

NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
TURNS = [
    StoredTurn(
        event_id="e1",
        session_id="s1",
        role="user",
        ts=datetime(2026, 11, 3, 9, 0, tzinfo=UTC),
        text="My order A10293 is delayed.",
    ),
    StoredTurn(
        event_id="e2",
        session_id="s2",
        role="assistant",
        ts=datetime(2026, 11, 4, 9, 0, tzinfo=UTC),
        text="Order A10293 has shipped; I will email the tracking number within 24 hours.",
    ),
]
ANSWER = {
    "title": "Order A10293: delayed, then shipped",
    "facts": [
        {
            "text": "Order A10293 has shipped.",
            "attribute": "status",
            "source_event_ids": ["e2"],
            "ts": "2026-11-04T09:00:00Z",
        },
        {
            "text": "The customer reported a delay.",
            "attribute": None,
            "source_event_ids": ["e1"],
            "ts": "2026-11-03T09:00:00",
        },  # naive: read as UTC
    ],
    "status": "shipped",
    "timeline": [{"ts": "2026-11-04T09:00:00Z", "text": "shipped", "event_id": "e2"}],
    "open_actions": [
        {"text": "Email the tracking number.", "due": "2026-11-05T09:00:00Z", "event_id": "e2"}
    ],
    "keys": ["order:A10293"],
    "summary": "Order A10293 was delayed and has now shipped.",
}
USAGE = {"prompt_tokens": 120, "completion_tokens": 80, "total_tokens": 200}


@dataclass
class ScriptedServer:
    """Answers each request with the next step of ``script``; the last step repeats."""

    script: list[str] = field(default_factory=lambda: ["ok"])
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    base_url: str = ""

    async def chat(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        self.auth.append(request.headers.get("Authorization"))
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if step.isdigit():
            return web.Response(status=int(step), text="scripted failure")
        content = {
            "ok": json.dumps(ANSWER),
            "fenced": "```json\n" + json.dumps(ANSWER) + "\n```",
            "invalid-json": '{"title": "cut off',
            "wrong-shape": json.dumps({"title": "x", "facts": "not a list"}),
            # What llama.cpp returns at its token cap: the JSON so far, finish_reason length.
            "truncated": json.dumps(ANSWER)[:90],
        }[step]
        finish = "length" if step == "truncated" else "stop"
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "scripted",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish,
                    }
                ],
                "usage": USAGE,
            }
        )


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    scripted = ScriptedServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", scripted.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    scripted.base_url = f"http://{host}:{port}/v1"
    yield scripted
    await runner.cleanup()


def client_for(
    base_url: str,
    max_retries: int = 2,
    on_fallback: Callable[[FallbackReason], None] | None = None,
    **llm: Any,
) -> OpenAICompatibleConsolidator:
    settings = LLMSettings(
        backend="openai",
        base_url=base_url,
        model="test-model",
        api_key=SecretStr("sk-test"),
        timeout_s=5.0,
        max_retries=max_retries,
        **llm,
    )
    return OpenAICompatibleConsolidator(settings, backoff_s=0.01, on_fallback=on_fallback)


async def test_protocol_valid_answer(server: ScriptedServer) -> None:
    llm = client_for(server.base_url)
    try:
        content = await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert content.title == ANSWER["title"]
    assert content.status == "shipped"
    assert content.facts[1].ts == datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
    assert content.open_actions[0].due == datetime(2026, 11, 5, 9, 0, tzinfo=UTC)
    assert (llm.usage.calls, llm.usage.errors) == (1, 0)
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (120, 80)

    (body,) = server.requests
    assert server.auth == ["Bearer sk-test"]
    assert body["model"] == "test-model"
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "memory"
    assert response_format["json_schema"]["strict"] is True
    schema = response_format["json_schema"]["schema"]
    assert set(schema["required"]) == set(MemoryContent.model_fields)
    system, user = body["messages"]
    assert system["role"] == "system"
    assert "newest" in system["content"].lower()
    assert user["role"] == "user"
    assert "entity:order:A10293" in user["content"]
    assert "[2026-11-03T09:00:00+00:00] user: My order A10293 is delayed. (e1)" in user["content"]
    assert "Current memory" not in user["content"]


async def test_protocol_existing_memory_is_sent(server: ScriptedServer) -> None:
    existing = ConsolidatedMemory(
        title="Order A10293: delayed",
        status="delayed",
        memory_id="m1",
        tenant_id="t",
        user_id="u",
        key="entity:order:A10293",
        created_at=NOW,
        updated_at=NOW,
        history=[],
    )
    server.script = ["fenced"]  # a ```json fence around the answer is tolerated
    llm = client_for(server.base_url)
    try:
        content = await llm.consolidate("entity:order:A10293", TURNS, existing, NOW)
    finally:
        await llm.close()
    assert content.status == "shipped"
    user = server.requests[0]["messages"][1]["content"]
    assert '"status":"delayed"' in user
    assert "memory_id" not in user  # only the content is shown to the model


async def test_protocol_retries_after_500(server: ScriptedServer) -> None:
    server.script = ["500", "ok"]
    llm = client_for(server.base_url)
    try:
        content = await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert content.keys == ["order:A10293"]
    assert (llm.usage.calls, llm.usage.errors) == (2, 1)
    assert len(server.requests) == 2


@pytest.mark.parametrize("step", ["429", "503"])
async def test_protocol_gives_up_after_the_last_retry(server: ScriptedServer, step: str) -> None:
    server.script = [step]
    llm = client_for(server.base_url, max_retries=2)
    try:
        with pytest.raises(LLMError, match="3 tries"):
            await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert len(server.requests) == 3
    assert (llm.usage.calls, llm.usage.errors) == (3, 3)
    assert llm.usage.fallbacks == 0  # an outage is not an answer: the worker retries the job


def test_max_tokens_follow_the_schema_bounds() -> None:
    small, large = memory_json_schema(2, 80), memory_json_schema(8, 160)
    assert 0 < schema_output_tokens(small) < schema_output_tokens(large)
    # The bound covers the largest answer the schema allows, written out in full.
    longest = {
        "title": "t" * 80,
        "facts": [
            {"text": "f" * 80, "attribute": "a" * 64, "source_event_ids": ["e" * 64] * 2,
             "ts": "2026-11-04T09:00:00.000000+00:00"}
        ] * 2,
        "status": "s" * 80,
        "timeline": [{"ts": "2026-11-04T09:00:00Z", "text": "x" * 80, "event_id": "e" * 64}] * 2,
        "open_actions": [{"text": "o" * 80, "due": None, "event_id": "e" * 64}] * 2,
        "keys": ["k" * 64] * 2,
        "summary": "u" * 80,
    }  # fmt: skip
    assert len(json.dumps(longest)) / 3 < schema_output_tokens(small)


async def test_max_tokens_is_sent_sized_to_the_schema(server: ScriptedServer) -> None:
    sized = client_for(server.base_url, max_list_items=3, max_text_chars=100)
    fixed = client_for(server.base_url, max_output_tokens=777)
    try:
        await sized.consolidate("entity:order:A10293", TURNS, None, NOW)
        await fixed.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await sized.close()
        await fixed.close()
    first, second = server.requests
    assert first["max_tokens"] == schema_output_tokens(memory_json_schema(3, 100))
    assert second["max_tokens"] == 777
    assert first["temperature"] == 0
    assert first["seed"] == 0


@pytest.mark.parametrize("step", ["invalid-json", "wrong-shape", "truncated"])
async def test_a_bad_answer_is_repaired_once(server: ScriptedServer, step: str) -> None:
    server.script = [step, "ok"]
    fallbacks: list[str] = []
    llm = client_for(server.base_url, on_fallback=fallbacks.append, repair_temperature=0.7)
    try:
        content = await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert content.title == ANSWER["title"]  # the model's repaired answer, not the fallback
    assert fallbacks == []
    assert (llm.usage.calls, llm.usage.repairs, llm.usage.fallbacks) == (2, 1, 0)
    first, repair = server.requests
    # Not the same question at temperature 0 again: the error is added, the temperature is up.
    assert repair["temperature"] == 0.7
    # The same two messages (roles alternate, as strict chat templates want), the user one
    # with the rejection and its reason added.
    (system, user), (system_again, repaired) = first["messages"], repair["messages"]
    assert system_again == system
    assert repaired["role"] == "user"
    assert repaired["content"].startswith(user["content"])
    note = repaired["content"][len(user["content"]) :]
    why = {"invalid-json": "not valid JSON", "wrong-shape": "schema", "truncated": "cut off"}
    assert "rejected" in note
    assert why[step] in note


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (["truncated", "truncated"], "truncated"),
        (["invalid-json", "truncated"], "truncated"),
        (["truncated", "invalid-json"], "invalid_json"),
        (["wrong-shape", "wrong-shape"], "schema"),
    ],
)
async def test_a_second_bad_answer_falls_back_to_extractive(
    server: ScriptedServer, script: list[str], reason: str
) -> None:
    server.script = [*script, "ok"]  # a third ask would succeed: there must be none
    metrics = Metrics(CollectorRegistry())
    metrics.declare_roles(["consolidate"])
    llm = consolidator_from_settings(
        LLMSettings(backend="openai", base_url=server.base_url, timeout_s=5.0),
        on_fallback=lambda r: metrics.llm_fallbacks.labels(r).inc(),
    )
    try:
        content = await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert content == consolidate_extractive("entity:order:A10293", TURNS, NOW)
    assert len(server.requests) == 2
    assert (llm.usage.repairs, llm.usage.fallbacks) == (1, 1)
    assert llm.usage.prompt_tokens == 2 * USAGE["prompt_tokens"]  # spent, and counted
    counted = {
        r: metrics.registry.get_sample_value("memstream_llm_fallbacks_total", {"reason": r})
        for r in LLM_FALLBACK_REASONS
    }
    assert counted == {r: float(r == reason) for r in LLM_FALLBACK_REASONS}


async def test_protocol_client_error_is_not_retried(server: ScriptedServer) -> None:
    server.script = ["400"]
    llm = client_for(server.base_url)
    try:
        with pytest.raises(LLMError, match="HTTP 400"):
            await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert len(server.requests) == 1


async def test_protocol_connection_refused_is_retried_then_raises() -> None:
    with socket.socket() as sock:  # a port that nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    llm = client_for(f"http://127.0.0.1:{port}/v1", max_retries=1)
    try:
        with pytest.raises(LLMError, match="ConnectError"):
            await llm.consolidate("entity:order:A10293", TURNS, None, NOW)
    finally:
        await llm.close()
    assert (llm.usage.calls, llm.usage.errors) == (2, 2)


async def test_factory_picks_the_backend() -> None:
    extractive = consolidator_from_settings(LLMSettings())
    assert isinstance(extractive, ExtractiveConsolidator)
    content = await extractive.consolidate("entity:order:A10293", TURNS, None, NOW)
    assert "shipped" in content.status
    assert extractive.usage.calls == 0
    await extractive.close()

    remote = consolidator_from_settings(LLMSettings(backend="openai"))
    assert isinstance(remote, OpenAICompatibleConsolidator)
    assert remote.name == "openai"
    await remote.close()
