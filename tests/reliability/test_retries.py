"""``with_retries`` tells an outage (wait it out, counted) from a bad message (bounded tries)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry
from qdrant_client import AsyncQdrantClient
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memstream.metrics import Metrics
from memstream.stores.embedded import free_port
from memstream.streaming.stage import is_outage, with_retries


def retries(metrics: Metrics, stage: str, kind: str) -> float:
    return metrics.retries.labels(stage, kind)._value.get()


async def test_an_unreachable_qdrant_is_an_outage_retried_past_the_attempt_limit() -> None:
    metrics = Metrics(CollectorRegistry())
    # Nothing listens on the port: the Qdrant server is down.
    client = AsyncQdrantClient(
        url=f"http://127.0.0.1:{free_port()}", timeout=1, check_compatibility=False
    )
    try:
        with pytest.raises(ResponseHandlingException) as caught:
            await client.get_collections()
        assert is_outage(caught.value), repr(caught.value)
        # Far more tries than max_attempts, and still waiting: an outage is never dead-lettered.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                with_retries(client.get_collections, stage="t", max_attempts=2, metrics=metrics),
                timeout=2.0,
            )
        assert retries(metrics, "t", "outage") >= 3
        assert retries(metrics, "t", "error") == 0
    finally:
        await client.close()


async def test_a_failing_message_gives_up_after_max_attempts_and_counts_its_retries() -> None:
    metrics = Metrics(CollectorRegistry())
    calls = 0

    async def bad() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad payload")

    with pytest.raises(ValueError, match="bad payload"):
        await with_retries(bad, stage="t", max_attempts=3, metrics=metrics)
    assert calls == 3
    assert retries(metrics, "t", "error") == 2
    assert retries(metrics, "t", "outage") == 0


def _bad_while_down() -> None:
    try:
        raise ConnectionError("down")
    except ConnectionError:
        raise ValueError("bad") from None


def test_an_error_raised_while_handling_an_outage_is_not_one() -> None:
    with pytest.raises(ValueError, match="bad") as caught:
        _bad_while_down()
    assert caught.value.__context__ is not None  # implicitly chained to the outage
    assert not is_outage(caught.value)
    chained = RuntimeError("wrapped")
    chained.__cause__ = ConnectionResetError()
    assert is_outage(chained)


def test_a_qdrant_server_answering_unavailable_is_an_outage_a_bad_request_is_not() -> None:
    def answer(status: int) -> UnexpectedResponse:
        return UnexpectedResponse(status, "", b"", httpx.Headers())

    assert is_outage(answer(503))
    assert is_outage(answer(429))
    assert not is_outage(answer(400))
