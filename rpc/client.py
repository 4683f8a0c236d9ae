"""The Python client bots import: ``MemoryClient(url, api_key).retrieve(user, query)``.

Verbs follow what people know from mem0 (``add``, ``retrieve`` / ``search``). Results are the
same pydantic models the server speaks, so they are typed end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from schemas import AddEventsRequest, AddEventsResponse, EventIn, RetrieveRequest, RetrieveResponse
from schemas.events import EventMetadata, Role


class MemstreamError(RuntimeError):
    """The service answered with an error; ``status`` and the server's ``detail`` are kept."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"memstream answered {status}: {detail}")
        self.status = status
        self.detail = detail


class MemoryClient:
    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: str = "",
        *,
        timeout_s: float = 5.0,
        retries: int = 2,
    ) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
            transport=httpx.HTTPTransport(retries=retries),  # retries connection failures
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
        event = EventIn(
            user_id=user_id,
            session_id=session_id,
            role=role,
            text=text,
            event_id=event_id,
            ts=ts,
            metadata=metadata or EventMetadata(),
        )
        return self.add_many([event])

    def add_many(self, events: Sequence[EventIn]) -> AddEventsResponse:
        body = AddEventsRequest(events=list(events))
        return AddEventsResponse.model_validate(
            self._post("/v1/events", body.model_dump(mode="json"))
        )

    def retrieve(
        self, user_id: str, query: str, *, budget_tokens: int = 512, top_k: int = 8
    ) -> RetrieveResponse:
        body = RetrieveRequest(
            user_id=user_id, query=query, budget_tokens=budget_tokens, top_k=top_k
        )
        return RetrieveResponse.model_validate(
            self._post("/v1/retrieve", body.model_dump(mode="json"))
        )

    search = retrieve

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = self._http.post(path, json=body)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise MemstreamError(response.status_code, detail)
        return response.json()

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
