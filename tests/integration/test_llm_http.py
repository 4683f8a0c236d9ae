"""Protocol test of our OpenAI-compatible client against a tiny scripted HTTP server.

The server (aiohttp, in-process, 127.0.0.1) speaks the ``/v1/chat/completions`` protocol
and answers from a script: a valid memory, a 500, invalid JSON... It checks what our client
sends and how it retries. No model runs here; a real llama.cpp model server is tested apart.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from memstream.settings import LLMSettings
from schemas import ConsolidatedMemory, MemoryContent, StoredTurn
from stores.llm import (
    ExtractiveConsolidator,
    LLMError,
    OpenAICompatibleConsolidator,
    consolidator_from_settings,
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
        }[step]
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "scripted",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
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


def client_for(base_url: str, max_retries: int = 2) -> OpenAICompatibleConsolidator:
    settings = LLMSettings(
        backend="openai",
        base_url=base_url,
        model="test-model",
        api_key=SecretStr("sk-test"),
        timeout_s=5.0,
        max_retries=max_retries,
    )
    return OpenAICompatibleConsolidator(settings, backoff_s=0.01)


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


@pytest.mark.parametrize("step", ["invalid-json", "wrong-shape", "429"])
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
    if not step.isdigit():  # the server still reported the tokens it spent
        assert llm.usage.prompt_tokens == 3 * USAGE["prompt_tokens"]


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
