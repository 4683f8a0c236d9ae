"""The retrieval API against real stores: isolation, forget, budget, key match, errors.

One app per module over the session's real Valkey and broker, a Qdrant Edge shard and the
real encoder; data is written the way the pipeline writes it (``RedisState.apply`` for
turns, ``LongTermStore.upsert`` for memories). Requests go through the ASGI app in process.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from memstream.client import AsyncMemoryClient, MemstreamError
from memstream.memory.clustering import ClusterParams
from memstream.memory.recurrence import RecurrenceParams
from memstream.memory.text import extract_entities
from memstream.metrics import Metrics
from memstream.rpc.feedback import FeedbackSink
from memstream.rpc.retrieval import QueryEncoder, Retriever
from memstream.rpc.server import ApiDeps, create_api
from memstream.schemas import (
    ConsolidatedMemory,
    Control,
    EncodedEvent,
    Fact,
    Feedback,
    InteractionEvent,
    StoredTurn,
)
from memstream.settings import Settings, hash_api_key
from memstream.stores.embedded import EmbeddedBroker, EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.longterm import ArchivedTurn, memory_point_id
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate
from memstream.streaming.broker import EventPublisher, bootstrap_servers
from memstream.streaming.stage import Received
from memstream.streams.memorize import Decision, Memorizer

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TENANTS = ("acme", "acme.eu", "globex")
# Ids that met in the stores when a user was named "tenant:user": the separator, its
# percent-encoding, scripts, NFC forms and case must all stay apart.
USERS = ("u1", "eu:u1", "eu%3Au1", "Zoë-名前", "bob@example.com", "BOB@example.com")
KEYS = {tenant: f"key-{tenant}-{uuid.uuid4().hex[:6]}" for tenant in TENANTS}
TOPICS = ("parcel delivery", "refund request", "password reset", "gift card balance")


def marker(tenant: str, user: str) -> str:
    """A word only this tenant's user's data contains (and no other's marker holds)."""
    if tenant in TENANTS and user in USERS:
        return f"zq{TENANTS.index(tenant)}x{USERS.index(user)}q"
    return f"zq{tenant}{user}q"


def path(user: str) -> str:
    return quote(user, safe="")


@dataclass
class Api:
    http: httpx.AsyncClient
    state: RedisState
    longterm: QdrantEdgeStore
    encoder: OnnxEncoder
    settings: Settings
    feedback: FeedbackSink
    transport: httpx.ASGITransport

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEYS[tenant]}"}


async def _seed(api: Api, tenant: str, user: str) -> None:
    texts = [f"{topic} for my account {marker(tenant, user)}" for topic in TOPICS]
    vectors = api.encoder.encode(texts)
    for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
        turn = StoredTurn(
            event_id=f"{marker(tenant, user)}-e{i}",
            session_id="s1",
            role="user",
            text=text,
            ts=T0 + timedelta(minutes=i),
            entities=extract_entities(text),
        )
        await api.state.apply(tenant, user, UserUpdate(turn.event_id, turn, vector))
        await api.longterm.upsert_turns([ArchivedTurn(tenant, user, turn, vector)])  # archive
    memory = ConsolidatedMemory(
        memory_id=memory_point_id(tenant, user, "topic:parcel"),
        tenant_id=tenant,
        user_id=user,
        key="topic:parcel",
        title=f"Parcel delivery {marker(tenant, user)}",
        facts=[Fact(text=f"The parcel of {marker(tenant, user)} is late")],
        created_at=T0,
        updated_at=T0 + timedelta(hours=1),
        source_event_ids=[f"{marker(tenant, user)}-e0"],
    )
    await api.longterm.upsert([(memory, api.encoder.encode([memory.title])[0])])


@pytest.fixture(scope="module")
async def api(
    broker: EmbeddedBroker, redis_server: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Api]:
    unique = uuid.uuid4().hex[:8]
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("api"),
        kafka={"broker": broker.url, "topic_prefix": f"api{unique}", "partitions": 1},
        redis={"url": redis_server.url, "prefix": f"api{unique}"},
        rpc={"api_keys": {hash_api_key(k): t for t, k in KEYS.items()}, "max_body_bytes": 20_000},
    )
    encoder = OnnxEncoder.from_settings(settings.encoder)
    state = RedisState.from_url(redis_server.url, prefix=settings.redis.prefix)
    longterm = QdrantEdgeStore(Path(settings.data_dir) / "shard")
    await longterm.ensure_collection(encoder.dim)
    publisher = EventPublisher(broker.url)
    await publisher.start()
    metrics = Metrics(CollectorRegistry())
    retriever = Retriever(
        queries=QueryEncoder(encoder),
        state=state,
        longterm=longterm,
        metrics=metrics,
        short_term_candidates=500,
    )
    feedback = FeedbackSink(publisher, settings.kafka.topic("feedback"))
    app = create_api(ApiDeps(settings.rpc, settings.kafka, retriever, publisher, metrics, feedback))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        found = Api(http, state, longterm, encoder, settings, feedback, transport)
        for tenant in TENANTS:
            for user in USERS:
                await _seed(found, tenant, user)
        yield found
    await feedback.close()
    await publisher.close()
    await longterm.close()
    await state.close()


# --- isolation ------------------------------------------------------------------------------

_words = st.sampled_from(["parcel", "refund", "password", "gift", "card", "late", "account"])


@settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    tenant=st.sampled_from(TENANTS),
    user=st.sampled_from(USERS),
    words=st.lists(_words, min_size=1, max_size=4),
    foreign=st.tuples(st.sampled_from(TENANTS), st.sampled_from(USERS)),
)
async def test_nobody_sees_another_tenants_or_users_data(
    api: Api, tenant: str, user: str, words: list[str], foreign: tuple[str, str]
) -> None:
    # The query even names another user's marker: it must still find nothing of theirs.
    query = " ".join([*words, marker(*foreign)])
    response = await api.http.post(
        "/v1/retrieve",
        json={"user_id": user, "query": query, "top_k": 20, "budget_tokens": 4096},
        headers=api.headers(tenant),
    )
    assert response.status_code == 200, response.text
    body = response.json()
    mine = marker(tenant, user)
    others = {marker(t, u) for t in TENANTS for u in USERS} - {mine}
    assert body["items"], "the caller's own data is found"
    for item in body["items"]:
        assert mine in item["text"]
        assert all(e.startswith(f"{mine}-") for e in item["source_event_ids"])
    assert not any(o in body["context"] for o in others)

    listed = await api.http.get(f"/v1/users/{path(user)}/memories", headers=api.headers(tenant))
    assert listed.status_code == 200
    assert [m["tenant_id"] for m in listed.json()["memories"]] == [tenant]
    assert {m["user_id"] for m in listed.json()["memories"]} == {user}

    ftenant, fuser = foreign
    theirs = memory_point_id(ftenant, fuser, "topic:parcel")
    got = await api.http.get(
        f"/v1/memories/{theirs}", params={"user_id": user}, headers=api.headers(tenant)
    )
    if (ftenant, fuser) == (tenant, user):
        assert got.status_code == 200
        assert got.json()["memory_id"] == theirs
    else:
        assert got.status_code == 404  # another's memory is not disclosed, even by a 403


# --- forget ---------------------------------------------------------------------------------


async def test_forgetting_a_user_whose_id_holds_the_separator_touches_no_other(api: Api) -> None:
    """The security report's pair, as ids may now spell it: ("acme", "eu:bob") and the users
    whose names once composed to the same string. Forgetting one leaves the others whole in
    Redis, the archive and the memories, and their retrievals still find only their own."""
    people = [("acme", "eu:bob"), ("acme", "eu%3Abob"), ("acme.eu", "bob"), ("acme", "eu")]
    for tenant, user in people:
        await _seed(api, tenant, user)
    forgotten, *kept = people
    client = AsyncMemoryClient("http://api", KEYS["acme"], transport=api.transport)
    await client.forget(forgotten[1])
    await client.close()
    assert await api.longterm.count(*forgotten) == 0
    assert await api.longterm.count_turns(*forgotten) == 0
    assert await api.state.count_hot_turns(*forgotten) == 0
    for tenant, user in kept:
        assert await api.longterm.count(tenant, user) == 1
        assert await api.longterm.count_turns(tenant, user) == len(TOPICS)
        assert await api.state.count_hot_turns(tenant, user) == len(TOPICS)
        got = await api.http.post(
            "/v1/retrieve",
            json={"user_id": user, "query": f"parcel {marker(*forgotten)}", "top_k": 20},
            headers=api.headers(tenant),
        )
        assert got.status_code == 200
        assert got.json()["items"]
        assert all(marker(tenant, user) in item["text"] for item in got.json()["items"])


async def _keys_of(state: RedisState, tenant: str, user: str) -> list[bytes]:
    return [k async for k in state.redis.scan_iter(match=f"{state.prefix}:*{tenant}:{user}*")]


async def test_forget_leaves_no_residue_and_in_flight_events_stay_forgotten(api: Api) -> None:
    tenant, user = "globex", "u-forget"
    await _seed(api, tenant, user)
    client = AsyncMemoryClient("http://api", KEYS[tenant], transport=api.transport)
    before = await client.retrieve(user, "where is my parcel")
    assert before.items
    assert await api.longterm.count(tenant, user) == 1
    assert await api.longterm.count_turns(tenant, user) == len(TOPICS)
    assert await _keys_of(api.state, tenant, user)

    gone = await client.forget(user)
    assert gone.memories_deleted == 1
    assert gone.redis_keys_deleted > 0

    # Directly in the stores: no turn, cluster, counter, pending trigger or memory left.
    residue = [k for k in await _keys_of(api.state, tenant, user) if b":forgotten:" not in k]
    assert residue == []
    assert await api.longterm.count(tenant, user) == 0
    assert await api.longterm.count_turns(tenant, user) == 0  # the archive tier too
    assert await api.state.redis.sismember(f"{api.state.prefix}:users", f"{tenant}:{user}") == 0
    after = await client.retrieve(user, "where is my parcel")
    assert (after.items, after.context) == ([], "")
    assert (await client.memories(user)).memories == []

    # An event stamped before the forget, still in flight, is not memorized again.
    memorizer = Memorizer(api.state, ClusterParams(), RecurrenceParams(), window=200)
    late = InteractionEvent(
        event_id="late-1",
        tenant_id=tenant,
        user_id=user,
        session_id="s1",
        role="user",
        text="my parcel zq is still late",
        ts=gone.forgotten_at - timedelta(seconds=1),
    )
    vector = api.encoder.encode([late.text])[0].tolist()
    encoded = EncodedEvent(event=late, embedding=vector, model_id="test")

    async def deliver(decided: object) -> None:
        return None

    [(_, dropped)] = await memorizer.memorize([[Received(encoded, None, b"")]], deliver)
    assert dropped == "forgotten"
    newer = late.model_copy(update={"event_id": "new-1", "ts": gone.forgotten_at + timedelta(1)})
    new = EncodedEvent(event=newer, embedding=vector, model_id="test")
    [(_, kept)] = await memorizer.memorize([[Received(new, None, b"")]], deliver)
    assert isinstance(kept, Decision)  # a new conversation is remembered again

    # The control event that makes every processor drop the user's in-flight data.
    commands = [Control.model_validate_json(v) for v in await _read(api, "control", 1)]
    mine = [(c.tenant_id, c.user_id, c.action) for c in commands if c.tenant_id == tenant]
    assert mine == [(tenant, user, "forget_user")]
    with pytest.raises(MemstreamError) as error:
        await client.forget("bad\tuser")
    assert error.value.status == 422
    await client.close()


async def _read(api: Api, name: str, at_least: int) -> list[bytes]:
    """Every record of one of the API's topics so far (at least ``at_least``)."""
    consumer = AIOKafkaConsumer(
        api.settings.kafka.topic(name),
        bootstrap_servers=bootstrap_servers(api.settings.kafka.broker),
        auto_offset_reset="earliest",
        group_id=f"test-{uuid.uuid4().hex[:6]}",
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        while len(values) < at_least:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            values += [r.value for records in batch.values() for r in records if r.value]
        batch = await consumer.getmany(timeout_ms=500)
        values += [r.value for records in batch.values() for r in records if r.value]
    finally:
        await consumer.stop()
    return values


async def test_retrieval_reports_what_it_used_as_feedback(api: Api) -> None:
    got = await api.http.post(
        "/v1/retrieve",
        json={"user_id": "eu:u1", "query": "parcel", "top_k": 5},
        headers=api.headers("acme.eu"),
    )
    assert got.status_code == 200
    await api.feedback.flush()
    assert api.feedback.sent >= 1
    sent = [Feedback.model_validate_json(v) for v in await _read(api, "feedback", 1)]
    mine = [f for f in sent if (f.tenant_id, f.user_id) == ("acme.eu", "eu:u1")]
    used = {i["id"] for i in got.json()["items"]}
    assert any(set(f.memory_ids + f.turn_ids) == used for f in mine)


# --- read your own writes -------------------------------------------------------------------


async def test_a_retrieval_after_an_event_waits_until_it_is_memorized(api: Api) -> None:
    """The bot posts a turn and asks at once: the answer waits for the turn (bounded) and
    says whether it got in; one that never comes is waited for at most the bound."""
    tenant, user = "acme", f"ryw-{uuid.uuid4().hex[:6]}"
    text = "my new address is 12 Quayside Road zqryw"
    turn = StoredTurn(event_id="ryw-e1", session_id="s1", role="user", text=text, ts=T0)
    asked = {"user_id": user, "query": "what is my address?", "after_event_id": turn.event_id}

    async def memorize_later() -> None:
        await asyncio.sleep(0.2)
        vector = api.encoder.encode([text])[0]
        await api.state.apply(tenant, user, UserUpdate(turn.event_id, turn, vector))

    later = asyncio.create_task(memorize_later())
    got = await api.http.post("/v1/retrieve", json=asked, headers=api.headers(tenant))
    await later
    assert got.status_code == 200, got.text
    assert got.json()["after_event_memorized"] is True
    assert "zqryw" in got.json()["context"]
    # Without after_event_id nothing is said of it.
    plain = {k: v for k, v in asked.items() if k != "after_event_id"}
    got = await api.http.post("/v1/retrieve", json=plain, headers=api.headers(tenant))
    assert got.json()["after_event_memorized"] is None
    # An event never memorized: the wait ends at half the caller's deadline, and says so.
    missing = {**asked, "after_event_id": "ryw-never"}
    started = asyncio.get_running_loop().time()
    got = await api.http.post(
        "/v1/retrieve",
        json=missing,
        headers={**api.headers(tenant), "X-Request-Deadline-Ms": "400"},
    )
    waited = asyncio.get_running_loop().time() - started
    assert got.status_code == 200, got.text
    assert got.json()["after_event_memorized"] is False
    assert 0.2 <= waited < 2.0
    # Another tenant's event of the same id is not this one's.
    other = await api.http.post(
        "/v1/retrieve",
        json=asked,
        headers={**api.headers("globex"), "X-Request-Deadline-Ms": "100"},
    )
    assert other.json()["after_event_memorized"] is False


# --- budget and key match -------------------------------------------------------------------


@pytest.mark.parametrize("budget", [32, 48, 64, 100, 256, 1024])
async def test_context_never_exceeds_the_budget(api: Api, budget: int) -> None:
    got = await api.http.post(
        "/v1/retrieve",
        json={"user_id": "u1", "query": "parcel refund card", "top_k": 20, "budget_tokens": budget},
        headers=api.headers("acme"),
    )
    body = got.json()
    assert api.encoder.count_tokens(body["context"]) == body["context_tokens"] <= budget
    if budget >= 256:
        assert body["items"]


async def test_an_order_number_finds_its_memory_and_turn_when_embeddings_miss(api: Api) -> None:
    tenant, user = "acme", "u-keys"
    await _seed(api, tenant, user)
    # The turn and memory that hold the order say nothing like the question does.
    text = "Grandma loved the tulips; the courier left them with a neighbour, ref A-99812"
    keys = extract_entities(text)
    assert keys
    turn = StoredTurn(
        event_id="keys-turn", session_id="s2", role="user", text=text, ts=T0, entities=keys
    )
    vector = api.encoder.encode([text])[0]
    await api.state.apply(tenant, user, UserUpdate(turn.event_id, turn, vector))
    memory = ConsolidatedMemory(
        memory_id=memory_point_id(tenant, user, keys[0]),
        tenant_id=tenant,
        user_id=user,
        key=keys[0],
        title="Tulips for grandma",
        keys=keys,
        created_at=T0,
        updated_at=T0,
        source_event_ids=["keys-turn"],
    )
    await api.longterm.upsert([(memory, vector)])
    question = "What is the status of order A-99812?"
    cosine = float(np.dot(api.encoder.encode([question])[0], vector))
    assert cosine < 0.5  # the embeddings alone would not bring it
    got = await api.http.post(
        "/v1/retrieve",
        json={"user_id": user, "query": question, "top_k": 3},
        headers=api.headers(tenant),
    )
    items = got.json()["items"]
    assert items[0]["id"] == memory.memory_id
    assert "Tulips for grandma" in got.json()["context"]


# --- errors ---------------------------------------------------------------------------------


async def test_client_mistakes_get_clear_4xx(api: Api) -> None:
    post = api.http.post
    assert (await post("/v1/retrieve", json={"user_id": "u1", "query": "x"})).status_code == 401
    bad_key = {"Authorization": "Bearer nope"}
    no = await post("/v1/retrieve", json={"user_id": "u1", "query": "x"}, headers=bad_key)
    assert no.status_code == 401
    assert "unknown API key" in no.json()["detail"]
    demo = {"Authorization": "Bearer ms-demo-key"}  # real keys are configured here
    off = await post("/v1/retrieve", json={"user_id": "u1", "query": "x"}, headers=demo)
    assert off.status_code == 403
    assert "demo key is disabled" in off.json()["detail"]
    h = api.headers("acme")
    assert (await post("/v1/retrieve", json={"user_id": "u1"}, headers=h)).status_code == 422
    spoof = {"user_id": "u1", "query": "x", "tenant_id": "globex"}
    assert (await post("/v1/retrieve", json=spoof, headers=h)).status_code == 422
    big = {"user_id": "u1", "query": "x" * 30_000}
    assert (await post("/v1/retrieve", json=big, headers=h)).status_code == 413
    json_h = {**h, "Content-Type": "application/json"}
    chunked = await post("/v1/retrieve", content=_chunks(b"x" * 30_000), headers=json_h)
    assert chunked.status_code == 413  # no Content-Length: counted as it arrives
    small = await post("/v1/retrieve", content=_chunks(b"parcel"), headers=json_h)
    assert small.status_code == 200
    # A JSON body not declared JSON: said so (415), not "Input should be a valid dictionary".
    raw = b'{"user_id": "u1", "query": "parcel"}'
    for content_type in (None, "text/plain"):
        typed = {**h, "Content-Type": content_type} if content_type else h
        undeclared = await post("/v1/retrieve", content=raw, headers=typed)
        assert undeclared.status_code == 415, undeclared.text
        assert "Content-Type: application/json" in undeclared.json()["detail"]
    with_charset = {**h, "Content-Type": "application/json; charset=utf-8"}
    assert (await post("/v1/retrieve", content=raw, headers=with_charset)).status_code == 200
    bad_user = await api.http.get("/v1/users/%20x/memories", headers=h)
    assert bad_user.status_code == 422
    missing = await api.http.get(
        f"/v1/memories/{uuid.uuid4()}", params={"user_id": "u1"}, headers=h
    )
    assert missing.status_code == 404
    assert "no memory" in missing.json()["detail"]
    page = await api.http.get("/v1/users/u1/memories", params={"limit": 0}, headers=h)
    assert page.status_code == 422


async def _chunks(query: bytes) -> AsyncIterator[bytes]:
    """A body sent without Content-Length (chunked), in pieces."""
    yield b'{"user_id": "u1", "query": "'
    for i in range(0, len(query), 4096):
        yield query[i : i + 4096]
    yield b'"}'
