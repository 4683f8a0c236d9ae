"""Isolation: no retrieval, listing or lookup ever shows one user's memory to another user or
tenant (a property test over random tenants, users and queries); forget leaves no residue.

The population: three tenants (each with its own API key) holding the SAME user ids, every
user talking about their own secret order number often enough to be consolidated. Event ids
name their owner, so any item (turn id, memory source events) not prefixed with the
caller's ``tenant-user`` is a leak, and so is another user's secret in the context.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability.audit import User, by_user, wait_settled
from reliability.cluster import Deployment
from reliability.core import Context, Row
from reliability.shared import API_KEYS, client, service
from stores.redis_state import user_tag

NAME = "isolation"
TENANTS = sorted(API_KEYS.values())
PHRASES = (
    "Where is my order {code}? It still has not arrived.",
    "Order {code} is late again, any news on {code}?",
    "Please refund order {code}, the parcel was damaged.",
    "I called about {code} last week, what is the status of {code}?",
)


def secret(tenant: str, user: str) -> str:
    return f"Q-{zlib.crc32(f'{tenant}:{user}'.encode()) % 90000 + 10000}"


def population(users_per_tenant: int, turns: int, seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(days=2)
    events = []
    for tenant in TENANTS:
        for u in range(users_per_tenant):
            user = f"iso-u{u}"
            code = secret(tenant, user)
            for n in range(turns):
                events.append(
                    {
                        "event_id": f"iso-{tenant}-{user}-{n}",
                        "tenant_id": tenant,
                        "user_id": user,
                        "session_id": f"iso-s{n // 4}",
                        "role": "user",
                        "text": rng.choice(PHRASES).format(code=code),
                        "ts": (start + timedelta(minutes=10 * n + u)).isoformat(),
                    }
                )
    return events


def _post_events(deployment: Deployment, events: list[dict[str, Any]]) -> None:
    for tenant in TENANTS:
        mine = [
            {k: v for k, v in e.items() if k != "tenant_id"}
            for e in events
            if e["tenant_id"] == tenant
        ]
        with client(deployment, tenant) as http:
            http.post("/v1/events", json={"events": mine}).raise_for_status()


def _leaks_in(
    answer: dict[str, Any], tenant: str, user: str, secrets: dict[User, str]
) -> list[str]:
    mine = f"iso-{tenant}-{user}-"
    leaks = []
    for item in answer.get("items", []):
        owners = [item["id"]] if item["kind"] == "turn" else []
        owners += item.get("source_event_ids", [])
        leaks += [f"{tenant}/{user} got {o}" for o in owners if not o.startswith(mine)]
    for (t, u), code in secrets.items():
        if (t, u) != (tenant, user) and code in answer.get("context", ""):
            leaks.append(f"{tenant}/{user} saw the secret of {t}/{u}")
    return leaks


def property_check(
    deployment: Deployment, users: list[User], secrets: dict[User, str], examples: int
) -> tuple[int, list[str], list[float]]:
    """Random (tenant, user, query): retrieve, list and look up; returns calls, leaks, ms."""
    leaks: list[str] = []
    latencies: list[float] = []
    calls = 0
    clients = {t: client(deployment, t) for t in TENANTS}
    user_ids = [*sorted({u for _, u in users}), "iso-nobody"]
    other_memories: dict[User, list[str]] = {}
    try:
        for t, u in users:
            page = clients[t].get(f"/v1/users/{u}/memories", params={"limit": 100}).json()
            other_memories[(t, u)] = [m["memory_id"] for m in page.get("memories", [])]
            for m in page.get("memories", []):
                if (m["tenant_id"], m["user_id"]) != (t, u):
                    leaks.append(f"listing {t}/{u} returned {m['tenant_id']}/{m['user_id']}")

        codes = sorted(secrets.values())

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            tenant=st.sampled_from(TENANTS),
            user=st.sampled_from(user_ids),
            query=st.one_of(
                st.sampled_from(codes).map(lambda c: f"what about order {c}?"),
                st.text(min_size=1, max_size=60).filter(lambda s: s.strip() and s.isprintable()),
            ),
            victim=st.sampled_from(users),
        )
        def check(tenant: str, user: str, query: str, victim: User) -> None:
            nonlocal calls
            http = clients[tenant]
            started = time.perf_counter()
            answer = http.post("/v1/retrieve", json={"user_id": user, "query": query})
            latencies.append((time.perf_counter() - started) * 1000)
            calls += 1
            if answer.status_code != 200:
                leaks.append(f"retrieve {tenant}/{user} answered {answer.status_code}")
                return
            leaks.extend(_leaks_in(answer.json(), tenant, user, secrets))
            # Someone else's memory id, asked for as this user: must not be found.
            if victim != (tenant, user):
                for memory_id in other_memories.get(victim, [])[:1]:
                    calls += 1
                    found = http.get(f"/v1/memories/{memory_id}", params={"user_id": user})
                    if found.status_code != 404:
                        leaks.append(
                            f"{tenant}/{user} looked up {victim}'s memory: {found.status_code}"
                        )

        check()
    finally:
        for http in clients.values():
            http.close()
    return calls, leaks, latencies


async def residue(deployment: Deployment, tenant: str, user: str) -> int:
    redis = deployment.redis_client()
    try:
        pattern = f"{deployment.prefix}:{user_tag(tenant, user)}:*".replace("{", "\\{").replace(
            "}", "\\}"
        )
        keys = [k async for k in redis.scan_iter(match=pattern, count=1000)]
        listed = await redis.sismember(f"{deployment.prefix}:users", f"{tenant}:{user}")
        return len(keys) + int(bool(listed))
    finally:
        await redis.aclose()


async def forget_check(deployment: Deployment, users: list[User]) -> tuple[int, list[str]]:
    """Forget one user id in the first tenant; it must vanish there and survive elsewhere."""
    tenant, user = users[0]
    notes: list[str] = []
    with client(deployment, tenant) as http:
        answer = http.delete(f"/v1/users/{user}")
        if answer.status_code != 200:
            return 1, [f"DELETE /v1/users/{user} answered {answer.status_code}"]
        await asyncio.sleep(3)  # the control event reaches the processors
        left = await residue(deployment, tenant, user)
        memories = http.get(f"/v1/users/{user}/memories").json().get("memories", [])
        items = http.post("/v1/retrieve", json={"user_id": user, "query": "my order"}).json()
    problems = left + len(memories) + len(items.get("items", []))
    notes.append(
        f"forget {tenant}/{user}: {answer.json()}; afterwards {left} Redis keys, "
        f"{len(memories)} memories, {len(items.get('items', []))} retrieved items"
    )
    survivors = [(t, u) for t, u in users if u == user and t != tenant]
    for t, u in survivors:
        with client(deployment, t) as http:
            kept = http.get(f"/v1/users/{u}/memories").json().get("memories", [])
        if await residue(deployment, t, u) == 0 and not kept:
            problems += 1
            notes.append(f"forgetting {tenant}/{user} also erased {t}/{u}")
    return problems, notes


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    events = population(users_per_tenant=3 if ctx.quick else 5, turns=8 if ctx.quick else 12)
    await asyncio.to_thread(_post_events, deployment, events)
    expected = by_user(events)
    snap = await wait_settled(deployment, expected, 180 if ctx.quick else 300)
    users = sorted(expected)
    secrets = {user: secret(*user) for user in users}
    calls, leaks, latencies = await asyncio.to_thread(
        property_check, deployment, users, secrets, 25 if ctx.quick else 150
    )
    residue_count, forget_notes = await forget_check(deployment, users)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    note = (
        f"{len(TENANTS)} tenants x {len(users) // len(TENANTS)} users (same user ids in every "
        f"tenant), {len(events)} events, {len(snap.triggers)} triggers consolidated into "
        f"memories; {calls} random retrievals/lookups. "
        + ("Leaks: " + "; ".join(leaks[:5]) + ". " if leaks else "")
        + "; ".join(forget_notes)
    )
    return [
        Row(
            "isolation: random tenants/users/queries; forget",
            len(events),
            lost=None,
            duplicated=None,
            errors=len(leaks) + residue_count,
            p99_ms=p99,
            promised=("errors",),
            note=note,
        )
    ]
