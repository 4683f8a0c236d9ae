"""``MemoryClient`` and ``AsyncMemoryClient``: the verbs, the requests, the retries.

Verbs follow what people know from mem0: ``add``, ``retrieve`` (alias ``search``),
``memories``, ``get``, ``forget``. Results are the pydantic models the server speaks, so they
are typed end to end. ``AsyncMemoryClient`` has the same verbs for asyncio bots.

One implementation of each verb: ``_Calls`` turns a verb into a request (method, path,
query, body) and a response into its model; the two clients only carry the request, with
a pooled connection, a timeout, and retries. Every call is safe to retry: ``add`` gives
each event its id before the first attempt (the pipeline drops an id it has seen), the
others read or delete. Connection failures and 429 / 502 / 503 / 504 are retried, at most
``retries`` times: after the server's ``Retry-After-Ms`` / ``Retry-After`` when it sends one
(the admission control's 503 and 429 do; capped at ``max_retry_after_s``), else after an
exponential backoff, both jittered up by as much as half so that refused callers do not
come back together. Any other error raises ``MemstreamError`` with the server's ``detail``.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from memstream.schemas import (
    AddEventsRequest,
    AddEventsResponse,
    ConsolidatedMemory,
    EventIn,
    RetrieveRequest,
    RetrieveResponse,
)
from memstream.schemas.events import EventMetadata, Role
from memstream.schemas.rpc import ForgetResponse, MemoryPage

M = TypeVar("M", bound=BaseModel)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER_S = 5.0


class MemstreamError(RuntimeError):
    """The service answered with an error; ``status`` and the server's ``detail`` are kept.

    ``reason`` is the detail as one short line (a 422's field errors flattened).
    """

    def __init__(self, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        self.reason = detail_text(detail)
        super().__init__(f"memstream answered {status}: {self.reason}")


def detail_text(detail: Any, limit: int = 200) -> str:
    """A server's ``detail`` as one line: FastAPI's 422 list becomes ``field: message; ...``."""
    if isinstance(detail, list):
        parts = []
        for error in detail[:3]:
            if isinstance(error, dict):
                where = ".".join(str(p) for p in error.get("loc", []) if p != "body")
                parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        text = "; ".join(parts) + (f" (+{len(detail) - 3} more)" if len(detail) > 3 else "")
    else:
        text = str(detail)
    text = " ".join(text.split())  # an HTML error page from something else: one line
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Call(Generic[M]):
    method: str
    path: str
    model: type[M]
    params: dict[str, Any] | None = None
    body: dict[str, Any] | None = None

    def parse(self, response: httpx.Response) -> M:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise MemstreamError(response.status_code, detail)
        return self.model.model_validate_json(response.content)


class _Calls:
    """Each verb as a ``Call``: validation happens here, before anything is sent."""

    @staticmethod
    def add(events: Sequence[EventIn]) -> Call[AddEventsResponse]:
        with_ids = [e.model_copy(update={"event_id": e.event_id or _new_id()}) for e in events]
        body = AddEventsRequest(events=with_ids).model_dump(mode="json")
        return Call("POST", "/v1/events", AddEventsResponse, body=body)

    @staticmethod
    def event(
        user_id: str,
        text: str,
        session_id: str,
        role: Role,
        event_id: str | None,
        ts: datetime | None,
        metadata: EventMetadata | None,
    ) -> EventIn:
        return EventIn(
            user_id=user_id,
            session_id=session_id,
            role=role,
            text=text,
            event_id=event_id or _new_id(),
            ts=ts,
            metadata=metadata or EventMetadata(),
        )

    @staticmethod
    def retrieve(
        user_id: str, query: str, budget_tokens: int, top_k: int, after_event_id: str | None
    ) -> Call[RetrieveResponse]:
        body = RetrieveRequest(
            user_id=user_id,
            query=query,
            budget_tokens=budget_tokens,
            top_k=top_k,
            after_event_id=after_event_id,
        ).model_dump(mode="json", exclude_none=True)
        return Call("POST", "/v1/retrieve", RetrieveResponse, body=body)

    @staticmethod
    def memories(user_id: str, limit: int, offset: str | None) -> Call[MemoryPage]:
        params: dict[str, Any] = {"limit": limit}
        if offset is not None:
            params["offset"] = offset
        return Call("GET", f"/v1/users/{_segment(user_id)}/memories", MemoryPage, params=params)

    @staticmethod
    def get(user_id: str, memory_id: str) -> Call[ConsolidatedMemory]:
        path = f"/v1/memories/{_segment(memory_id)}"
        return Call("GET", path, ConsolidatedMemory, params={"user_id": user_id})

    @staticmethod
    def forget(user_id: str) -> Call[ForgetResponse]:
        return Call("DELETE", f"/v1/users/{_segment(user_id)}", ForgetResponse)


def _new_id() -> str:
    return uuid.uuid4().hex


def _segment(value: str) -> str:
    """A path segment; ids are a safe alphabet (``schemas.common.Identifier``), but a slash
    in a caller's value must become a 404/422, never another route."""
    return quote(value, safe="")


def retry_delay(
    attempt: int,
    headers: Mapping[str, str] | None,
    backoff_s: float,
    cap_s: float,
    rng: random.Random,
) -> float:
    """Seconds to wait before attempt ``attempt + 1``: the server's hint when its answer's
    ``headers`` (case-insensitive, as httpx's and aiohttp's are; None: no answer came) gave
    one (``Retry-After-Ms``, else ``Retry-After`` in seconds; capped at ``cap_s``), else
    ``backoff_s * 2**attempt``; then up to half of it again at random (never less than
    the hint: honouring it is the point)."""
    base: float = backoff_s * 2.0**attempt
    if headers is not None:
        hint = _retry_after_s(headers)
        if hint is not None:
            base = min(hint, cap_s)
    return base * (1.0 + 0.5 * rng.random())


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                seconds = float(value) * scale
            except ValueError:
                continue  # an HTTP date: not sent by memstream, fall back to backoff
            if seconds >= 0:
                return seconds
    return None


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


class MemoryClient:
    """Blocking client; one pooled connection per instance. Close it (or use ``with``)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: str = "",
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.1,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self._rng = random.Random()
        self._http = httpx.Client(
            base_url=url, headers=_headers(api_key), timeout=timeout_s, transport=transport
        )

    def add(
        self,
        user_id: str,
        text: str,
        *,
        session_id: str,
        role: Role = "user",
        event_id: str | None = None,
        ts: datetime | None = None,
        metadata: EventMetadata | None = None,
    ) -> AddEventsResponse:
        event = _Calls.event(user_id, text, session_id, role, event_id, ts, metadata)
        return self._send(_Calls.add([event]))

    def add_many(self, events: Sequence[EventIn]) -> AddEventsResponse:
        return self._send(_Calls.add(events))

    def retrieve(
        self,
        user_id: str,
        query: str,
        *,
        budget_tokens: int = 512,
        top_k: int = 8,
        after_event_id: str | None = None,
    ) -> RetrieveResponse:
        """``after_event_id``: read your own writes (see ``RetrieveRequest``)."""
        return self._send(_Calls.retrieve(user_id, query, budget_tokens, top_k, after_event_id))

    search = retrieve

    def memories(self, user_id: str, *, limit: int = 20, offset: str | None = None) -> MemoryPage:
        return self._send(_Calls.memories(user_id, limit, offset))

    def get(self, user_id: str, memory_id: str) -> ConsolidatedMemory:
        return self._send(_Calls.get(user_id, memory_id))

    def forget(self, user_id: str) -> ForgetResponse:
        return self._send(_Calls.forget(user_id))

    def _send(self, call: Call[M]) -> M:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            response: httpx.Response | None = None
            try:
                response = self._http.request(
                    call.method, call.path, params=call.params, json=call.body
                )
            except httpx.TransportError:
                if last:
                    raise
            else:
                if response.status_code not in RETRY_STATUSES or last:
                    return call.parse(response)
            time.sleep(self._delay(attempt, response))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        headers = None if response is None else response.headers
        return retry_delay(attempt, headers, self.backoff_s, self.max_retry_after_s, self._rng)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncMemoryClient:
    """The same verbs for asyncio; one pooled connection per instance. ``async with`` it."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: str = "",
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.1,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self._rng = random.Random()
        self._http = httpx.AsyncClient(
            base_url=url, headers=_headers(api_key), timeout=timeout_s, transport=transport
        )

    async def add(
        self,
        user_id: str,
        text: str,
        *,
        session_id: str,
        role: Role = "user",
        event_id: str | None = None,
        ts: datetime | None = None,
        metadata: EventMetadata | None = None,
    ) -> AddEventsResponse:
        event = _Calls.event(user_id, text, session_id, role, event_id, ts, metadata)
        return await self._send(_Calls.add([event]))

    async def add_many(self, events: Sequence[EventIn]) -> AddEventsResponse:
        return await self._send(_Calls.add(events))

    async def retrieve(
        self,
        user_id: str,
        query: str,
        *,
        budget_tokens: int = 512,
        top_k: int = 8,
        after_event_id: str | None = None,
    ) -> RetrieveResponse:
        """``after_event_id``: read your own writes (see ``RetrieveRequest``)."""
        return await self._send(
            _Calls.retrieve(user_id, query, budget_tokens, top_k, after_event_id)
        )

    search = retrieve

    async def memories(
        self, user_id: str, *, limit: int = 20, offset: str | None = None
    ) -> MemoryPage:
        return await self._send(_Calls.memories(user_id, limit, offset))

    async def get(self, user_id: str, memory_id: str) -> ConsolidatedMemory:
        return await self._send(_Calls.get(user_id, memory_id))

    async def forget(self, user_id: str) -> ForgetResponse:
        return await self._send(_Calls.forget(user_id))

    async def _send(self, call: Call[M]) -> M:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            response: httpx.Response | None = None
            try:
                response = await self._http.request(
                    call.method, call.path, params=call.params, json=call.body
                )
            except httpx.TransportError:
                if last:
                    raise
            else:
                if response.status_code not in RETRY_STATUSES or last:
                    return call.parse(response)
            await asyncio.sleep(self._delay(attempt, response))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        headers = None if response is None else response.headers
        return retry_delay(attempt, headers, self.backoff_s, self.max_retry_after_s, self._rng)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
