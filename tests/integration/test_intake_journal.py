"""The intake journal against the real broker and Valkey: a 202 survives a SIGKILL.

The RPC runs alone (``--roles serve``, ``rpc.journal=on``) with no stream processor, so
nothing it accepts is memorized. It is SIGKILLed; a fresh topic prefix stands for the
memory-only embedded broker dying with every record it held. A new RPC on the same data
folder re-publishes the journaled events, a processor memorizes them: every accepted event
is memorized exactly once, and the journal is pruned once they are.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from memstream.launch import Process, on_free_port, wait_for, with_overrides
from memstream.roles import Role
from memstream.settings import DEMO_API_KEY, Settings
from memstream.wiring import open_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

USERS = [f"ij-u{i}" for i in range(4)]
SERVE: frozenset[Role] = frozenset({"serve"})
PROCESS: frozenset[Role] = frozenset({"process"})


def stored(settings: Settings) -> tuple[dict[str, list[str]], int]:
    """Each user's timeline, and the distinct turns ever written (all users)."""

    async def read() -> tuple[dict[str, list[str]], int]:
        state = open_state(
            settings.redis, settings.redis.url, cluster_cache_users=settings.cluster.cache_users
        )
        try:
            turns = {u: await state.timeline_ids("demo", u) for u in USERS}
            written = sum([await state.turns_written("demo", u) for u in USERS])
            return turns, written
        finally:
            await state.close()

    return asyncio.run(read())


def test_events_accepted_before_a_sigkill_are_memorized_once_after_the_restart(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_factory(
        rpc={
            "journal": "on",
            "journal_segment_age_s": 0.3,
            "journal_settle_s": 0.5,
            "journal_prune_interval_s": 0.2,
        }
    )
    serve_dir = {"data_dir": tmp_path / "serve"}
    first = Process(on_free_port(with_overrides(settings, serve_dir), SERVE), SERVE).start()
    expected: dict[str, set[str]] = defaultdict(set)
    try:
        with httpx.Client(
            base_url=first.url, headers={"Authorization": f"Bearer {DEMO_API_KEY}"}, timeout=10
        ) as http:
            for round_ in range(10):
                events = [
                    {
                        "event_id": uuid.uuid4().hex,
                        "user_id": USERS[(round_ + i) % len(USERS)],
                        "session_id": "ij-s1",
                        "role": "user",
                        "text": f"my order C-{round_}{i} never came, round {round_}",
                    }
                    for i in range(5)
                ]
                answer = http.post("/v1/events", json={"events": events})
                assert answer.status_code == 202, answer.text
                for e in events:
                    expected[e["user_id"]].add(e["event_id"])
            assert first.metrics().get("memstream_rpc_journal_bytes") > 0
    finally:
        first.kill()  # SIGKILL: no drain, no flush
    accepted = sum(len(ids) for ids in expected.values())
    assert accepted == 50
    assert list((tmp_path / "serve" / "intake").glob("*.jsonl"))

    # The broker's records are gone: the same Redis, a topic prefix no one wrote to.
    fresh = with_overrides(settings, {"kafka": {"topic_prefix": f"t{uuid.uuid4().hex[:8]}"}})
    worker_settings = on_free_port(with_overrides(fresh, {"data_dir": tmp_path / "w"}), PROCESS)
    worker = Process(worker_settings, PROCESS).start()  # declares the topics
    second = Process(on_free_port(with_overrides(fresh, serve_dir), SERVE), SERVE)
    try:
        second.start()
        assert second.metrics().get("memstream_rpc_journal_recovered_total") == accepted

        def memorized() -> bool:
            return sum(len(ids) for ids in stored(settings)[0].values()) >= accepted

        wait_for(memorized, 120, "every journaled event to be memorized")
        wait_for(
            lambda: second.metrics().get("memstream_rpc_journal_segments") == 0,
            30,
            "the journal to be pruned once its events are memorized",
        )
        assert not list((tmp_path / "serve" / "intake").glob("*.jsonl"))
        turns, written = stored(settings)
        for user in USERS:
            assert len(turns[user]) == len(set(turns[user])), f"{user}: a turn stored twice"
            assert set(turns[user]) == expected[user], f"{user}: lost or unexpected turns"
        assert written == accepted
    finally:
        second.stop()
        worker.stop()
