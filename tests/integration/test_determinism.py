"""Deterministic by construction (issue 14): one log, replayed under three batch / partition /
process settings, each on its own stack (topics, consumer groups, Redis prefix, Qdrant Edge
folder), leaves the same stores item by item — turns (hot and archived), clusters, the
triggers emitted and consolidated, and every memory field — and the same LLM call count.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memstream.launch import Process, on_free_port, wait_for
from memstream.ops.demo import SAMPLE_STREAM
from memstream.ops.replay import CountFn, handled_events, replay_file, unsettled_work
from memstream.roles import ALL_ROLES, ROLE_SETS
from memstream.schemas import StoredTurn
from memstream.settings import Settings
from memstream.stores.redis_client import sync_redis
from memstream.stores.redis_state import RedisState, user_tag
from memstream.wiring import open_longterm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

Snapshot = dict[str, Any]  # part -> user -> what that user has of it


@dataclass(frozen=True)
class Setting:
    name: str
    sections: dict[str, Any]
    apart: bool  # the processors and the consolidator as two processes


# One partition with batches of one, four with batches of 32, two with the processors and
# the consolidator in separate processes (default batches).
SETTINGS = (
    Setting(
        "p1-batch1",
        {
            "kafka": {"partitions": 1},
            "encoder": {"batch_size": 1},
            "consolidation": {"batch_size": 1},
        },
        apart=False,
    ),
    Setting(
        "p4-batch32",
        {
            "kafka": {"partitions": 4},
            "encoder": {"batch_size": 32},
            "consolidation": {"batch_size": 32},
        },
        apart=False,
    ),
    Setting("p2-apart", {"kafka": {"partitions": 2}}, apart=True),
)


@contextmanager
def stack(settings: Settings, where: Path, apart: bool) -> Iterator[tuple[list[Process], Path]]:
    """The processes of one setting and the data folder that holds the memories. Qdrant Edge
    belongs to one process: apart, the consolidator's folder holds the memories (and the
    archive, which the consolidate role writes)."""
    if apart:
        plan = [
            (ROLE_SETS["worker"], settings.model_copy(update={"data_dir": where / "worker"})),
            (
                ROLE_SETS["consolidator"],
                settings.model_copy(update={"data_dir": where / "consolidator"}),
            ),
        ]
        data_dir = where / "consolidator"
    else:
        plan = [(ALL_ROLES, settings)]
        data_dir = settings.data_dir
    with ExitStack() as stop:
        procs: list[Process] = []
        for roles, own in plan:
            proc = Process(on_free_port(own, roles), roles, log_path=where / f"{len(procs)}.log")
            stop.callback(_stopped, proc)
            procs.append(proc.spawn())
        for proc in procs:
            proc.ready(120, "/readyz")
        yield procs, data_dir


def _stopped(proc: Process) -> None:
    assert proc.stop() == 0, proc.output()[-3000:]


def counts(procs: list[Process]) -> CountFn:
    """The processes' counters, summed over them."""
    samples = [p.metrics() for p in procs]
    return lambda name, **labels: sum(s.get(name, **labels) for s in samples)


def settle(procs: list[Process], events: int, timeout_s: float = 150.0) -> None:
    """Every event handled, every trigger consolidated, every turn archived, quiet for 1.5 s."""
    seen: list[tuple[float, float]] = []

    def settled() -> bool:
        count = counts(procs)
        seen.append((handled_events(count), unsettled_work(count)))
        last = seen[-4:]
        return len(last) == 4 and len(set(last)) == 1 and last[-1][0] >= events and last[-1][1] <= 0

    wait_for(settled, timeout_s, f"the replay to settle at {events} events", 0.5)


def snapshot(settings: Settings, data_dir: Path, llm_calls: float) -> Snapshot:
    """Per part, per user: what the run stored, in a form that compares item by item."""

    async def read() -> Snapshot:
        state = RedisState.from_url(settings.redis.url, prefix=settings.redis.prefix)
        store = open_longterm(settings.qdrant, data_dir)
        found: Snapshot = {"turns": {}, "clusters": {}, "triggers": {}, "memories": {}}
        try:
            for tenant, user in await state.users():
                tenant_user = f"{tenant}:{user}"
                hot = await state.turns(tenant, user, await state.timeline_ids(tenant, user))
                archived, _ = await store.list_turns(tenant, user, limit=100_000)
                found["turns"][tenant_user] = {
                    "hot": sorted(_turn(t.turn) for t in hot),
                    "archived": sorted(_turn(a.turn) for a in archived),
                }
                found["clusters"][tenant_user] = sorted(
                    (c.cluster_id, tuple(sorted(c.member_ids)), c.archived, c.description)
                    for c in await state.clusters(tenant, user)
                )
                memories, _ = await store.list_user(tenant, user, limit=100_000)
                found["memories"][tenant_user] = {
                    m.memory_id: m.model_dump(mode="json") for m in memories
                }
                found["triggers"][tenant_user] = _triggers(settings, tenant, user)
        finally:
            await state.close()
            await store.close()
        found["llm calls"] = llm_calls
        return found

    return asyncio.run(read())


def _turn(turn: StoredTurn) -> tuple[str, str, str, str | None]:
    return (turn.event_id, turn.text, turn.ts.isoformat(), turn.cluster_id)


def _triggers(settings: Settings, tenant: str, user: str) -> dict[str, list[str]]:
    """Trigger ids each event emitted (``etrig:``) and those consolidated (``trig:``)."""
    base = _escape(f"{settings.redis.prefix}:{user_tag(tenant, user)}")
    with sync_redis(settings.redis.url) as r:
        emitted: set[str] = set()
        for key in r.scan_iter(match=f"{base}:etrig:*", count=1000):
            emitted |= {k.decode() for k in r.hkeys(key)}
        done = {k.decode().rsplit(":", 1)[1] for k in r.scan_iter(match=f"{base}:trig:*")}
    return {"emitted": sorted(emitted), "consolidated": sorted(done)}


def _escape(pattern: str) -> str:
    for ch in "[]?*":
        pattern = pattern.replace(ch, "\\" + ch)
    return pattern


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Readable differences between two snapshots, leaf by leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}/{key}"
            if key not in b:
                yield f"{where}: only in the first: {_short(a[key])}"
            elif key not in a:
                yield f"{where}: only in the second: {_short(b[key])}"
            else:
                yield from differences(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list) and a != b:
        only_a = [x for x in a if x not in b]
        only_b = [x for x in b if x not in a]
        if not only_a and not only_b:
            yield f"{path}: same items, other order"
        yield from (f"{path}: only in the first: {_short(x)}" for x in only_a[:3])
        yield from (f"{path}: only in the second: {_short(x)}" for x in only_b[:3])
    elif a != b:
        yield f"{path}: {_short(a)} != {_short(b)}"


def _short(value: Any, limit: int = 240) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def replay_under(
    settings: tuple[Setting, ...],
    log: Path,
    settings_factory: Callable[..., Settings],
    tmp_path: Path,
) -> list[tuple[str, Snapshot]]:
    """``log`` replayed once per setting, each on its own stack, then read back."""
    events = sum(1 for line in log.read_text().splitlines() if line.strip())
    done = []
    for setting in settings:
        where = tmp_path / setting.name
        # Retrieval boosts off: nothing retrieves here (a boost would be the RPC's).
        base = settings_factory(
            data_dir=where / "data",
            metrics_interval_s=0.5,
            maintenance={"strength_boost": 1.0},
            **setting.sections,
        )
        with stack(base, where, setting.apart) as (procs, data_dir):
            asyncio.run(
                replay_file(log, base.kafka.broker, base.kafka.topic("events"), progress=False)
            )
            settle(procs, events)
            calls = counts(procs)("memstream_llm_calls_total")
        done.append((setting.name, snapshot(base, data_dir, calls)))
    return done


def assert_same(runs: list[tuple[str, Snapshot]], tmp_path: Path) -> None:
    """Every run equals the first, part by part; else the first differences of each pair
    (every one of them in ``differences.txt``)."""
    (first, expected), report, full = runs[0], [], tmp_path / "differences.txt"
    for name, got in runs[1:]:
        found = list(differences(expected, got))
        if found:
            parts = sorted({line.split("/")[1].split(":")[0] for line in found})
            report.append(f"{first} vs {name}: {len(found)} differences in {parts}")
            report += [f"  {line}" for line in found[:12]]
            with full.open("a") as out:
                out.write("\n".join([f"{first} vs {name}", *found, ""]))
    assert not report, "\n".join([*report, f"every difference: {full}"])


def test_same_log_same_stores_whatever_the_batches_partitions_and_processes(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    runs = replay_under(SETTINGS, SAMPLE_STREAM, settings_factory, tmp_path)
    first = runs[0][1]
    assert sum(len(m) for m in first["memories"].values()) >= 5, "too few memories to compare"
    assert sum(len(t["consolidated"]) for t in first["triggers"].values()) >= 5
    assert first["llm calls"] > 0
    assert_same(runs, tmp_path)


CANNED = "Could you please check the warranty status on my account for me"


def canned_log(path: Path, users: int = 8, times: int = 6) -> Path:
    """Users who each say one sentence ``times`` times (a recurrence), the first half of
    them a day before the rest. Whether a sentence counts for nothing because others said
    it too once depended on tenant-wide counts read in processing order; it must depend on
    nothing but each user's own log."""
    t0 = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
    lines = []
    for u in range(users):
        for k in range(times):
            ts = t0 + timedelta(days=u // (users // 2), minutes=10 * u + k)
            event = {
                "event_id": f"canned-u{u}-{k}",
                "tenant_id": "demo",
                "user_id": f"canned-{u}",
                "session_id": f"canned-u{u}",
                "role": "user",
                "text": CANNED,
                "ts": ts.isoformat().replace("+00:00", "Z"),
            }
            lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tenant_phrase_counts_do_not_depend_on_the_partitioning(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    log = canned_log(tmp_path / "canned.jsonl")
    runs = replay_under(SETTINGS[:2], log, settings_factory, tmp_path)
    assert sum(len(t["emitted"]) for t in runs[0][1]["triggers"].values()) > 0
    assert_same(runs, tmp_path)
