"""Forgetting is undone only by a replay the operator asks for (``--restore-forgotten``).

A forgotten user's tombstone makes every replay skip their earlier events, and the replay
says so; ``memstream replay FILE --restore-forgotten`` lifts it and the user comes back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from memstream.cli import cli
from memstream.ops.top import scrape
from memstream.settings import Settings
from memstream.wiring import open_state
from tests.integration.process import MemstreamProcess, settings_env, wait_for, with_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

USER = "u-restore"
QUERY = {"user_id": USER, "query": "where is my kayak delivery K-5512"}


def write_events(path: Path) -> Path:
    at = datetime.now(UTC) - timedelta(hours=1)  # before the forget below
    texts = ["My kayak delivery K-5512 never arrived.", "Kayak K-5512 is still not here."]
    with path.open("w") as out:
        for i, text in enumerate(texts):
            event = {
                "event_id": f"restore-{i}",
                "tenant_id": "demo",
                "user_id": USER,
                "session_id": "s1",
                "role": "user",
                "text": text,
                "ts": (at + timedelta(minutes=i)).isoformat(),
            }
            out.write(json.dumps(event) + "\n")
    return path


def forgotten(settings: Settings) -> float | None:
    async def read() -> float | None:
        state = open_state(
            settings.redis, settings.redis.url, cluster_cache_users=settings.cluster.cache_users
        )
        try:
            return await state.forgotten_at("demo", USER)
        finally:
            await state.close()

    return asyncio.run(read())


def test_replay_restores_a_forgotten_user_only_when_asked(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    process = MemstreamProcess(with_free_port(settings_factory()), tmp_path / "up.log").start()
    env: dict[str, str | None] = {**settings_env(process.settings), "MEMSTREAM_API_KEY": None}

    def run(*args: str) -> Result:
        result = CliRunner().invoke(cli, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result

    events = write_events(tmp_path / "events.jsonl")
    try:
        with process.client() as http:

            def answers() -> bool:
                return bool(http.post("/v1/retrieve", json=QUERY).json()["items"])

            run("replay", str(events))
            wait_for(answers, 60, "the replayed turns")
            run("forget", USER, "--url", process.url)
            assert not answers()

            def control_done() -> bool:  # the control processor re-stamps the tombstone
                count = registry_counts_of(f"{process.url}/metrics")
                return count("memstream_events_total", stage="control", outcome="ok") >= 1

            wait_for(control_done, 30, "the forget command to be processed")

            kept = run("replay", str(events))
            assert f"demo:{USER} was forgotten: the replay skips its earlier events" in kept.stdout
            assert forgotten(process.settings) is not None

            restored = run("replay", str(events), "--restore-forgotten")
            assert f"restored forgotten 1 user before the replay: demo:{USER}" in restored.stdout
            assert forgotten(process.settings) is None
            wait_for(answers, 60, "the restored user's turns")
    finally:
        process.stop()


def registry_counts_of(url: str) -> Callable[..., float]:
    found = scrape(url)

    def count(name: str, **labels: str) -> float:
        return sum(
            value
            for key, value in found.series(name).items()
            if all(dict(key).get(k) == v for k, v in labels.items())
        )

    return count
