"""A running ``memstream up``: JSON logs with event ids, ``memstream top``, SIGTERM drains."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memstream.settings import Settings
from memstream.streaming.broker import EventPublisher
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

STOP_BOUND_S = 20.0


def json_lines(path: Path) -> list[dict]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))  # every JSON-looking line must parse
    return found


def test_logs_top_and_sigterm(settings_factory: Callable[..., Settings], tmp_path: Path) -> None:
    process = MemstreamProcess(
        with_free_port(settings_factory(metrics_interval_s=0.5, log_level="info")),
        tmp_path / "up.log",
    ).start()
    try:
        settings = process.settings
        with process.client() as http:
            event = {"user_id": "u1", "session_id": "s1", "role": "user", "text": "hello there"}
            assert http.post("/v1/events", json={"events": [event]}).status_code == 202

        async def publish_invalid() -> None:
            publisher = EventPublisher(settings.kafka.broker)
            await publisher.start()
            try:
                bad = json.dumps({"event_id": "bad-event-1", "text": 5}).encode()
                await publisher.publish_many(settings.kafka.topic("events"), [("t:u1", bad)])
            finally:
                await publisher.close()

        asyncio.run(publish_invalid())

        def dead_letter_logged() -> dict | None:
            for entry in json_lines(process.log_path):
                if entry.get("msg") == "dead-lettered":
                    return entry
            return None

        entry = wait_for(dead_letter_logged, 30, "a JSON log line for the dead letter")
        assert entry["event_id"] == "bad-event-1"
        assert entry["stage"] == "encode"
        assert entry["level"] == "warning"
        assert {"ts", "logger"} <= set(entry)

        top = subprocess.run(
            [
                sys.executable,
                "-m",
                "memstream",
                "top",
                "--url",
                f"{process.url}/metrics",
                "--frames",
                "2",
                "--interval",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert top.returncode == 0, top.stderr
        assert "memstream top" in top.stdout
        assert "encode" in top.stdout
        assert "consumer lag" in top.stdout
    finally:
        assert process.proc is not None
        started = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        try:
            code = process.proc.wait(STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            process.proc.kill()
            process.proc.wait()
            pytest.fail(f"memstream up did not stop within {STOP_BOUND_S}s of SIGTERM")
    assert code == 0, process.log_path.read_text()[-3000:]
    assert time.monotonic() - started < STOP_BOUND_S
