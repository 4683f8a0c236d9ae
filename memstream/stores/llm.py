"""Consolidation backends: the offline extractive default and any OpenAI-compatible server.

Both sit behind ``Consolidator``. The workers pick one with ``consolidator_from_settings``
and then only call ``consolidate``; the merge into the stored memory (supersession,
history, idempotency) is ``memory.consolidation.merge_memory``'s job, whoever wrote the
content.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal, Protocol

import httpx
from pydantic import ValidationError

from memstream.memory.consolidation import extract_memory
from memstream.memory.extractive import Cut
from memstream.schemas import ConsolidatedMemory, MemoryContent, StoredTurn
from memstream.settings import LLMSettings
from memstream.stores.cpu import off_loop


class LLMError(RuntimeError):
    """The model server gave no usable answer after every retry (or refused the request)."""


@dataclass
class LLMUsage:
    """Running totals for metrics: HTTP calls made, tokens the server reported, failed calls,
    repair asks, memories the extractive fallback wrote, and extractive memories cut short
    (``memory.extractive.Extraction.cut``)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    repairs: int = 0
    fallbacks: int = 0
    cuts: int = 0


async def _extractive(
    key: str,
    turns: Sequence[StoredTurn],
    now: datetime,
    usage: LLMUsage,
    on_cut: Callable[[Cut], None] | None,
) -> MemoryContent:
    """``extract_memory`` in a worker thread: its work is bounded (``WORK_BUDGET``, read
    bounds) but up to a few hundred milliseconds of CPU, which on the event loop would stall
    every other tenant and ``/healthz``. A cut memory is still the answer (never retried);
    ``on_cut(reason)`` hears of it (``memstream_consolidations_cut_total``)."""
    extraction = await off_loop(partial(extract_memory, key, list(turns), now))
    if extraction.cut is not None:
        usage.cuts += 1
        if on_cut is not None:
            on_cut(extraction.cut)
    return extraction.content


class Consolidator(Protocol):
    """Writes one structured memory for one key from its raw turns.

    Contract:
    - ``consolidate(key, turns, existing, now)`` returns a ``MemoryContent`` describing the
      key as of ``now``, built only from ``turns`` (oldest first is not assumed) and, when
      given, the ``existing`` memory it updates. The newest status wins. It never writes
      anything anywhere; the caller merges the result with ``merge_memory``.
    - It raises ``LLMError`` when it cannot produce content (a model server that stays
      down); it never returns partial or unvalidated content.
    - ``usage`` counts model calls and tokens (all zero for backends without a model).
    - ``close()`` releases connections; the consolidator is not used after it.
    - ``name`` is a short, constant label for logs and metrics.
    """

    name: str
    usage: LLMUsage

    async def consolidate(
        self,
        key: str,
        turns: Sequence[StoredTurn],
        existing: ConsolidatedMemory | None,
        now: datetime,
    ) -> MemoryContent: ...

    async def close(self) -> None: ...


class ExtractiveConsolidator:
    """The offline default: ``memory.consolidation.extract_memory``, no model server, run in
    a worker thread so that the event loop keeps serving; ``on_cut(reason)`` hears of every
    memory a read bound or the work budget cut short (``memstream_consolidations_cut_total``).

    The existing memory is not needed here: ``merge_memory`` folds the result into it.
    """

    name = "extractive"

    def __init__(self, on_cut: Callable[[Cut], None] | None = None) -> None:
        self.usage = LLMUsage()
        self._on_cut = on_cut

    async def consolidate(
        self,
        key: str,
        turns: Sequence[StoredTurn],
        existing: ConsolidatedMemory | None,
        now: datetime,
    ) -> MemoryContent:
        return await _extractive(key, turns, now, self.usage, self._on_cut)

    async def close(self) -> None:
        return None


SYSTEM_PROMPT = """\
You maintain the long-term memory of a customer-service assistant. You receive the raw \
conversation turns about one topic or entity (and the current memory of it, if any) and \
answer with ONE updated memory as JSON that matches the given schema.
Rules:
- Use only facts stated in the turns or the current memory. Never invent names, numbers, \
dates or promises.
- The newest turn wins: when a newer turn changes a status or a value, keep the newer one.
- title: at most 10 words. status: the current state in one short sentence.
- facts: at most 8 short sentences, each with the ids of the turns it comes from \
(source_event_ids) and their time (ts); set attribute for state-like facts \
("status", "delivery_date", "preference:<topic>", "address").
- Facts state what people did, have, plan or prefer, and who: never greetings, small \
talk, compliments or advice given to the other person.
- A topic key (topic:...) is a subject that recurs across sessions: its facts are a digest \
of what was said of it in different sessions, each "<speaker>: <fact>", and its title names \
who it is about and the subject.
- timeline: one entry per turn that changed something, with its ts and event_id.
- open_actions: promises not yet kept, with due (ISO 8601) when a deadline is stated.
- keys: order numbers, emails, phone numbers, product names and other exact identifiers.
- summary: one or two sentences.
Answer with the JSON object only."""

_FENCE = re.compile(r"^\s*```(?:json|JSON)?\s*(.*?)\s*```\s*$", re.DOTALL)


def memory_json_schema(max_items: int = 8, max_chars: int = 160) -> dict[str, Any]:
    """``MemoryContent``'s JSON schema in the form strict structured output accepts, bounded
    to ``max_items`` per list and ``max_chars`` per text (0: texts unbounded; see ``_bound``).

    Strict mode (OpenAI, vLLM, llama.cpp) wants every property listed as required and no
    ``default`` keywords; optional fields stay nullable, so the content is unchanged.
    """
    schema = MemoryContent.model_json_schema()

    def tighten(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("default", None)
            if node.get("type") == "object" and "properties" in node:
                node["required"] = list(node["properties"])
                node["additionalProperties"] = False
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    _bound(schema, max_items, max_chars)
    return schema


# Event ids, keys and attributes are short; a longer string there is a model running on.
_ID_LIKE = frozenset({"attribute", "event_id", "source_event_ids", "keys"})
_ID_CHARS = 64


def _bound(node: Any, max_items: int, max_chars: int, name: str = "") -> None:
    """Every array gets ``maxItems`` and every free-text string a ``maxLength``.

    Written into the schema so that a constrained decoder (llama.cpp's grammar, vLLM's
    guided decoding) cannot emit an endless list or string: a small model left unbounded
    repeats itself up to the token limit and returns truncated JSON.
    """
    if isinstance(node, dict):
        if node.get("type") == "array":
            node["maxItems"] = max_items
        elif node.get("type") == "string" and "format" not in node and max_chars > 0:
            node["maxLength"] = min(max_chars, _ID_CHARS) if name in _ID_LIKE else max_chars
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for prop_name, prop in value.items():
                    _bound(prop, max_items, max_chars, prop_name)
            else:  # anyOf branches and array items serve the property they sit in
                _bound(value, max_items, max_chars, name)
    elif isinstance(node, list):
        for value in node:
            _bound(value, max_items, max_chars, name)


# Upper bounds of what one JSON value costs in tokens, for ``schema_output_tokens``. Measured
# on SmolLM2's and Llama-style BPE vocabularies, JSON text runs 3-4 characters per token;
# 3 keeps the bound above the answers seen. An ISO timestamp with its quotes is ~12-20.
# Constrained decoders let the model pretty-print: a newline and an indent before every
# member and item, ~3 tokens each (SmolLM2-135M's answers were one third whitespace).
_CHARS_PER_TOKEN = 3
_LAYOUT = 3
_UNBOUNDED_CHARS = 400  # a string the schema leaves unbounded (max_text_chars=0)
_UNBOUNDED_ITEMS = 8


def schema_output_tokens(schema: dict[str, Any]) -> int:
    """The most tokens an answer matching ``schema`` can take: the default ``max_tokens``.

    Walks the bounds ``_bound`` wrote (``maxItems``, ``maxLength``) and adds the JSON around
    them (keys, quotes, commas). A cap below this truncates answers the schema allows; the
    bound is loose (most answers use a fraction), which costs nothing: generation stops at
    the closing brace.
    """
    defs = schema.get("$defs", {})

    def cost(node: Any) -> int:
        if not isinstance(node, dict):
            return 1
        if "$ref" in node:
            return cost(defs[node["$ref"].rsplit("/", 1)[-1]])
        if "anyOf" in node:
            return max(cost(branch) for branch in node["anyOf"])
        kind = node.get("type")
        if kind == "object":
            props = node.get("properties", {})
            return _LAYOUT + sum(
                math.ceil(len(k) / _CHARS_PER_TOKEN) + 2 + _LAYOUT + cost(v)
                for k, v in props.items()
            )
        if kind == "array":
            items = int(node.get("maxItems", _UNBOUNDED_ITEMS))
            return _LAYOUT + items * (cost(node.get("items", {})) + 1 + _LAYOUT)
        if kind == "string":
            if "format" in node:
                return 20
            return 2 + math.ceil(int(node.get("maxLength", _UNBOUNDED_CHARS)) / _CHARS_PER_TOKEN)
        return 4  # numbers, booleans, null

    return cost(schema)


def build_messages(
    key: str, turns: Sequence[StoredTurn], existing: ConsolidatedMemory | None, now: datetime
) -> list[dict[str, str]]:
    """The chat messages: rules as system, key + current memory + turns as user."""
    parts = [f"Memory key: {key}", f"Current time: {now.isoformat()}"]
    if existing is not None:
        current = existing.model_dump_json(include=set(MemoryContent.model_fields))
        parts.append(f"Current memory (update it, do not repeat it twice):\n{current}")
    lines = [
        f"[{t.ts.isoformat()}] {t.speaker or t.role}: {' '.join(t.text.split())} ({t.event_id})"
        for t in sorted(turns, key=lambda t: (t.ts, t.event_id))
    ]
    parts.append("Turns (oldest first):\n" + "\n".join(lines))
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def parse_content(text: str) -> MemoryContent:
    """The model's answer as ``MemoryContent``; tolerates a ```json fence around it.

    Naive timestamps are read as UTC, so they compare with the stored (aware) ones.
    Raises ``ValueError`` (``ValidationError`` is one) when it is not a valid memory.
    """
    if m := _FENCE.match(text):
        text = m.group(1)
    content = MemoryContent.model_validate(json.loads(text))
    return MemoryContent.model_validate(_aware(content.model_dump()))


FallbackReason = Literal["truncated", "invalid_json", "schema"]  # metrics.LLM_FALLBACK_REASONS


def repair_messages(
    messages: list[dict[str, str]], reason: FallbackReason, error: str, max_tokens: int
) -> list[dict[str, str]]:
    """The prompt of the one repair ask: ``messages`` with the user turn told that the
    answer was rejected, and why.

    The error text goes in, not the rejected answer: a truncated answer repeated back would
    cost its tokens again and invite the model to continue it. The note joins the last user
    message rather than following it, since chat templates that want roles to alternate
    (Gemma's, Mistral's) reject two user messages in a row.
    """
    why = {
        "truncated": f"it was cut off at the {max_tokens}-token output limit",
        "invalid_json": "it was not valid JSON",
        "schema": "it did not match the schema",
    }[reason]
    note = (
        f"Your previous answer was rejected: {why} ({error[:300]}). Answer again with ONE "
        "complete JSON object that matches the schema. Be brief: fewer facts, short "
        "sentences, no repetition."
    )
    *head, last = messages
    return [*head, {"role": last["role"], "content": f"{last['content']}\n\n{note}"}]


class OpenAICompatibleConsolidator:
    """Any OpenAI-compatible ``/chat/completions`` server with JSON-schema output.

    One pooled ``httpx.AsyncClient`` per consolidator. Two kinds of failure, handled apart:

    - The server does not answer (connection errors and timeouts, HTTP 408, 429 and 5xx):
      retried with exponential backoff (``backoff_s``, doubled per retry); after
      ``max_retries`` retries ``LLMError`` is raised (the worker retries the job later).
      Other HTTP errors (a bad request, a wrong key) raise at once.
    - The server answers, but not with a memory (cut off at ``max_tokens``, invalid JSON, a
      schema violation): asked once more with the error added (``repair_messages``) at
      ``repair_temperature`` -- the same prompt at temperature 0 gives the same answer --
      and if that answer is unusable too, the extractive consolidator writes the memory (in
      a worker thread; ``on_cut`` hears if it was cut short) and ``on_fallback(reason)`` is
      told (``memstream_llm_fallbacks_total``).

    ``max_tokens`` is ``settings.max_output_tokens`` or, when 0, what the schema's bounds
    allow (``schema_output_tokens``): the answer's length follows the schema, not a server
    default that cuts valid answers off.
    """

    name = "openai"

    def __init__(
        self,
        settings: LLMSettings,
        *,
        backoff_s: float = 0.5,
        on_fallback: Callable[[FallbackReason], None] | None = None,
        on_cut: Callable[[Cut], None] | None = None,
    ) -> None:
        headers = {"Content-Type": "application/json"}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self.model = settings.model
        self.max_retries = max(settings.max_retries, 0)
        self.backoff_s = backoff_s
        self.repair_temperature = settings.repair_temperature
        self.seed = settings.seed
        self.usage = LLMUsage()
        self._on_fallback = on_fallback
        self._on_cut = on_cut
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(settings.timeout_s))
        self._schema = memory_json_schema(settings.max_list_items, settings.max_text_chars)
        self.max_tokens = settings.max_output_tokens or schema_output_tokens(self._schema)

    async def consolidate(
        self,
        key: str,
        turns: Sequence[StoredTurn],
        existing: ConsolidatedMemory | None,
        now: datetime,
    ) -> MemoryContent:
        messages = build_messages(key, turns, existing, now)
        try:
            return await self._ask(messages, temperature=0.0)
        except _BadAnswer as first:
            self.usage.repairs += 1
            repair = repair_messages(messages, first.reason, first.detail, self.max_tokens)
            try:
                return await self._ask(repair, temperature=self.repair_temperature)
            except _BadAnswer as second:
                self.usage.fallbacks += 1
                if self._on_fallback is not None:
                    self._on_fallback(second.reason)
                return await _extractive(key, turns, now, self.usage, self._on_cut)

    async def _ask(self, messages: list[dict[str, str]], temperature: float) -> MemoryContent:
        """One answer, retrying only while the server does not answer."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "memory", "schema": self._schema, "strict": True},
            },
        }
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return await self._attempt(body)
            except _Unavailable as exc:
                self.usage.errors += 1
                last_error = str(exc)
        raise LLMError(f"{self._url}: no answer after {self.max_retries + 1} tries: {last_error}")

    async def _attempt(self, body: dict[str, Any]) -> MemoryContent:
        self.usage.calls += 1
        try:
            response = await self._client.post(self._url, json=body)
        except httpx.TransportError as exc:  # connect, read, write, pool errors and timeouts
            raise _Unavailable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code in (408, 429):
            raise _Unavailable(f"HTTP {response.status_code}")
        if response.is_error:
            self.usage.errors += 1
            raise LLMError(f"{self._url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            payload = response.json()
            usage = payload.get("usage") or {}
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
            choice = payload["choices"][0]
            text = choice["message"]["content"]
            finish = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # Not the chat-completions protocol at all: a proxy's error page, say.
            raise _Unavailable(f"not a chat completion: {exc}"[:300]) from exc
        try:
            return parse_content(str(text))
        except ValidationError as exc:
            self.usage.errors += 1
            # A cut-off answer usually fails as JSON; it is reported as what it is.
            reason: FallbackReason = "truncated" if finish == "length" else "schema"
            raise _BadAnswer(reason, str(exc)) from exc
        except ValueError as exc:  # json.JSONDecodeError
            self.usage.errors += 1
            raise _BadAnswer(
                "truncated" if finish == "length" else "invalid_json", str(exc)
            ) from exc

    async def close(self) -> None:
        await self._client.aclose()


class _Unavailable(Exception):
    """One attempt the server did not answer; a retry after a backoff may fix it."""


class _BadAnswer(Exception):
    """The server answered, but not with a usable memory."""

    def __init__(self, reason: FallbackReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: FallbackReason = reason
        self.detail = detail


def consolidator_from_settings(
    settings: LLMSettings,
    on_fallback: Callable[[FallbackReason], None] | None = None,
    on_cut: Callable[[Cut], None] | None = None,
) -> Consolidator:
    """``backend="extractive"`` (default, offline) or ``"openai"`` (any compatible server);
    ``on_fallback`` hears of every memory the extractive fallback wrote instead of the LLM,
    ``on_cut`` of every extractive memory cut short (either backend's)."""
    if settings.backend == "openai":
        return OpenAICompatibleConsolidator(settings, on_fallback=on_fallback, on_cut=on_cut)
    return ExtractiveConsolidator(on_cut=on_cut)


def _aware(value: Any) -> Any:
    """Every naive datetime inside ``value`` (dicts and lists) read as UTC."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, dict):
        return {k: _aware(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_aware(v) for v in value]
    return value
