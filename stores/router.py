"""CLAG's agent-driven routing, used only where it pays: an OpenAI-compatible chat model
places a *fuzzy* memory among the descriptions of its nearest clusters, or answers "new".

The pure engine (``memory.clustering``) decides everything else; the router only turns a
fuzzy memory's options (``clustering.classify``) into an answer for ``MemoryIn.route``. It
is built to fail quietly: a short timeout, no retries, a token-bucket rate limit, and any
error, timeout, refusal or unparseable answer returns ``None`` -- the fuzzy buffer then
decides, as it does with no LLM at all. It also writes descriptions (<= 10 words) from a
cluster's keywords when asked.

Connection plumbing (URL, key, model, usage totals) is ``stores.llm``'s; the requests here
are small and answered in a few tokens.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx

from memory.clustering import NEW, RouteOption
from memstream.settings import ClusterSettings, LLMSettings
from stores.llm import LLMUsage

Outcome = Literal["ok", "error", "limited"]

MAX_DESCRIPTION_WORDS = 10


class TokenBucket:
    """``rate`` calls per second sustained, ``burst`` at once; time from ``clock``."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = max(rate, 0.0)
        self.burst = max(burst, 0)
        self.clock = clock
        self._tokens = float(self.burst)
        self._at = clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def route_messages(text: str, options: Sequence[RouteOption]) -> list[dict[str, str]]:
    listing = "\n".join(
        f"{i + 1}. {o.description or '(no description yet)'}" for i, o in enumerate(options)
    )
    return [
        {
            "role": "system",
            "content": "You file a user's chat message under one of their memory topics. "
            "Answer with the topic's number only, or 0 if none of them fits.",
        },
        {"role": "user", "content": f"Message: {text[:500]}\n\nTopics:\n{listing}\n\nNumber:"},
    ]


def parse_route(answer: str, options: Sequence[RouteOption]) -> str | None:
    """The cluster id the answer names, ``NEW`` for 0 / "new", None when it names nothing."""
    if re.search(r"\bnew\b|\bnone\b", answer, re.IGNORECASE):
        return NEW
    match = re.search(r"\d+", answer)
    if match is None:
        return None
    n = int(match.group())
    if n == 0:
        return NEW
    return options[n - 1].cluster_id if 1 <= n <= len(options) else None


def clean_description(answer: str) -> str | None:
    words = re.sub(r"[\"'`*#]", " ", answer).split()
    return " ".join(words[:MAX_DESCRIPTION_WORDS]) or None


class LLMRouter:
    """Routing and descriptions through one pooled HTTP client. ``calls`` counts outcomes."""

    def __init__(
        self,
        llm: LLMSettings,
        cluster: ClusterSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_call: Callable[[Outcome], None] | None = None,
    ) -> None:
        headers = {"Content-Type": "application/json"}
        if llm.api_key is not None:
            headers["Authorization"] = f"Bearer {llm.api_key.get_secret_value()}"
        self.model = llm.model
        self.describe_enabled = cluster.describe_with_llm
        self.usage = LLMUsage()
        self.calls: dict[Outcome, int] = {"ok": 0, "error": 0, "limited": 0}
        self._on_call = on_call
        self._url = llm.base_url.rstrip("/") + "/chat/completions"
        self._client = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(cluster.route_timeout_s)
        )
        self._bucket = TokenBucket(cluster.route_calls_per_s, cluster.route_burst, clock)

    async def route(self, text: str, options: Sequence[RouteOption]) -> str | None:
        if not options:
            return None
        answer = await self._ask(route_messages(text, options), max_tokens=4)
        return None if answer is None else parse_route(answer, options)

    async def describe(self, keywords: str) -> str | None:
        """A topic name of at most 10 words for a cluster's keywords (None on any failure)."""
        if not self.describe_enabled or not keywords:
            return None
        messages = [
            {
                "role": "system",
                "content": "Name the topic these keywords come from in at most 10 words. "
                "Answer with the name only.",
            },
            {"role": "user", "content": keywords},
        ]
        answer = await self._ask(messages, max_tokens=24)
        return None if answer is None else clean_description(answer)

    async def _ask(self, messages: list[dict[str, str]], max_tokens: int) -> str | None:
        if not self._bucket.take():
            self._count("limited")
            return None
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        self.usage.calls += 1
        try:
            response = await self._client.post(self._url, json=body)
            response.raise_for_status()
            payload = response.json()
            usage = payload.get("usage") or {}
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
            content = str(payload["choices"][0]["message"]["content"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            del exc  # any failure: the buffer rule decides; the outcome is counted
            self.usage.errors += 1
            self._count("error")
            return None
        self._count("ok")
        return content

    def _count(self, outcome: Outcome) -> None:
        self.calls[outcome] += 1
        if self._on_call is not None:
            self._on_call(outcome)

    async def close(self) -> None:
        await self._client.aclose()


def router_from_settings(
    llm: LLMSettings,
    cluster: ClusterSettings,
    on_call: Callable[[Outcome], None] | None = None,
) -> LLMRouter | None:
    """A router only when an LLM backend is configured and routing is enabled."""
    if llm.backend != "openai" or not cluster.route_with_llm:
        return None
    return LLMRouter(llm, cluster, on_call=on_call)
