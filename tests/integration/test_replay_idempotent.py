"""Replaying the same events, across a restart, duplicates no turn and no memory."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.services import Samples
from memstream.ops.demo import SAMPLE_STREAM
from memstream.ops.replay import replay_file, unsettled_work
from memstream.schemas import InteractionEvent
from memstream.settings import Settings
from memstream.stores.redis_client import sync_redis
from memstream.stores.redis_state import user_tag
from memstream.wiring import open_longterm
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = pytest.mark.integration


def _turn_counts(settings: Settings, users: list[str]) -> dict[str, int]:
    """Turns memorized per user: hot in Redis or gone on to the archive (meta ``tall``)."""
    r = sync_redis(settings.redis.url)
    try:
        return {
            u: int(r.hget(f"{settings.redis.prefix}:{user_tag('demo', u)}:meta", "tall") or 0)
            for u in users
        }
    finally:
        r.close()


def _archived(settings: Settings, users: list[str]) -> dict[str, int]:
    async def read() -> dict[str, int]:
        store = open_longterm(settings.qdrant, settings.data_dir)
        try:
            return {u: await store.count_turns("demo", u) for u in users}
        finally:
            await store.close()

    return asyncio.run(read())


def _memories(settings: Settings, users: list[str]) -> list[tuple[str, str, str]]:
    async def read() -> list[tuple[str, str, str]]:
        store = open_longterm(settings.qdrant, settings.data_dir)
        try:
            found = []
            for user in users:
                memories, _ = await store.list_user("demo", user, limit=1000)
                found += [(user, m.key, m.memory_id) for m in memories]
            return found
        finally:
            await store.close()

    return asyncio.run(read())


def test_replay_twice_across_restart(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = with_free_port(settings_factory())
    events = [
        InteractionEvent.model_validate_json(line)
        for line in SAMPLE_STREAM.read_text().splitlines()
        if line.strip()
    ]
    expected = Counter(e.user_id for e in events)
    users = sorted(expected)

    def replay_and_settle() -> None:
        process = MemstreamProcess(settings, tmp_path / "memstream.log").start()
        try:
            asyncio.run(
                replay_file(
                    SAMPLE_STREAM,
                    settings.kafka.broker,
                    settings.kafka.topic("events"),
                    progress=False,
                )
            )
            wait_for(
                lambda: _turn_counts(settings, users) == dict(expected), 120, "every turn memorized"
            )
            # let consolidation of the last triggers, and the archive, finish before stopping
            wait_for(lambda: _idle(process), 60, "consolidation to go idle")
            wait_for(lambda: _archive_ok(process) >= len(events), 60, "every turn archived")
        finally:
            assert process.stop() == 0

    replay_and_settle()
    first = _memories(settings, users)
    assert first, "the sample stream must consolidate at least one memory"
    replay_and_settle()  # the same events again, into a restarted process
    second = _memories(settings, users)

    assert _turn_counts(settings, users) == dict(expected)
    assert _archived(settings, users) == dict(expected)  # every turn archived once
    assert sorted(second) == sorted(first)
    keys = Counter((user, key) for user, key, _ in second)
    assert max(keys.values()) == 1, "one memory per key"


def _archive_ok(process: MemstreamProcess) -> float:
    with process.client() as http:
        return Samples(http.get("/metrics").text).get(
            "memstream_events_total", stage="archive", outcome="ok"
        )


def _idle(process: MemstreamProcess) -> bool:
    """True when every emitted trigger has been consolidated (read from /metrics)."""
    with process.client() as http:
        scraped = Samples(http.get("/metrics").text)
    return unsettled_work(scraped.get) <= 0
