"""The HTTP/JSON API: retrieval, event intake, health and metrics. Tenant = the API key's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstream.metrics import Metrics
from memstream.settings import Settings
from rpc.publisher import EventPublisher
from rpc.retrieval import Retriever
from schemas import (
    AddEventsRequest,
    AddEventsResponse,
    InteractionEvent,
    RetrieveRequest,
    RetrieveResponse,
)


@dataclass
class ApiDeps:
    settings: Settings
    retriever: Retriever
    publisher: EventPublisher
    metrics: Metrics


def authenticate(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> str:
    """The tenant of the caller's API key (``Authorization: Bearer`` or ``X-API-Key``)."""
    key = x_api_key
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "use 'Authorization: Bearer <api key>'")
        key = token.strip()
    if not key:
        raise HTTPException(401, "missing API key ('Authorization: Bearer <api key>')")
    settings: Settings = request.app.state.settings
    tenant = settings.tenant_for_key(key)
    if tenant is None:
        raise HTTPException(401, "unknown API key")
    return tenant


Tenant = Annotated[str, Depends(authenticate)]


class RequestGuard:
    """Rejects oversized bodies (413) and counts requests by route and status.

    Plain ASGI rather than ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware
    wraps every request and response in extra tasks and streams, ~5 ms per call here.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            too_large = JSONResponse(
                {"detail": f"request body over {self.max_body_bytes} bytes"}, 413
            )
            await too_large(scope, receive, send_and_note_status)
        else:
            await self.app(scope, receive, send_and_note_status)
        path = getattr(scope.get("route"), "path", "unmatched")  # set by the router on a match
        self.metrics.http_requests.labels(path, str(status)).inc()


def create_api(deps: ApiDeps) -> FastAPI:
    settings, metrics = deps.settings, deps.metrics
    api = FastAPI(
        title="memstream",
        version="0.1.0",
        description="Long-term memory for LLM chat agents. Authenticate with "
        "`Authorization: Bearer <api key>`; the key decides the tenant.",
    )

    api.state.settings = settings

    api.add_middleware(RequestGuard, max_body_bytes=settings.rpc.max_body_bytes, metrics=metrics)

    @api.post("/v1/retrieve", response_model=RetrieveResponse)
    async def retrieve(body: RetrieveRequest, tenant_id: Tenant) -> RetrieveResponse:
        return await deps.retriever.retrieve(tenant_id, body)

    @api.post("/v1/events", response_model=AddEventsResponse, status_code=202)
    async def add_events(body: AddEventsRequest, tenant_id: Tenant) -> AddEventsResponse:
        now = datetime.now(UTC)
        events = [
            InteractionEvent(
                event_id=e.event_id or uuid.uuid4().hex,
                tenant_id=tenant_id,
                user_id=e.user_id,
                session_id=e.session_id,
                role=e.role,
                text=e.text,
                ts=e.ts or now,
                metadata=e.metadata,
            )
            for e in body.events
        ]
        await deps.publisher.publish_many(
            settings.topic("events"), [(e.user_key, e.model_dump_json().encode()) for e in events]
        )
        return AddEventsResponse(accepted=len(events), event_ids=[e.event_id for e in events])

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/readyz")
    async def readyz() -> JSONResponse:
        started = time.perf_counter()
        checks = {
            "redis": await _safe(deps.retriever.state.ping()),
            "qdrant": await _safe(deps.retriever.longterm.ping()),
            "broker": await _safe(deps.publisher.ping()),
        }
        ok = all(checks.values())
        body = {
            "ready": ok,
            "checks": checks,
            "took_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        return JSONResponse(body, 200 if ok else 503)

    return api


async def _safe(check: Awaitable[bool]) -> bool:
    try:
        return bool(await check)
    except Exception:
        return False
