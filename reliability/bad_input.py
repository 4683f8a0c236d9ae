"""Bad input, to the topic and to the RPC: dead-lettered with a reason, or a 4xx with a message.

Topic: every bad message goes to ``memstream.dlq`` (matched back by its original bytes)
and a good event sent after all of them on the same key — the same partition — is still
memorized: the bad ones block nothing. RPC: every bad request gets a 4xx whose JSON body
says why; a 5xx, a 2xx or a body without a message is an error.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from memstream.schemas.identity import user_key
from memstream.streaming.broker import EventPublisher
from memstream.streaming.stage import MAX_ORIGINAL_CHARS, cut
from reliability.audit import read_turns
from reliability.cluster import Deployment, read_topic
from reliability.core import Context, Row
from reliability.shared import KEY_OF, client, service

NAME = "bad_input"
USER = "bad-input-user"
INJECTIONS = {
    "sql": "u1'; DROP TABLE users;--",
    "hash tag": "a}{b",
    "glob": "*",
    "path traversal": "../../etc/passwd",
    "newline": "a\nb",
    "null byte": "a\x00b",
    "overlong": "a" * 129,
    "empty": "",
}
# What a user id may not hold (schemas.common.normal_user_id). Quotes, braces, '*' and ':'
# are valid in a user id (e-mail addresses, names): the isolation family stores such ids.
BAD_USER_IDS = {
    "path traversal": "../../etc/passwd",
    "newline": "a\nb",
    "null byte": "a\x00b",
    "overlong": "a" * 129,
    "leading space": " a",
    "zero-width space": "a\u200bb",
    "dot-dot": "..",
}
DEFAULT_KEY = user_key("acme", USER)
# A valid body under a key that is not its user's: dead-lettered, never memorized.
MISKEYED: dict[str, str | None] = {
    "keyed for another user": user_key("acme", "someone-else"),
    "keyed for another tenant": user_key("globex", USER),
    "no key": None,
    "malformed key": f"acme:{USER}:extra",
}


def good_event(**over: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": f"good-{time.time_ns()}",
        "tenant_id": "acme",
        "user_id": USER,
        "session_id": "s-bad-input",
        "role": "user",
        "text": "My order A-55555 arrived broken, I want a replacement.",
        "ts": (datetime.now(UTC) - timedelta(minutes=5)).isoformat(),
    }
    event.update(over)
    return event


def _without(field: str) -> dict[str, Any]:
    event = good_event()
    del event[field]
    return event


def topic_cases() -> dict[str, bytes]:
    """Name -> the raw message value. Every value differs, so a dead letter names its case."""
    j = lambda **over: json.dumps(good_event(**over)).encode()  # noqa: E731
    cases: dict[str, bytes] = {
        "not JSON": b"this is not json at all",
        "truncated JSON": b'{"event_id": "trunc", "tenant_id": "acme", "user_',
        "empty message": b"",
        "JSON array": b'[1, 2, 3, "bad-array"]',
        "JSON null": b"null",
        "JSON string": b'"a lonely string"',
        "JSON number": b"424242",
        "missing event_id": json.dumps(_without("event_id")).encode(),
        "missing text": json.dumps(_without("text")).encode(),
        "missing tenant_id": json.dumps(_without("tenant_id")).encode(),
        "missing ts": json.dumps(_without("ts")).encode(),
        "text is a number": j(text=12345),
        "text is an object": j(text={"nested": "object"}),
        "unknown role": j(role="wizard"),
        "role is a number": j(role=1),
        "empty text": j(text=""),
        "whitespace text": j(text="   \n\t  "),
        "oversized text": j(text="x" * 8001),
        "control characters": j(text="hello\x00\x07world"),
        "invalid UTF-8": j(event_id="utf8").replace(b"My order", b"My \xff\xfe order"),
        "far-future timestamp": j(ts="2999-01-01T00:00:00+00:00"),
        "ancient timestamp": j(ts="1970-01-01T00:00:00+00:00"),
        "timestamp without zone": j(ts="2025-01-01T00:00:00"),
        "timestamp gibberish": j(ts="yesterday-ish"),
        "huge metadata (10k tags)": j(metadata={"tags": [f"t{i}" for i in range(10_000)]}),
        "unknown metadata field": j(metadata={"secret": "x" * 50_000}),
        "unknown top-level field": j(admin=True),
        "importance out of range": j(metadata={"importance": 7}),
        "importance is a string": j(metadata={"importance": "very"}),
        "importance NaN": j(event_id="nan").replace(
            b'"role"', b'"metadata": {"importance": NaN}, "role"'
        ),
        "nested event": json.dumps({"event": good_event()}).encode(),
        "oversized message (600 KB)": j(text="y" * 600_000),
        "duplicate key, last one bad": j(event_id="dupkey").replace(
            b'"role": "user"', b'"role": "user", "role": 7'
        ),
    }
    for name, bad in BAD_USER_IDS.items():
        cases[f"{name} in user_id"] = j(user_id=bad, event_id=f"inj-u-{len(cases)}")
    for name, bad in INJECTIONS.items():
        cases[f"{name} in event_id"] = j(event_id=bad + f"-{len(cases)}" if bad else bad)
    for name in MISKEYED:
        cases[name] = j(event_id=f"miskeyed-{len(cases)}")
    return cases


async def _send_topic(deployment: Deployment, cases: dict[str, bytes], good: bytes) -> None:
    assert deployment.broker is not None
    publisher = EventPublisher(deployment.broker.url)
    await publisher.start()
    try:
        # One partition: the good event queues behind every bad one (mis-keyed ones aside).
        await publisher.publish_many(
            deployment.topic("events"),
            [(MISKEYED.get(name, DEFAULT_KEY), v) for name, v in cases.items()]
            + [(DEFAULT_KEY, good)],
        )
    finally:
        await publisher.close()


async def run_topic(deployment: Deployment) -> Row:
    cases = topic_cases()
    good = good_event()
    await _send_topic(deployment, cases, json.dumps(good).encode())
    assert deployment.broker is not None
    # A dead letter keeps the original as the DLQ writer cuts it (with its cut marker).
    expected = {
        cut(v.decode("utf-8", "replace"), MAX_ORIGINAL_CHARS): name for name, v in cases.items()
    }
    letters: dict[str, list[str]] = {name: [] for name in cases}
    deadline = time.monotonic() + 90
    stored = False
    slipped: list[str] = []
    while time.monotonic() < deadline:
        letters = {name: [] for name in cases}
        for _key, value in await read_topic(deployment.broker.url, deployment.topic("dlq")):
            letter = json.loads(value)
            name = expected.get(letter["original"])
            if name is not None and letter["topic"] == deployment.topic("events"):
                letters[name].append(letter["reason"])
        turns = await read_turns(deployment, [("acme", USER)])
        stored = good["event_id"] in turns[("acme", USER)]
        # A mis-keyed record's body is this user's: it must never reach their turns.
        slipped = sorted(e for e in turns[("acme", USER)] if e.startswith("miskeyed-"))
        if stored and all(letters.values()):
            break
        await asyncio.sleep(1.0)
    lost = [n for n, found in letters.items() if not found]
    duplicated = sum(max(0, len(found) - 1) for found in letters.values())
    no_reason = [n for n, found in letters.items() if found and not all(r.strip() for r in found)]
    errors = len(no_reason) + (0 if stored else 1) + len(slipped)
    sample = {
        n: letters[n][0][:80]
        for n in ("invalid UTF-8", "far-future timestamp", *MISKEYED)
        if letters[n]
    }
    note = (
        f"{len(cases)} kinds sent to memstream.events on one key, then a good event: "
        f"{len(cases) - len(lost)} dead-lettered with a reason, good event "
        f"{'memorized' if stored else 'NOT memorized (blocked)'}."
        + (f" Not dead-lettered: {', '.join(lost)}." if lost else "")
        + f" {len(MISKEYED)} mis-keyed (valid body, key not its user's): "
        + (f"memorized anyway: {', '.join(slipped)}." if slipped else "none memorized.")
        + f" Sample reasons: {sample}."
    )
    return Row(
        f"bad input → topic ({len(cases)} kinds, {len(MISKEYED)} of them mis-keyed)",
        len(cases) + 1,
        lost=len(lost),
        duplicated=duplicated,
        errors=errors,
        note=note,
    )


Case = tuple[
    str, str, str, dict[str, str] | None, bytes | None
]  # name, method, path, headers, body


def rpc_cases() -> list[Case]:
    key = {"Authorization": f"Bearer {KEY_OF['acme']}", "Content-Type": "application/json"}
    ok_retrieve = {"user_id": "u1", "query": "where is my order?"}
    ok_event = {"user_id": "u1", "session_id": "s1", "role": "user", "text": "hello there"}
    R, E = "/v1/retrieve", "/v1/events"

    def retrieve(**over: Any) -> bytes:
        return json.dumps({**ok_retrieve, **over}).encode()

    def events(*items: dict[str, Any]) -> bytes:
        return json.dumps({"events": list(items)}).encode()

    def event(**over: Any) -> dict[str, Any]:
        return {**ok_event, **over}

    cases: list[Case] = [
        ("retrieve: malformed JSON", "POST", R, key, b'{"user_id": "u1", "query": '),
        ("retrieve: empty body", "POST", R, key, b""),
        ("retrieve: JSON array", "POST", R, key, b"[1, 2]"),
        ("retrieve: missing user_id", "POST", R, key, json.dumps({"query": "q"}).encode()),
        ("retrieve: missing query", "POST", R, key, json.dumps({"user_id": "u1"}).encode()),
        ("retrieve: query is a number", "POST", R, key, retrieve(query=5)),
        ("retrieve: empty query", "POST", R, key, retrieve(query="")),
        ("retrieve: whitespace query", "POST", R, key, retrieve(query="  \n ")),
        ("retrieve: oversized query", "POST", R, key, retrieve(query="q" * 8001)),
        ("retrieve: control characters", "POST", R, key, retrieve(query="a\x00b\x1b[31m")),
        ("retrieve: invalid UTF-8", "POST", R, key, retrieve().replace(b"where", b"wh\xff\xfere")),
        ("retrieve: negative budget", "POST", R, key, retrieve(budget_tokens=-1)),
        ("retrieve: huge budget", "POST", R, key, retrieve(budget_tokens=10**12)),
        ("retrieve: top_k 0", "POST", R, key, retrieve(top_k=0)),
        ("retrieve: top_k a string", "POST", R, key, retrieve(top_k="many")),
        ("retrieve: unknown field", "POST", R, key, retrieve(tenant_id="globex")),
        ("retrieve: body over the limit (1.2 MB)", "POST", R, key, retrieve(query="z" * 1_200_000)),
        ("retrieve: no API key", "POST", R, {"Content-Type": "application/json"}, retrieve()),
        (
            "retrieve: unknown tenant key",
            "POST",
            R,
            {**key, "Authorization": "Bearer nope"},
            retrieve(),
        ),
        ("retrieve: Basic auth", "POST", R, {**key, "Authorization": "Basic dTpw"}, retrieve()),
        ("retrieve: empty bearer", "POST", R, {**key, "Authorization": "Bearer"}, retrieve()),
        ("retrieve: text/plain body", "POST", R, {**key, "Content-Type": "text/plain"}, b"where?"),
        ("events: empty batch", "POST", E, key, events()),
        ("events: oversized batch (501)", "POST", E, key, events(*[event()] * 501)),
        ("events: not a list", "POST", E, key, json.dumps({"events": "all of them"}).encode()),
        ("events: unknown role", "POST", E, key, events(event(role="wizard"))),
        ("events: far-future ts", "POST", E, key, events(event(ts="2999-01-01T00:00:00Z"))),
        ("events: ancient ts", "POST", E, key, events(event(ts="1970-01-01T00:00:00Z"))),
        ("events: ts without zone", "POST", E, key, events(event(ts="2025-01-01T00:00:00"))),
        ("events: huge metadata", "POST", E, key, events(event(metadata={"tags": ["t"] * 5000}))),
        ("events: tenant in body", "POST", E, key, events(event(tenant_id="globex"))),
        ("events: empty text", "POST", E, key, events(event(text=""))),
        ("events: oversized text", "POST", E, key, events(event(text="x" * 8001))),
        (
            "events: missing session",
            "POST",
            E,
            key,
            events({"user_id": "u1", "role": "user", "text": "hi"}),
        ),
        ("events: no API key", "POST", E, {"Content-Type": "application/json"}, events(event())),
        ("wrong method on retrieve", "GET", R, key, None),
        ("unknown path", "GET", "/v1/nothing-here", key, None),
    ]
    for name, bad in BAD_USER_IDS.items():
        cases.append((f"retrieve: {name} in user_id", "POST", R, key, retrieve(user_id=bad)))
    for name, bad in INJECTIONS.items():
        if bad:  # the empty id is its own case above (missing / empty fields)
            cases.append(
                (f"events: {name} in event_id", "POST", E, key, events(event(event_id=bad)))
            )
    quoted = "..%2F..%2Fetc%2Fpasswd"
    cases += [
        ("memories: traversal in user path", "GET", f"/v1/users/{quoted}/memories", key, None),
        ("forget: user with a zero-width space", "DELETE", "/v1/users/a%E2%80%8Bb", key, None),
        ("memory: id not a UUID", "GET", "/v1/memories/not-a-uuid", key, None),
    ]
    return cases


def run_rpc(deployment: Deployment) -> Row:
    cases = rpc_cases()
    failures: list[str] = []
    server_errors = 0
    latencies: list[float] = []
    with client(deployment, tenant=None) as http:
        for name, method, path, headers, body in cases:
            started = time.perf_counter()
            try:
                answer = http.request(method, path, headers=headers, content=body)
            except httpx.HTTPError as exc:
                failures.append(f"{name}: {exc!r}")
                server_errors += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)
            status = answer.status_code
            message = _detail(answer)
            if status >= 500:
                server_errors += 1
                failures.append(f"{name}: {status}")
            elif not 400 <= status < 500 or not message:
                failures.append(f"{name}: {status} {'no message' if not message else ''}".strip())
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    note = (
        f"{len(cases)} kinds of bad request; every one must get a 4xx with a message; "
        f"{server_errors} server errors."
    )
    if failures:
        note += " Wrong answers: " + "; ".join(failures[:12])
    return Row(
        f"bad input → RPC ({len(cases)} kinds)",
        len(cases),
        lost=None,
        duplicated=None,
        errors=len(failures),
        p99_ms=p99,
        promised=("errors",),
        note=note,
    )


def _detail(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return ""
    return str(body.get("detail", "")) if isinstance(body, dict) else ""


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    return [await run_topic(deployment), await asyncio.to_thread(run_rpc, deployment)]
