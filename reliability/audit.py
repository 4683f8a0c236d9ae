"""What a run left behind, read from the stores themselves, against what it should have left.

- short-term memory: every valid event's turn under its user, once (timeline members);
- triggers: every distinct trigger id ever emitted (read back from ``memstream.triggers``,
  and from the ``etrig:`` record memorize keeps of each event's triggers, which outlives a
  broker that forgot its log) carries its ``trig:`` marker, written by the consolidator
  once the memory is stored;
- long-term memory: exactly the memory ids ``uuid5(tenant:user:key)`` of those triggers'
  keys, each once (read from the Edge shard once its owner process has stopped).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from memstream.settings import QdrantSettings
from memstream.stores.longterm import memory_point_id
from memstream.stores.redis_state import user_tag
from memstream.wiring import open_longterm
from reliability.cluster import Deployment, read_topic

User = tuple[str, str]


def by_user(events: Iterable[dict[str, Any]]) -> dict[User, set[str]]:
    users: dict[User, set[str]] = defaultdict(set)
    for e in events:
        users[(e["tenant_id"], e["user_id"])].add(e["event_id"])
    return dict(users)


@dataclass
class Snapshot:
    # Timeline and leaving members per user; after ``with_archive``, the archived turns too.
    turns: dict[User, list[str]] = field(default_factory=dict)
    written: int = 0  # distinct turns memorize wrote (hot or gone on to the archive)
    triggers: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> t, u, key
    trigger_messages: int = 0
    triggers_done: set[str] = field(default_factory=set)
    memories: list[str] = field(default_factory=list)  # point ids, as stored (None: not read)

    @property
    def turn_ids(self) -> set[str]:
        return {i for ids in self.turns.values() for i in ids}

    @property
    def expected_memories(self) -> set[str]:
        return {memory_point_id(*owner) for owner in self.triggers.values()}


async def read_turns(deployment: Deployment, users: Iterable[User]) -> dict[User, list[str]]:
    redis = deployment.redis_client()
    try:
        pipe = redis.pipeline(transaction=False)
        users = list(users)
        for t, u in users:
            pipe.zrange(f"{deployment.prefix}:{user_tag(t, u)}:timeline", 0, -1)
            # Left the hot tier, kept until the archive worker has them: stored, and
            # retrievable (the audit may stop the archive's owner before it caught up).
            pipe.zrange(f"{deployment.prefix}:{user_tag(t, u)}:leaving", 0, -1)
        found = await pipe.execute()
        return {
            user: list(dict.fromkeys(m.decode() for m in (*hot, *leaving)))
            for user, hot, leaving in zip(users, found[::2], found[1::2], strict=True)
        }
    finally:
        await redis.aclose()


async def count_written(deployment: Deployment, users: Iterable[User]) -> int:
    """Distinct turns memorize wrote for ``users``: the hot tier keeps only the recent ones
    (event-time TTL, per-user cap), so the timeline alone undercounts a long stream."""
    redis = deployment.redis_client()
    try:
        pipe = redis.pipeline(transaction=False)
        for t, u in users:
            pipe.hget(f"{deployment.prefix}:{user_tag(t, u)}:meta", "tall")
        return sum(int(v or 0) for v in await pipe.execute())
    finally:
        await redis.aclose()


async def with_archive(snap: Snapshot, data_dir: Path, users: Iterable[User]) -> Snapshot:
    """``snap`` with every user's archived turns added to its timeline members, read from
    the Edge shard under ``data_dir`` (its owner stopped)."""
    store = open_longterm(QdrantSettings(), data_dir)
    try:
        for user in users:
            seen = dict.fromkeys(snap.turns.get(user, []))
            offset: str | None = None
            while True:
                page, offset = await store.list_turns(*user, 256, offset)
                seen.update(dict.fromkeys(a.turn.event_id for a in page))
                if offset is None:
                    break
            snap.turns[user] = list(seen)
    finally:
        await store.close()
    return snap


async def read_triggers(deployment: Deployment, snap: Snapshot) -> None:
    assert deployment.broker is not None
    records = await read_topic(deployment.broker.url, deployment.topic("triggers"))
    snap.trigger_messages = len(records)
    for _key, value in records:
        doc = json.loads(value)
        snap.triggers[doc["trigger_id"]] = (doc["tenant_id"], doc["user_id"], doc["key"])
    redis = deployment.redis_client()
    try:
        # Every event's triggers as memorize recorded them before sending (stores/redis_state,
        # remember_event_triggers): what a broker restart erased from the topic is still here.
        async for key in redis.scan_iter(match=f"{deployment.prefix}:*:etrig:*", count=1000):
            for payload in (await redis.hgetall(key)).values():
                doc = json.loads(payload)
                snap.triggers[doc["trigger_id"]] = (doc["tenant_id"], doc["user_id"], doc["key"])
        ids = list(snap.triggers)
        pipe = redis.pipeline(transaction=False)
        for trigger_id in ids:
            t, u, _ = snap.triggers[trigger_id]
            pipe.exists(f"{deployment.prefix}:{user_tag(t, u)}:trig:{trigger_id}")
        done = await pipe.execute() if ids else []
        snap.triggers_done = {i for i, d in zip(ids, done, strict=True) if d}
    finally:
        await redis.aclose()


async def snapshot(deployment: Deployment, users: Iterable[User]) -> Snapshot:
    users = list(users)
    snap = Snapshot(
        turns=await read_turns(deployment, users), written=await count_written(deployment, users)
    )
    await read_triggers(deployment, snap)
    return snap


async def wait_settled(
    deployment: Deployment, expected: dict[User, set[str]], timeout_s: float
) -> Snapshot:
    """Poll until every expected turn is stored and every emitted trigger is consolidated,
    unchanged over two polls; returns the last snapshot (settled or not: the audit says)."""
    want = sum(len(ids) for ids in expected.values())
    deadline = time.monotonic() + timeout_s
    last: tuple[int, int, int] | None = None
    snap = Snapshot()
    while time.monotonic() < deadline:
        try:
            snap = await snapshot(deployment, expected)
        except (RedisError, OSError):  # a store is being restarted: ask again
            await asyncio.sleep(2.0)
            continue
        state = (max(snap.written, len(snap.turn_ids)), len(snap.triggers), len(snap.triggers_done))
        if state == last and state[0] >= want and state[1] == state[2]:
            return snap
        last = state
        await asyncio.sleep(2.0)
    return snap


async def read_memories(data_dir: Path, users: Iterable[User]) -> list[str]:
    """Point ids of every user's memories in the Edge shard under ``data_dir`` (owner stopped)."""
    store = open_longterm(QdrantSettings(), data_dir)
    ids: list[str] = []
    try:
        for t, u in users:
            offset: str | None = None
            while True:
                page, offset = await store.list_user(t, u, 256, offset)
                ids.extend(m.memory_id for m in page)
                if offset is None:
                    break
    finally:
        await store.close()
    return ids


@dataclass(frozen=True)
class Verdict:
    lost: int
    duplicated: int
    detail: str


def judge(snap: Snapshot, expected: dict[User, set[str]], *, memories: bool = True) -> Verdict:
    """Lost and duplicated, over turns, triggers and memories together; detail says which."""
    turns_lost = sum(len(ids - set(snap.turns.get(user, []))) for user, ids in expected.items())
    turns_dup = sum(
        len(members) - len(set(members) & expected[user]) for user, members in snap.turns.items()
    )
    triggers_lost = len(set(snap.triggers) - snap.triggers_done)
    want = snap.expected_memories
    memories_lost = len(want - set(snap.memories)) if memories else 0
    memories_dup = (len(snap.memories) - len(set(snap.memories) & want)) if memories else 0
    detail = (
        f"turns {len(snap.turn_ids)} stored (lost {turns_lost}, extra {turns_dup}); "
        f"triggers {len(snap.triggers)} distinct in {snap.trigger_messages} messages, "
        f"{len(snap.triggers_done)} consolidated"
    )
    if memories:
        detail += (
            f"; memories {len(snap.memories)} stored for {len(want)} keys "
            f"(missing {memories_lost}, extra {memories_dup})"
        )
    return Verdict(turns_lost + triggers_lost + memories_lost, turns_dup + memories_dup, detail)
