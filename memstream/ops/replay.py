"""Publishing a JSONL file of events to memstream.events, and waiting for the pipeline to settle."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from rich.progress import Progress

from memstream.metrics import Metrics
from memstream.schemas.identity import parse_user_key, user_key
from memstream.stores.redis_state import RedisState
from memstream.streaming.broker import EventPublisher


def message_key(line: bytes) -> str:
    """The record key (``schemas.identity.user_key``) when the line names a user; anything
    else still goes out (to reach the DLQ)."""
    try:
        doc = json.loads(line)
        return user_key(doc["tenant_id"], doc["user_id"])
    except (ValueError, KeyError, TypeError, UnicodeError):
        return "unparseable"


def file_users(path: Path) -> list[tuple[str, str]]:
    """Every (tenant, user) a JSONL file of events speaks for, in first-seen order."""
    seen: dict[tuple[str, str], None] = {}
    for line in path.read_bytes().splitlines():
        try:
            seen.setdefault(parse_user_key(message_key(line)), None)
        except ValueError:
            continue  # no user: the line goes out to be dead-lettered
    return list(seen)


async def forgotten_users(
    state: RedisState, users: list[tuple[str, str]], *, restore: bool = False
) -> list[str]:
    """The users among ``users`` with a forget tombstone (``tenant:user``).

    A replay cannot bring them back: memorize drops their events stamped before the forget.
    With ``restore`` the tombstones are lifted first, so this replay does (what an operator
    asks for with ``--restore-forgotten``; every generation shares the tombstones).
    """
    found = []
    for tenant, user in users:
        if await state.forgotten_at(tenant, user) is not None:
            found.append(user_key(tenant, user))
            if restore:
                await state.clear_forgotten(tenant, user)
    return found


def forgotten_hint(users: list[str], restored: bool) -> str:
    names = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
    if restored:
        return f"restored forgotten {_plural(len(users), 'user')} before the replay: {names}"
    return (
        f"{names} {'was' if len(users) == 1 else 'were'} forgotten: the replay skips "
        f"{'its' if len(users) == 1 else 'their'} earlier events — add --restore-forgotten "
        "to bring them back, or `make clean` to start over"
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


async def replay_file(
    path: Path, broker_url: str, topic: str, *, progress: bool = True, batch: int = 200
) -> int:
    """Publish every non-empty line of ``path`` as it is; returns how many were sent."""
    lines = [
        line for line in (await asyncio.to_thread(path.read_bytes)).splitlines() if line.strip()
    ]
    publisher = EventPublisher(broker_url)
    try:
        await publisher.start()
        with Progress(disable=not progress, transient=False) as bar:
            task = bar.add_task(f"replaying {path.name}", total=len(lines))
            for start in range(0, len(lines), batch):
                chunk = lines[start : start + batch]
                await publisher.publish_many(topic, [(message_key(line), line) for line in chunk])
                bar.advance(task, len(chunk))
    finally:
        await publisher.close()
    return len(lines)


# A source of counter totals: (metric name, **labels) -> sum of the samples that match.
# The process's own registry and a scraped /metrics page both provide one.
CountFn = Callable[..., float]


def registry_counts(registry: CollectorRegistry) -> CountFn:
    def count(name: str, **labels: str) -> float:
        return sum(
            sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    return count


def handled_events(count: CountFn) -> float:
    """Events that left the processors: memorized (new or duplicate) or dead-lettered."""
    return count("memstream_events_total", stage="memorize") + count(
        "memstream_events_total", stage="encode", outcome="dlq"
    )


def unsettled_work(count: CountFn) -> float:
    """The consolidate role's backlog: triggers emitted and not yet consolidated (or
    dead-lettered), plus encoded turns the archive has not written yet (a state read
    before the archive caught up would miss turns that already left the hot tier)."""
    triggers = count("memstream_triggers_total") - count(
        "memstream_events_total", stage="consolidate"
    )
    unarchived = count("memstream_events_total", stage="encode", outcome="ok") - count(
        "memstream_events_total", stage="archive"
    )
    return triggers + max(unarchived, 0.0)


async def wait_until_settled(
    metrics: Metrics, expected_events: int, *, timeout_s: float = 120.0, quiet_s: float = 1.5
) -> bool:
    """True once every event was memorized (or dead-lettered) and every trigger consolidated.

    Reads the process's own counters, so it works only where all roles share one process.
    """
    count = registry_counts(metrics.registry)
    deadline = time.monotonic() + timeout_s
    last_change = time.monotonic()
    last: tuple[float, ...] = ()
    while time.monotonic() < deadline:
        now_state = (handled_events(count), unsettled_work(count))
        if now_state != last:
            last, last_change = now_state, time.monotonic()
        handled, unsettled = now_state
        if (
            handled >= expected_events
            and unsettled <= 0
            and (time.monotonic() - last_change >= quiet_s)
        ):
            return True
        await asyncio.sleep(0.2)
    return False
