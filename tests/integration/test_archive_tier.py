"""Nothing said is lost: a turn that left Redis is still retrieved, until a forget.

A real ``memstream up`` (broker, Valkey, Qdrant Edge, the encoder) with a small hot tier:
a turn older than the user's newest event minus the TTL (event time) and past the per-user
cap leaves Redis, and retrieval still finds it in the archive tier. A forget then clears
the archive too, and an event stamped before the forget, arriving after it, is not
archived again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from memstream.schemas import EncodedEvent, InteractionEvent
from memstream.settings import DEMO_TENANT, Settings
from memstream.stores.embedded import EmbeddedRedis
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.longterm import ArchivedTurn
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.workers.archive import ArchiveWorker
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = pytest.mark.integration

T0 = datetime(2023, 5, 8, 13, 0, tzinfo=UTC)  # long before the wall clock: event time rules
USER = "arch-u"
CAP = 20
FILLERS = 30


def archived_ok(process: MemstreamProcess) -> float:
    text = httpx.get(f"{process.url}/metrics", timeout=5).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "memstream_events_total"
        and s.labels.get("stage") == "archive"
        and s.labels.get("outcome") == "ok"
    )


def post(process: MemstreamProcess, events: list[dict[str, object]]) -> None:
    with process.client() as http:
        response = http.post("/v1/events", json={"events": events})
    assert response.status_code == 202, response.text


def event(event_id: str, text: str, ts: datetime) -> dict[str, object]:
    return {
        "event_id": event_id,
        "user_id": USER,
        "session_id": "s1",
        "role": "user",
        "text": text,
        "ts": ts.isoformat(),
    }


async def hot_ids(settings: Settings) -> tuple[list[str], int]:
    state = RedisState.from_url(settings.redis.url, prefix=settings.redis.prefix)
    try:
        return await state.timeline_ids(DEMO_TENANT, USER), await state.count_turns(
            DEMO_TENANT, USER
        )
    finally:
        await state.close()


@pytest.fixture
def small_hot_tier(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> Iterator[MemstreamProcess]:
    settings = settings_factory(
        redis={"short_term_ttl_days": 7.0, "short_term_max_turns": CAP, "archive_within_s": 0.2}
    )
    process = MemstreamProcess(with_free_port(settings), tmp_path / "memstream.log").start()
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.stop()


def test_a_turn_that_left_redis_is_retrieved_until_the_user_is_forgotten(
    small_hot_tier: MemstreamProcess,
) -> None:
    process, settings = small_hot_tier, small_hot_tier.settings
    old = event("e-locker", "My gym locker code is 4711, next to the zebra mural", T0)
    fillers = [
        event(f"e-{i:02d}", f"Just checking in, note {i} about the weekend weather", ts)
        for i in range(FILLERS)
        for ts in [T0 + timedelta(days=10, minutes=i)]
    ]
    post(process, [old, *fillers])
    total = 1 + FILLERS
    wait_for(lambda: asyncio.run(hot_ids(settings))[1] == total, 120, "every event memorized")
    wait_for(lambda: archived_ok(process) >= total, 60, "every turn archived")

    hot, written = asyncio.run(hot_ids(settings))
    assert written == total
    assert len(hot) == CAP  # the cap, and the TTL: the old turn is 10 days older than the rest
    assert "e-locker" not in hot

    with process.client() as http:
        answer = http.post(
            "/v1/retrieve", json={"user_id": USER, "query": "what is my gym locker code?"}
        ).json()
    found = {e for item in answer["items"] for e in item["source_event_ids"]}
    assert "e-locker" in found
    assert "4711" in answer["context"]

    with process.client() as http:
        gone = http.delete(f"/v1/users/{USER}").json()
    forgotten_at = datetime.fromisoformat(gone["forgotten_at"])
    # In flight when the user was forgotten (stamped before): stays forgotten. A new
    # conversation after the forget is remembered again.
    stale = event("e-stale", "My gym locker code is 4711", forgotten_at - timedelta(seconds=5))
    fresh = event("e-fresh", "Hello again", forgotten_at + timedelta(seconds=5))
    post(process, [stale, fresh])
    wait_for(lambda: archived_ok(process) >= total + 2, 60, "the late events handled")
    with process.client() as http:
        after = http.post("/v1/retrieve", json={"user_id": USER, "query": "locker code"}).json()
    assert "4711" not in after["context"]
    assert process.stop() == 0

    store = QdrantEdgeStore(settings.data_dir / "qdrant" / settings.qdrant.collection)
    try:
        turns, _ = asyncio.run(store.list_turns(DEMO_TENANT, USER, 100))
        assert [t.turn.event_id for t in turns] == ["e-fresh"]
    finally:
        asyncio.run(store.close())


class ForgetDuringWrite(QdrantEdgeStore):
    """A real Edge store, with a forget landing while the archive worker writes."""

    state: RedisState

    async def upsert_turns(self, turns: Sequence[ArchivedTurn]) -> int:
        # After the worker's tombstone check: the forget marks and sweeps, then the write lands.
        await self.state.mark_forgotten("acme", "u-race", T0.timestamp() + 60)
        await self.delete_turns("acme", "u-race")
        return await super().upsert_turns(turns)


async def test_archive_worker_keeps_forgotten_users_out(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    state = RedisState.from_url(redis_server.url, prefix=f"arch{tmp_path.name[-6:]}")
    store = ForgetDuringWrite(tmp_path / "shard")
    store.state = state
    await store.ensure_collection(encoder.dim)

    def encoded(user: str, event_id: str, minutes: int) -> EncodedEvent:
        event = InteractionEvent(
            event_id=event_id,
            tenant_id="acme",
            user_id=user,
            session_id="s1",
            role="user",
            text=f"turn {event_id}",
            ts=T0 + timedelta(minutes=minutes),
        )
        return EncodedEvent(
            event=event, embedding=encoder.encode([event.text])[0].tolist(), model_id="test"
        )

    try:
        await state.mark_forgotten("acme", "u-gone", T0.timestamp() + 60)
        worker = ArchiveWorker(state, store)
        batch = [
            encoded("u-gone", "g-before", 0),  # stamped before the forget: dropped
            encoded("u-gone", "g-after", 5),  # a new conversation after it: kept
            encoded("u-race", "r-before", 0),  # forgotten while being written: undone
            encoded("u-race", "r-after", 5),
            encoded("u-keep", "k1", 0),
        ]
        assert await worker.archive(batch) == 3
        kept = {
            user: sorted(t.turn.event_id for t in (await store.list_turns("acme", user, 10))[0])
            for user in ("u-gone", "u-race", "u-keep")
        }
        assert kept == {"u-gone": ["g-after"], "u-race": ["r-after"], "u-keep": ["k1"]}
    finally:
        await store.close()
        await state.close()
