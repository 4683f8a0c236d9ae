"""A store that does not answer is the service's trouble, not the caller's: the RPC says
503 with ``Retry-After`` (which ``MemoryClient`` honours), never a 500."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memstream.metrics import Metrics
from memstream.rpc.server import ApiDeps, create_api
from memstream.settings import DEMO_API_KEY, KafkaSettings, RPCSettings


class StalledRetriever:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def retrieve(self, tenant_id: str, body: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("Connection refused"),
        RedisTimeoutError("Timeout reading from socket"),
        MaxConnectionsError("Too many connections"),
    ],
)
async def test_a_redis_outage_answers_503_with_retry_after(error: Exception) -> None:
    api = create_api(
        ApiDeps(
            rpc=RPCSettings(admission=False),
            kafka=KafkaSettings(),
            retriever=cast(Any, StalledRetriever(error)),
            publisher=cast(Any, None),
            metrics=Metrics(CollectorRegistry()),
        )
    )
    headers = {"Authorization": f"Bearer {DEMO_API_KEY}"}
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        answer = await http.post(
            "/v1/retrieve", json={"user_id": "u1", "query": "where is my order?"}, headers=headers
        )
    assert answer.status_code == 503
    assert "did not answer" in answer.json()["detail"]
    assert answer.headers["Retry-After"] == "1"
    assert answer.headers["Retry-After-Ms"] == "1000"
