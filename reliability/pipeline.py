"""One run of the whole pipeline over a generated stream, with faults injected mid-stream.

The stream is ``bench.generate`` (customer-service sessions whose issues recur, so triggers
and consolidations happen). Faults fire when a share of the stream's turns is stored
(reliability/progress.py), each recorded with the turn counts it began and ended at; then
the run waits for the pipeline to settle, stops the memory process (so its Edge shard can
be read) and audits what is stored against what was sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from bench.generate import generate_events, write_jsonl
from memstream.ops.replay import replay_file
from reliability.audit import (
    Snapshot,
    User,
    Verdict,
    by_user,
    count_written,
    judge,
    read_memories,
    wait_settled,
    with_archive,
)
from reliability.cluster import Deployment
from reliability.progress import Fault, Span, fire


def stream_file(root: Path, n: int, seed: int = 11) -> tuple[Path, list[dict[str, Any]]]:
    events = generate_events(n, seed=seed)
    return write_jsonl(events, root / f"events-{n}-{seed}.jsonl"), events


async def stored_turns(deployment: Deployment, users: list[User]) -> int:
    try:
        return await count_written(deployment, users)
    except (RedisError, OSError):  # Valkey is being restarted by a fault: ask again later
        return -1


@dataclass
class Outcome:
    snap: Snapshot
    verdict: Verdict
    settled: bool
    seconds: float
    log: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)


def faults_label(spans: list[Span]) -> str:
    """The faults of a row as they ran, for its label: ``A at 25%...; B from 50% to 60%...``."""
    return "; ".join(span.label for span in spans)


async def replay(deployment: Deployment, path: Path) -> int:
    assert deployment.broker is not None
    return await replay_file(
        path, deployment.broker.url, deployment.topic("events"), progress=False
    )


async def run_pipeline(
    deployment: Deployment,
    path: Path,
    events: list[dict[str, Any]],
    faults: list[Fault],
    *,
    settle_timeout_s: float,
    poll_s: float = 0.5,
) -> Outcome:
    """Start ``stream`` + ``memory``, replay, fire ``faults`` at their shares of the turns
    stored, settle, audit."""
    started = time.monotonic()
    expected = by_user(events)
    users = list(expected)
    deployment.start_services()
    deployment.start("stream")
    deployment.start("memory")
    await replay(deployment, path)
    spans = await fire(
        faults,
        deployment,
        len(events),
        lambda: stored_turns(deployment, users),
        deadline=started + settle_timeout_s,
        poll_s=poll_s,
    )
    log = [f"{span.what} [{span.counts}]: {', then '.join(span.lines)}" for span in spans]
    remaining = max(30.0, settle_timeout_s - (time.monotonic() - started))
    snap = await wait_settled(deployment, expected, remaining)
    deployment["memory"].stop()
    snap = await with_archive(snap, deployment.root / "memory", users)
    settled = len(snap.turn_ids) >= len(events) and len(snap.triggers) == len(snap.triggers_done)
    snap.memories = await read_memories(deployment.root / "memory", users)
    verdict = judge(snap, expected)
    return Outcome(snap, verdict, settled, time.monotonic() - started, log, spans)
