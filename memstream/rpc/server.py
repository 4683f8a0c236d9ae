"""The HTTP/JSON API: retrieval, event intake, memories, forget, health, metrics.

The tenant is the API key's, never the body's; every store call names the tenant and the
user, so one tenant can never read, list or delete another's data (a memory of another
tenant or user is a 404, not a 403: its existence is not disclosed). Client mistakes are
4xx with a ``detail`` that says what to fix: 401 no or unknown key, 403 the demo key once
real keys are configured, 404 no such memory, 413 a body over ``rpc.max_body_bytes``
(declared or chunked), 422 a body, path or query that does not validate. Retrieval passes
admission control first (``rpc.gate``): 503 / 429 with ``Retry-After`` when refused, 504
when the caller's ``X-Request-Deadline-Ms`` passed before the work started. Event intake is
refused whole with a 429 and ``Retry-After`` while the pipeline lags past
``rpc.ingest_max_lag`` (``rpc.ingest``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import (
    Depends,
    FastAPI,
    Header,
    HTTPException,
    Path,
    Query,
    Request,
    Response,
    Security,
)
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstream.metrics import Metrics
from memstream.rpc.feedback import FeedbackSink
from memstream.rpc.gate import DEADLINE_HEADER, Gate, params_of, retry_headers
from memstream.rpc.ingest import IngestGuard
from memstream.rpc.intake import Intake
from memstream.rpc.retrieval import Retriever
from memstream.schemas import (
    AddEventsRequest,
    AddEventsResponse,
    ConsolidatedMemory,
    Control,
    Feedback,
    InteractionEvent,
    RetrieveRequest,
    RetrieveResponse,
)
from memstream.schemas.common import USER_ID_RULE, UserId
from memstream.schemas.rpc import ErrorBody, ForgetResponse, MemoryPage
from memstream.settings import DEMO_API_KEY, DEMO_TENANT, KafkaSettings, RPCSettings
from memstream.stores.forget import forget_user
from memstream.streaming.broker import EventPublisher

UserPath = Annotated[UserId, Path(description=f"the user's id: {USER_ID_RULE}")]
MAX_PAGE = 200
ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "missing or unknown API key"},
    403: {"model": ErrorBody, "description": "a key that is known but not allowed here"},
    413: {"model": ErrorBody, "description": "request body too large"},
    415: {"model": ErrorBody, "description": "a body not sent as `application/json`"},
    422: {"model": ErrorBody, "description": "the request does not validate"},
    503: {"model": ErrorBody, "description": "short-term memory (Redis) did not answer: retry "
          "after `Retry-After` s (`Retry-After-Ms` ms)"},
}  # fmt: skip
SHED: dict[int | str, dict[str, object]] = {
    429: {"model": ErrorBody, "description": "the tenant holds its fair share: retry after "
          "`Retry-After` s (`Retry-After-Ms` ms)"},
    503: {"model": ErrorBody, "description": "overloaded, refused before any work (or "
          "short-term memory did not answer): retry after `Retry-After` s (`Retry-After-Ms` ms)"},
    504: {"model": ErrorBody, "description": f"`{DEADLINE_HEADER}` passed before the work "
          "started; it was not done"},
}  # fmt: skip
INGEST_SHED: dict[int | str, dict[str, object]] = {
    429: {"model": ErrorBody, "description": "the pipeline is behind (`rpc.ingest_max_lag` "
          "events accepted and not yet memorized): none of the request's events were "
          "accepted; send the same request again after `Retry-After` s (`Retry-After-Ms` ms)"},
    503: {"model": ErrorBody, "description": "the intake journal could not be written: none "
          "of the request's events were accepted; send the same request again"},
}  # fmt: skip
NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorBody, "description": "no such memory for this tenant and user"}
}


log = logging.getLogger("memstream.rpc")


@dataclass
class ApiDeps:
    rpc: RPCSettings
    kafka: KafkaSettings  # the topics the API publishes to
    retriever: Retriever
    publisher: EventPublisher
    metrics: Metrics
    feedback: FeedbackSink | None = None  # None: nothing reported (tests, benchmarks)
    ingest: IngestGuard | None = None  # None: event intake never refused (tests, benchmarks)
    intake: Intake | None = None  # None: no journal (rpc.journal off; tests, benchmarks)


# Declared as security schemes (not header parameters) so that the OpenAPI document says
# how to authenticate: Swagger UI's Authorize button, and generated clients, use them.
# auto_error=False: ``authenticate`` words the 401s itself.
BEARER = HTTPBearer(
    scheme_name="bearerKey",
    description="`Authorization: Bearer <api key>`; the key decides the tenant.",
    auto_error=False,
)
API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key",
    scheme_name="apiKeyHeader",
    description="The same API key in an `X-API-Key` header.",
    auto_error=False,
)
TAGS = [
    {"name": "memory", "description": "Retrieve context for a reply; read consolidated memories."},
    {
        "name": "events",
        "description": "Publish conversation turns (asynchronous: a turn is "
        "retrievable once the pipeline has processed it: well under a second when idle, "
        "seconds under load).",
    },
    {"name": "users", "description": "Forget a user everywhere."},
    {"name": "operations", "description": "Liveness and readiness probes."},
]


async def authenticate(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
    _api_key: Annotated[str | None, Security(API_KEY_HEADER)],
) -> str:
    """The tenant of the caller's API key (``Authorization: Bearer`` or ``X-API-Key``).

    ``async`` though it never awaits: FastAPI runs a plain ``def`` dependency in its
    thread pool, a hand-off to a worker thread and back on every request (in the serve
    process's profile under one caller, 4% of its samples, on the caller's path)."""
    # The raw headers, not the schemes' parsed values: a malformed Authorization header
    # gets a 401 that says how to write it rather than being ignored.
    authorization = request.headers.get("authorization")
    key = request.headers.get("x-api-key")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise HTTPException(401, "use 'Authorization: Bearer <api key>'")
        key = token.strip()
    if not key:
        raise HTTPException(401, "missing API key ('Authorization: Bearer <api key>')")
    deps: ApiDeps = request.app.state.deps
    tenant = deps.rpc.tenant_for_key(key)
    if tenant is None and key == DEMO_API_KEY:
        # Known, but switched off: configuring real keys disables the documented demo key.
        raise HTTPException(403, "the demo key is disabled on this deployment (rpc.api_keys)")
    if tenant is None:
        raise HTTPException(401, "unknown API key")
    return tenant


Tenant = Annotated[str, Depends(authenticate)]


class RequestGuard:
    """Rejects oversized bodies (413) and bodies not declared JSON (415), and counts
    requests by route and status.

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

        too_large = JSONResponse({"detail": f"request body over {self.max_body_bytes} bytes"}, 413)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await too_large(scope, receive, send_and_note_status)
        elif _body_not_json(scope.get("method", ""), length, headers.get(b"content-type")):
            # Read as JSON anyway, such a body failed with "Input should be a valid dictionary".
            await JSONResponse({"detail": NOT_JSON}, 415)(scope, receive, send_and_note_status)
        elif length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            # No declared length (chunked): read up to the limit here, then replay it.
            buffered = await _read_body(receive, self.max_body_bytes)
            if buffered is None:
                await too_large(scope, receive, send_and_note_status)
            else:
                await self.app(scope, _replay(buffered, receive), send_and_note_status)
        else:
            await self.app(scope, receive, send_and_note_status)
        path = getattr(scope.get("route"), "path", "unmatched")  # set by the router on a match
        self.metrics.http_requests.labels(path, str(status)).inc()


NOT_JSON = "the request body must be JSON, sent with Content-Type: application/json"


def _body_not_json(method: str, length: bytes | None, content_type: bytes | None) -> bool:
    """A request that sends a body (declared or chunked) without a JSON media type."""
    if method not in ("POST", "PUT", "PATCH") or length == b"0":
        return False
    media = (content_type or b"").split(b";")[0].strip().lower()
    return not (media == b"application/json" or media.endswith(b"+json"))


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then whatever comes next (a disconnect)

    return replay


def create_api(deps: ApiDeps) -> FastAPI:
    rpc, metrics = deps.rpc, deps.metrics
    # FastAPIOffline: /docs (Swagger UI) and /redoc served from the assets inside the
    # fastapi-offline wheel, not from a CDN, so the pages work with no network.
    api = FastAPIOffline(
        title="memstream",
        version="0.1.0",
        description="Long-term memory for LLM chat agents. Authenticate with "
        "`Authorization: Bearer <api key>` (the **Authorize** button); the key decides the "
        "tenant.",
        openapi_tags=TAGS,
        generate_unique_id_function=_operation_id,
        swagger_ui_parameters={"persistAuthorization": True, "displayOperationId": True},
    )

    api.state.deps = deps  # memstream.generations swaps deps.retriever when the generation switches

    api.add_middleware(RequestGuard, max_body_bytes=rpc.max_body_bytes, metrics=metrics)
    gate = Gate(params_of(rpc), metrics) if rpc.admission else None
    metrics.declare_tenants(sorted(set(rpc.api_keys.values()) or {DEMO_TENANT}))

    # A store that does not answer (Valkey down, every pooled connection busy past its
    # wait) is the service's trouble, not the caller's: a 503 to retry, never a 500.
    api.add_exception_handler(RedisConnectionError, _store_unavailable)
    api.add_exception_handler(RedisTimeoutError, _store_unavailable)
    _route_retrieve(api, deps, gate)
    _route_memory_reads(api, deps)
    _route_forget(api, deps)
    _route_events(api, deps)
    _route_operations(api, deps)
    _declare_series(api, metrics)
    return api


STORE_RETRY_AFTER_MS = 1000


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("503 on %s: Redis did not answer: %r", request.url.path, exc)
    return JSONResponse(
        {"detail": f"short-term memory (Redis) did not answer: {type(exc).__name__}; retry"},
        503,
        headers=retry_headers(STORE_RETRY_AFTER_MS),
    )


# The routes, in the order the OpenAPI document lists them.


def _route_retrieve(api: FastAPI, deps: ApiDeps, gate: Gate | None) -> None:
    @api.post(
        "/v1/retrieve",
        response_model=RetrieveResponse,
        responses={**ERRORS, **SHED},
        tags=["memory"],
    )
    async def retrieve(
        body: RetrieveRequest,
        tenant_id: Tenant,
        request: Request,
        response: Response,
        deadline_ms: Annotated[
            float | None,
            Header(
                alias=DEADLINE_HEADER,
                # at least 1 ms: a budget spent before the server reads the request is the
                # caller's mistake (422), not a timeout of the server's (504)
                ge=1,
                description="the caller's budget in ms (at least 1) from when the server "
                "reads the request; work not started by then is dropped (504)",
            ),
        ] = None,
    ) -> RetrieveResponse:
        """The memories and turns that answer ``query``, and a context within the budget."""
        _note_backlog(request, response)
        memorized = None
        if body.after_event_id is not None:
            # Waited before taking an admission slot: a caller waiting on the pipeline holds
            # none. With a deadline, the wait leaves half of it for the retrieval itself.
            rpc = deps.rpc
            wait_ms = rpc.read_your_writes_max_ms
            if deadline_ms is not None:
                wait_ms = min(wait_ms, deadline_ms / 2)
            memorized = await deps.retriever.wait_memorized(
                tenant_id, body.user_id, body.after_event_id, wait_ms / 1000,
                rpc.read_your_writes_poll_ms / 1000,
            )  # fmt: skip
        if gate is None:
            answer = await deps.retriever.retrieve(tenant_id, body)
        else:
            async with gate.slot(tenant_id, deadline_ms):
                answer = await deps.retriever.retrieve(tenant_id, body)
        if memorized is not None:
            answer = answer.model_copy(update={"after_event_memorized": memorized})
        if deps.feedback is not None:
            deps.feedback.offer(
                Feedback(
                    feedback_id=uuid.uuid4().hex,  # one per retrieval: a redelivery boosts once
                    tenant_id=tenant_id,
                    user_id=body.user_id,
                    memory_ids=[i.id for i in answer.items if i.kind == "memory"][:256],
                    turn_ids=[i.id for i in answer.items if i.kind == "turn"][:256],
                    ts=datetime.now(UTC),
                )
            )
        return answer


def _route_memory_reads(api: FastAPI, deps: ApiDeps) -> None:
    @api.get(
        "/v1/users/{user_id}/memories", response_model=MemoryPage, responses=ERRORS, tags=["memory"]
    )
    async def list_memories(
        user_id: UserPath,
        tenant_id: Tenant,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
        offset: Annotated[str | None, Query(max_length=256)] = None,
    ) -> MemoryPage:
        """The user's consolidated memories, a page at a time."""
        try:
            memories, next_offset = await deps.retriever.longterm.list_user(
                tenant_id, user_id, limit, offset
            )
        except ValueError as exc:  # an offset that no page handed out (found by fuzzing)
            raise HTTPException(422, str(exc)) from exc
        return MemoryPage(memories=memories, next_offset=next_offset)

    @api.get(
        "/v1/memories/{memory_id}",
        response_model=ConsolidatedMemory,
        responses={**ERRORS, **NOT_FOUND},
        tags=["memory"],
    )
    async def get_memory(
        memory_id: Annotated[str, Path(min_length=1, max_length=64)],
        user_id: Annotated[UserId, Query(description=f"the user's id: {USER_ID_RULE}")],
        tenant_id: Tenant,
    ) -> ConsolidatedMemory:
        """One memory with its history of superseded facts; 404 unless it is this user's."""
        found = await deps.retriever.longterm.get(tenant_id, user_id, memory_id)
        if found is None:
            raise HTTPException(404, f"no memory {memory_id!r} for user {user_id!r}")
        return found


def _route_forget(api: FastAPI, deps: ApiDeps) -> None:
    @api.delete(
        "/v1/users/{user_id}", response_model=ForgetResponse, responses=ERRORS, tags=["users"]
    )
    async def forget(user_id: UserPath, tenant_id: Tenant) -> ForgetResponse:
        """Forget the user everywhere: short-term turns, clusters, counters and pending
        triggers in Redis, memories in Qdrant; then a ``forget_user`` control event makes
        the processors drop what was in flight. Forgetting twice is harmless."""
        at = datetime.now(UTC)
        retriever = deps.retriever
        gone = await forget_user(
            retriever.state, retriever.longterm, tenant_id, user_id, at.timestamp()
        )
        retriever.turn_index.evict(tenant_id, user_id)
        command = Control(tenant_id=tenant_id, user_id=user_id, action="forget_user", ts=at)
        await deps.publisher.publish(
            deps.kafka.topic("control"), command.user_key, command.model_dump_json().encode()
        )
        return ForgetResponse(
            user_id=user_id,
            redis_keys_deleted=gone.redis_keys_deleted,
            memories_deleted=gone.memories_deleted,
            forgotten_at=at,
        )


def _route_events(api: FastAPI, deps: ApiDeps) -> None:
    @api.post(
        "/v1/events",
        response_model=AddEventsResponse,
        status_code=202,
        responses={**ERRORS, **INGEST_SHED},
        tags=["events"],
    )
    async def add_events(body: AddEventsRequest, tenant_id: Tenant) -> AddEventsResponse:
        """Publish turns to ``memstream.events`` (202: accepted, not yet processed). A turn is
        retrievable once encode and memorize have handled it: well under a second when idle,
        seconds while a backlog is queued. Past ``rpc.ingest_max_lag`` events not yet
        memorized, a 429 refuses the whole request: send it again after ``Retry-After``."""
        if deps.ingest is not None:
            deps.ingest.admit(tenant_id)
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
        values = [e.model_dump_json().encode() for e in events]
        if deps.intake is not None:
            # On disk (fsynced) before the broker has them: a 202 survives a crash of the
            # stack, the embedded broker's memory-only topics included.
            try:
                await deps.intake.append(values)
            except OSError as exc:  # a full or failing disk: nothing accepted, retry later
                raise HTTPException(503, f"the intake journal cannot write: {exc}") from exc
        await deps.publisher.publish_many(
            deps.kafka.topic("events"),
            [(e.user_key, v) for e, v in zip(events, values, strict=True)],
        )
        if deps.ingest is not None:
            deps.ingest.accepted(len(events))
        return AddEventsResponse(accepted=len(events), event_ids=[e.event_id for e in events])


def _route_operations(api: FastAPI, deps: ApiDeps) -> None:
    metrics = deps.metrics

    @api.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> JSONResponse:
        """Ready when the stores answer. Catching up (a replay still settling) stays ready:
        answers are valid, only incomplete; ``pending_events`` says how far behind.
        ``ingest_lag`` (events accepted and not yet memorized, as last read from the broker;
        null when unknown) never makes it unready: past ``ingest_max_lag`` only event
        intake is refused, retrieval goes on."""
        started = time.perf_counter()
        pending = _pending_events(request)
        checks = {
            "redis": await _safe(deps.retriever.state.ping()),
            "qdrant": await _safe(deps.retriever.longterm.ping()),
            "broker": await _safe(deps.publisher.ping()),
        }
        ok = all(checks.values())
        body = {
            "ready": ok,
            "checks": checks,
            "catching_up": pending > 0,
            "pending_events": pending,
            "ingest_lag": None if deps.ingest is None else deps.ingest.lag(),
            "ingest_max_lag": deps.rpc.ingest_max_lag,
            "took_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        return JSONResponse(body, 200 if ok else 503)


def _operation_id(route: APIRoute) -> str:
    """The handler's name (``retrieve``, ``add_events``): what generated clients call it."""
    return route.name


def _declare_series(api: FastAPI, metrics: Metrics) -> None:
    """Every API route's success and 500 series at zero, so error-rate queries read 0, not
    nothing (the docs pages are left to appear when used)."""
    metrics.declare_roles(["serve"])
    for route in api.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            for status in (route.status_code or 200, 500):
                metrics.http_requests.labels(route.path, str(status))


CATCHING_UP_HEADER = "X-Memstream-Catching-Up"


def _pending_events(request: Request) -> int:
    """Events this process published that its pipeline has not settled (0: none known).

    ``app.state.backlog`` is set by ``memstream up`` (memstream.runtime.Backlog)."""
    source: Callable[[], int] | None = getattr(request.app.state, "backlog", None)
    return source() if source is not None else 0


def _note_backlog(request: Request, response: Response) -> None:
    """While data is still arriving, say so: an empty answer may only be early."""
    pending = _pending_events(request)
    if pending > 0:
        response.headers[CATCHING_UP_HEADER] = str(pending)


async def _safe(check: Awaitable[bool]) -> bool:
    try:
        return bool(await check)
    except Exception:
        return False
