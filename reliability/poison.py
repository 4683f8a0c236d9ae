"""Poison: a valid message whose handling keeps failing is dead-lettered after a bounded
number of tries, and the events behind it on the same partition are still handled.

The poison is an encoded event (it passes validation) carrying a 3-dimensional embedding
for a user whose clusters hold 384-dimensional centroids: memorize fails on it every time.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from memstream.streaming.broker import EventPublisher
from reliability.audit import read_turns
from reliability.cluster import Deployment, read_topic
from reliability.core import Context, Row
from reliability.shared import service

NAME = "poison"
USER = "poison-user"


def _event(n: int) -> dict[str, Any]:
    return {
        "event_id": f"poison-test-{n}-{time.time_ns()}",
        "tenant_id": "acme",
        "user_id": USER,
        "session_id": "s-poison",
        "role": "user",
        "text": f"Order A-{70000 + n} was charged twice, please refund one of the charges.",
        "ts": (datetime.now(UTC) - timedelta(minutes=10 - n)).isoformat(),
    }


async def _stored(deployment: Deployment, event_id: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if event_id in (await read_turns(deployment, [("acme", USER)]))[("acme", USER)]:
            return True
        await asyncio.sleep(0.5)
    return False


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    assert deployment.broker is not None
    key = f"acme:{USER}"
    first, poison_event, after = _event(1), _event(2), _event(3)
    publisher = EventPublisher(deployment.broker.url)
    await publisher.start()
    try:
        await publisher.publish(deployment.topic("events"), key, json.dumps(first).encode())
        first_ok = await _stored(deployment, first["event_id"], 90)
        poison = {"event": poison_event, "embedding": [0.6, 0.8, 0.0], "model_id": "poison"}
        started = time.monotonic()
        await publisher.publish(deployment.topic("encoded"), key, json.dumps(poison).encode())
        await publisher.publish(deployment.topic("events"), key, json.dumps(after).encode())
        after_ok = await _stored(deployment, after["event_id"], 90)
        waited = time.monotonic() - started
    finally:
        await publisher.close()
    letters = [
        json.loads(v)
        for _k, v in await read_topic(deployment.broker.url, deployment.topic("dlq"))
        if poison_event["event_id"].encode() in v
    ]
    poisoned = [letter for letter in letters if letter["stage"] == "memorize"]
    stored_poison = (
        poison_event["event_id"] in (await read_turns(deployment, [("acme", USER)]))[("acme", USER)]
    )
    lost = int(not first_ok) + int(not after_ok) + int(not poisoned)
    reason = poisoned[0]["reason"][:120] if poisoned else "none"
    note = (
        f"poison on memstream.encoded between two good events of the same user: "
        f"dead-lettered {len(poisoned)}x by memorize (reason: {reason}); the event behind it "
        f"{'was' if after_ok else 'was NOT'} memorized {waited:.1f} s after the poison was sent"
        " (3 tries with backoff, streaming/stage.py)."
    )
    return [
        Row(
            "poison message → DLQ, partition goes on",
            3,
            lost=lost,
            duplicated=max(0, len(poisoned) - 1),
            errors=int(stored_poison),
            note=note,
        )
    ]
