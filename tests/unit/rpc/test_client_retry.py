"""The clients' retries: the server's Retry-After honoured (capped, jittered up), bounded."""

from __future__ import annotations

import random

import httpx
import pytest
from multidict import CIMultiDict

from memstream.client import MemoryClient, MemstreamError, retry_delay

OK = {"items": [], "context": "", "context_tokens": 0, "took_ms": 1.0}


def response(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, json={"detail": "busy"})


@pytest.mark.parametrize(
    ("headers", "low", "high"),
    [
        ({"Retry-After-Ms": "250"}, 0.25, 0.375),  # the precise hint first
        ({"Retry-After-Ms": "250", "Retry-After": "1"}, 0.25, 0.375),
        ({"Retry-After": "2"}, 2.0, 3.0),
        ({"Retry-After": "60"}, 5.0, 7.5),  # capped
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.4, 0.6),  # a date: backoff
        ({}, 0.4, 0.6),  # no hint: 0.1 * 2**2
    ],
)
def test_the_delay_honours_the_hint_within_the_cap(
    headers: dict[str, str], low: float, high: float
) -> None:
    rng = random.Random(7)
    for _ in range(50):
        delay = retry_delay(2, response(503, **headers).headers, 0.1, 5.0, rng)
        assert low <= delay <= high


def test_the_hint_is_read_from_any_case_insensitive_headers() -> None:
    rng = random.Random(7)
    aiohttp_headers = CIMultiDict({"Retry-After-Ms": "250"})  # what aiohttp's answers carry
    assert 0.25 <= retry_delay(0, aiohttp_headers, 0.1, 5.0, rng) <= 0.375


def test_a_transport_failure_backs_off_exponentially() -> None:
    rng = random.Random(7)
    assert 0.1 <= retry_delay(0, None, 0.1, 5.0, rng) <= 0.15
    assert 0.8 <= retry_delay(3, None, 0.1, 5.0, rng) <= 1.2


def test_refusals_are_retried_after_the_hint_then_served() -> None:
    answers = [response(503, **{"Retry-After-Ms": "1"}), response(429, **{"Retry-After": "0"})]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return answers.pop(0) if answers else httpx.Response(200, json=OK)

    with MemoryClient("http://api", "k", retries=3, transport=httpx.MockTransport(handler)) as c:
        assert c.retrieve("u1", "where is my parcel").took_ms == 1.0
    assert seen == ["/v1/retrieve"] * 3


def test_retries_are_bounded() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return response(503, **{"Retry-After-Ms": "0"})

    client = MemoryClient("http://api", "k", retries=2, transport=httpx.MockTransport(handler))
    with client, pytest.raises(MemstreamError) as refused:
        client.retrieve("u1", "where is my parcel")
    assert refused.value.status == 503
    assert calls == 3
