"""Publishing a JSONL file of events to memstream.events, and waiting for the pipeline to settle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from rich.progress import Progress

from memstream.metrics import Metrics
from rpc.publisher import EventPublisher


def message_key(line: bytes) -> str:
    """``tenant:user`` when the line says so; anything else still goes out (to reach the DLQ)."""
    try:
        doc = json.loads(line)
        return f"{doc['tenant_id']}:{doc['user_id']}"
    except (ValueError, KeyError, TypeError):
        return "unparseable"


async def replay_file(
    path: Path, broker_url: str, topic: str, *, progress: bool = True, batch: int = 200
) -> int:
    """Publish every non-empty line of ``path`` as it is; returns how many were sent."""
    lines = [
        line for line in (await asyncio.to_thread(path.read_bytes)).splitlines() if line.strip()
    ]
    publisher = EventPublisher(broker_url)
    await publisher.start()
    try:
        with Progress(disable=not progress, transient=False) as bar:
            task = bar.add_task(f"replaying {path.name}", total=len(lines))
            for start in range(0, len(lines), batch):
                chunk = lines[start : start + batch]
                await publisher.publish_many(topic, [(message_key(line), line) for line in chunk])
                bar.advance(task, len(chunk))
    finally:
        await publisher.close()
    return len(lines)


def _total(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def wait_until_settled(
    metrics: Metrics, expected_events: int, *, timeout_s: float = 120.0, quiet_s: float = 1.5
) -> bool:
    """True once every event was memorized (or dead-lettered) and every trigger consolidated.

    Reads the process's own counters, so it works only where all roles share one process.
    """
    deadline = time.monotonic() + timeout_s
    last_change = time.monotonic()
    last: tuple[float, ...] = ()
    while time.monotonic() < deadline:
        handled = sum(
            _total(metrics, "memstream_events_total", stage=stage, outcome=outcome)
            for stage, outcome in (
                ("memorize", "ok"),
                ("memorize", "duplicate"),
                ("memorize", "dlq"),
                ("encode", "dlq"),
            )
        )
        triggers = sum(
            _total(metrics, "memstream_triggers_total", reason=r)
            for r in ("semantic", "cluster", "entity", "pin")
        )
        consolidated = _total(metrics, "memstream_events_total", stage="consolidate", outcome="ok")
        consolidated += _total(
            metrics, "memstream_events_total", stage="consolidate", outcome="dlq"
        )
        now_state = (handled, triggers, consolidated)
        if now_state != last:
            last, last_change = now_state, time.monotonic()
        if (
            handled >= expected_events
            and consolidated >= triggers
            and (time.monotonic() - last_change >= quiet_s)
        ):
            return True
        await asyncio.sleep(0.2)
    return False
