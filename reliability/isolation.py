"""Isolation: no retrieval, listing or lookup ever shows one user's memory to another user or
tenant (a property test over random tenants, users and queries); forget leaves no residue;
one tenant cannot tell from its own timings which questions another asked.

The population: three tenants (each with its own API key) holding the SAME user ids, every
user talking about their own secret order number often enough to be consolidated. The ids
hold what once made two users one in the stores (the ':' separator, its percent-encoding,
braces, case, other scripts and their NFC forms). Event ids name their owner, so any item
(turn id, memory source events) not prefixed with the caller's is a leak, and so is
another user's secret in the context.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream.schemas.identity import user_key
from memstream.stores.redis_state import user_tag
from reliability.audit import User, by_user, wait_settled
from reliability.cluster import Deployment
from reliability.core import Context, Row
from reliability.shared import API_KEYS, client, service

NAME = "isolation"
TENANTS = sorted(API_KEYS.values())
USER_IDS = (
    "iso-u0",
    "iso:u0",  # "acme:iso:u0" was also ("acme:iso", "u0")
    "iso%3Au0",  # the separator's own percent-encoding
    "ISO-U0",  # case: another customer
    "iso-{u0}*",  # a hash tag's braces and a glob
    "iso-zoë",  # NFC
    "iso-名前",
    "iso-u0@example.com",
)
PHRASES = (
    "Where is my order {code}? It still has not arrived.",
    "Order {code} is late again, any news on {code}?",
    "Please refund order {code}, the parcel was damaged.",
    "I called about {code} last week, what is the status of {code}?",
)


def secret(tenant: str, user: str) -> str:
    return f"Q-{zlib.crc32(user_key(tenant, user).encode()) % 90000 + 10000}"


def owner_prefix(tenant: str, user: str) -> str:
    """What every event id of the user starts with (event ids are ASCII: the user's index)."""
    return f"iso-{tenant}-{USER_IDS.index(user) if user in USER_IDS else 'x'}-"


def path(user: str) -> str:
    return quote(user, safe="")


def population(turns: int, seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(days=2)
    events = []
    for tenant in TENANTS:
        for u, user in enumerate(USER_IDS):
            code = secret(tenant, user)
            for n in range(turns):
                events.append(
                    {
                        "event_id": f"{owner_prefix(tenant, user)}{n}",
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
    mine = owner_prefix(tenant, user)
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
    user_ids = [*USER_IDS, "iso-nobody"]
    other_memories: dict[User, list[str]] = {}
    try:
        for t, u in users:
            page = clients[t].get(f"/v1/users/{path(u)}/memories", params={"limit": 100}).json()
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
        listed = await redis.sismember(f"{deployment.prefix}:users", user_key(tenant, user))
        return len(keys) + int(bool(listed))
    finally:
        await redis.aclose()


async def forget_check(deployment: Deployment, users: list[User]) -> tuple[int, list[str]]:
    """Forget a user whose id holds the separator in the first tenant; it must vanish there,
    and survive in the other tenants and as the ids it once shared its keys with."""
    tenant, user = TENANTS[0], "iso:u0"
    notes: list[str] = []
    with client(deployment, tenant) as http:
        answer = http.delete(f"/v1/users/{path(user)}")
        if answer.status_code != 200:
            return 1, [f"DELETE /v1/users/{user} answered {answer.status_code}"]
        await asyncio.sleep(3)  # the control event reaches the processors
        left = await residue(deployment, tenant, user)
        memories = http.get(f"/v1/users/{path(user)}/memories").json().get("memories", [])
        items = http.post("/v1/retrieve", json={"user_id": user, "query": "my order"}).json()
    problems = left + len(memories) + len(items.get("items", []))
    notes.append(
        f"forget {tenant}/{user}: {answer.json()}; afterwards {left} Redis keys, "
        f"{len(memories)} memories, {len(items.get('items', []))} retrieved items"
    )
    kin = (user, "iso%3Au0", "iso-u0")  # the ids its keys once met
    survivors = [(t, u) for t, u in users if (u == user) != (t == tenant) and u in kin]
    for t, u in survivors:
        with client(deployment, t) as http:
            kept = http.get(f"/v1/users/{path(u)}/memories").json().get("memories", [])
        if await residue(deployment, t, u) == 0 and not kept:
            problems += 1
            notes.append(f"forgetting {tenant}/{user} also erased {t}/{u}")
    return problems, notes


def timing_probe(deployment: Deployment, questions: int, seed: int = 11) -> tuple[int, str]:
    """Tenant B times its own first retrieval of questions tenant A did and did not ask.

    A cache shared by tenants answers A's questions from memory (a shared query-vector
    cache made them about 10x faster), so B could read A's questions off its clock. The
    promise: A's questions are not markedly faster for B (median under half the others')."""
    rng = random.Random(seed)
    words = ["refund", "parcel", "invoice", "warranty", "address", "courier", "voucher"]
    texts = [
        f"probe {i}: what happened to my {rng.choice(words)} {rng.randrange(10**6)}?"
        for i in range(2 * questions)
    ]
    rng.shuffle(texts)
    asked, unasked = set(texts[:questions]), texts[questions:]
    a, b = TENANTS[0], TENANTS[1]
    with client(deployment, a) as http_a:
        for text in asked:
            http_a.post("/v1/retrieve", json={"user_id": "iso-u0", "query": text})
    timed: dict[str, float] = {}
    order = [*asked, *unasked]
    rng.shuffle(order)
    with client(deployment, b) as http_b:
        http_b.post("/v1/retrieve", json={"user_id": "iso-u0", "query": "warm up"})
        for text in order:  # each once: B's own second ask would be B's own cache
            started = time.perf_counter()
            http_b.post("/v1/retrieve", json={"user_id": "iso-u0", "query": text})
            timed[text] = (time.perf_counter() - started) * 1000
    ms_asked = statistics.median(timed[t] for t in asked)
    ms_other = statistics.median(timed[t] for t in unasked)
    threshold = statistics.median(timed.values())
    right = sum((timed[t] < threshold) == (t in asked) for t in order)
    leak = ms_asked < 0.5 * ms_other
    note = (
        f"timing probe: {b} timed its first retrieval of {questions} questions {a} had asked "
        f"and {questions} it had not: medians {ms_asked:.1f} vs {ms_other:.1f} ms; a "
        f"median-split guess is right for {right} of {len(order)} (chance: half)"
        + (" — A's questions are markedly faster: a side channel" if leak else "")
    )
    return int(leak), note


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    events = population(turns=8 if ctx.quick else 12)
    await asyncio.to_thread(_post_events, deployment, events)
    expected = by_user(events)
    snap = await wait_settled(deployment, expected, 180 if ctx.quick else 300)
    users = sorted(expected)
    secrets = {user: secret(*user) for user in users}
    calls, leaks, latencies = await asyncio.to_thread(
        property_check, deployment, users, secrets, 25 if ctx.quick else 150
    )
    residue_count, forget_notes = await forget_check(deployment, users)
    probe_errors, probe_note = await asyncio.to_thread(
        timing_probe, deployment, 10 if ctx.quick else 20
    )
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
            "isolation: ids with separators, Unicode, case; random tenants/users/queries; forget",
            len(events),
            lost=None,
            duplicated=None,
            errors=len(leaks) + residue_count,
            p99_ms=p99,
            promised=("errors",),
            note=note,
        ),
        Row(
            "isolation: cross-tenant cache timing probe",
            20 if ctx.quick else 40,
            lost=None,
            duplicated=None,
            errors=probe_errors,
            promised=("errors",),
            note=probe_note + ".",
        ),
    ]
