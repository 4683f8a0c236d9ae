"""Adversarial input: one tenant's worst-case texts, at the size limits, must not slow another.

Three runs of the same load from tenant ``globex`` — a trickle of ordinary events (10/s),
open-loop retrievals (5/s), event -> retrievable probes (a fresh user each, polled until its
turn comes back) and ``/healthz`` every 100 ms — first undisturbed, then while tenant
``acme`` posts what once froze the whole service (a backtracking regex or a quadratic loop
behind each, the service's security issue):

- texts (findings 2 and 3): "welcome to" and "this is bob from" followed by spaces to 8,000
  characters, "1" * 8,000 (``parse_due``), and 40 events of 8,000 characters of one short
  promise for one user, the same order number in each so that recurrence triggers the
  extractive consolidator's worst case;
- floods: 2,000 events of one user, each with its own ``metadata.speaker``, then retrievals
  with an 8,000-character query naming speakers; bodies just under the 1 MB limit (about 120
  events of 8,000 characters of the texts above).

Every call has a timeout and each attack run a time cap, so the rows end whatever the
service does. Promised for the texts: globex's retrieval p99 under attack within max(2x,
+50 ms) of its undisturbed p99, its event -> retrievable p95 within max(2x, +200 ms) (the
floors absorb the noise of a 2-core machine the client shares), every ``/healthz`` answer
within 1 s. For the floods those are reported, not promised: a flood is volume, not a costly
text, and its events queue ahead of globex's in the partitions they share; what bounds it is
a per-tenant quota (not built yet). Promised in every run: no 5xx, every globex call
answered within 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from memstream.schemas.common import MAX_TEXT_CHARS
from memstream.schemas.rpc import MAX_BATCH_EVENTS
from reliability.core import Context, Row
from reliability.shared import KEY_OF, service

NAME = "adversarial"
VICTIM, ATTACKER = "globex", "acme"
CALL_TIMEOUT_S = 10.0  # every globex call and /healthz poll; a slower answer is a failure
ATTACK_TIMEOUT_S = 60.0  # every acme call (a 1 MB body may queue behind the others)
HEALTHZ_LIMIT_MS = 1000.0
RETRIEVE_FLOOR_MS = 50.0  # retrieval p99 under attack may exceed max(2x, baseline + this)
RETRIEVABLE_FLOOR_MS = 200.0  # event -> retrievable p95: max(2x, baseline + this)
MAX_BODY_BYTES = 1_000_000  # rpc.max_body_bytes' default: the bodies stay just under it
ORDER = "A-77123"
PROMISE = f"Order {ORDER}: I'll send the invoice tomorrow. "
ORDINARY = (
    "Where is my order {code}? It still has not arrived.",
    "Please change the delivery address of order {code} to my office.",
    "I'll call you back about order {code} tomorrow morning.",
    "The kettle from order {code} leaks, can I get a replacement?",
    "Thanks, the refund for order {code} arrived.",
)
QUERIES = (
    "Where is my order?",
    "what was wrong with the kettle?",
    "did the refund arrive?",
    "which address should the parcel go to?",
)


def _fill(head: str, unit: str) -> str:
    """``head`` then ``unit`` repeated, to exactly the text limit."""
    return (head + unit * MAX_TEXT_CHARS)[:MAX_TEXT_CHARS]


WELCOME = _fill("welcome to", " ")
BOB = _fill("this is bob from", " ")
ONES = "1" * MAX_TEXT_CHARS
PROMISES = _fill("", PROMISE).rstrip()
HOSTILE = (WELCOME, BOB, ONES, PROMISES)


@dataclass(frozen=True)
class Sizes:
    baseline_s: float  # the undisturbed run
    attack_min_s: float  # the attack run lasts at least this ...
    attack_tail_s: float  # ... and this long after acme's last post ...
    attack_cap_s: float  # ... and never longer than this
    each: int  # events of each single hostile text
    promise_users: int  # users given 40 x 8,000 characters of promises
    speakers: int
    full_bodies: int  # bodies just under 1 MB


QUICK = Sizes(20, 30, 10, 60, each=4, promise_users=1, speakers=2000, full_bodies=1)
FULL = Sizes(45, 60, 20, 120, each=8, promise_users=2, speakers=2000, full_bodies=3)


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


@dataclass
class Run:
    """What globex (and /healthz) saw during one run."""

    retrieve_ms: list[float] = field(default_factory=list)
    post_ms: list[float] = field(default_factory=list)
    retrievable_ms: list[float] = field(default_factory=list)
    unretrievable: int = 0  # probes not found within CALL_TIMEOUT_S x 2
    healthz_ms: list[float] = field(default_factory=list)
    healthz_bad: int = 0  # answers over HEALTHZ_LIMIT_MS, failing or timed out
    server_errors: list[str] = field(default_factory=list)  # 5xx, any tenant
    failed: list[str] = field(default_factory=list)  # globex calls refused or unanswered
    events: int = 0  # globex events posted (probes included)
    seconds: float = 0.0

    def p99(self) -> float | None:
        return pct(self.retrieve_ms, 0.99)

    def p95_retrievable(self) -> float | None:
        return pct(self.retrievable_ms, 0.95)

    def summary(self) -> str:
        return (
            f"{len(self.retrieve_ms)} retrievals p50 {pct(self.retrieve_ms, 0.5) or 0:.0f} / "
            f"p99 {self.p99() or 0:.0f} ms, {self.events} events posted (post p99 "
            f"{pct(self.post_ms, 0.99) or 0:.0f} ms), {len(self.retrievable_ms)} probes "
            f"event -> retrievable p50 {pct(self.retrievable_ms, 0.5) or 0:.0f} / p95 "
            f"{self.p95_retrievable() or 0:.0f} / p99 {pct(self.retrievable_ms, 0.99) or 0:.0f} "
            f"ms ({self.unretrievable} never found), /healthz worst "
            f"{max(self.healthz_ms, default=0):.0f} ms over {len(self.healthz_ms)} polls, "
            f"{self.seconds:.0f} s"
        )


@dataclass
class Attack:
    """What acme sent and what came of it."""

    events: int = 0
    accepted: int = 0  # events in bodies answered 202
    answers: dict[int, int] = field(default_factory=dict)  # status -> bodies
    failed: list[str] = field(default_factory=list)  # bodies with no answer in time
    speaker_retrieve_ms: list[float] = field(default_factory=list)
    speakers_found: bool = False
    posting_s: float = 0.0


def _ordinary(n: int, user: str) -> dict[str, Any]:
    code = f"G-{40000 + n}"
    return {
        "user_id": user,
        "session_id": f"adv-s{n // 20}",
        "role": "user",
        "text": ORDINARY[n % len(ORDINARY)].format(code=code),
    }


def _timed_call(
    run: Run, what: str, *, victim: bool = True
) -> Callable[[Awaitable[httpx.Response]], Awaitable[tuple[httpx.Response | None, float]]]:
    """Awaits a request; notes 5xx and (for globex) calls refused or not answered in time."""

    async def call(request: Awaitable[httpx.Response]) -> tuple[httpx.Response | None, float]:
        started = time.perf_counter()
        try:
            answer = await request
        except httpx.HTTPError as exc:
            took = (time.perf_counter() - started) * 1000
            if victim:
                run.failed.append(f"{what}: {type(exc).__name__}")
            return None, took
        took = (time.perf_counter() - started) * 1000
        if answer.status_code >= 500:
            run.server_errors.append(f"{what} {answer.status_code}: {answer.text[:100]}")
        elif victim and answer.status_code >= 400:  # globex's calls are all valid
            run.failed.append(f"{what} {answer.status_code}: {answer.text[:100]}")
        return answer, took

    return call


async def _every(period_s: float, stop: asyncio.Event, fire: Callable[[], Awaitable[None]]) -> None:
    """Open loop: starts ``fire`` every ``period_s`` whether or not the last one answered
    (a stalled server then shows in every call it stalled, not in one), then waits for all."""
    tasks: set[asyncio.Task[None]] = set()
    next_at = time.monotonic()
    while not stop.is_set():
        task = asyncio.create_task(fire())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_at += period_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


class Victim:
    """globex's load and the /healthz poll, for one run."""

    def __init__(self, url: str, label: str) -> None:
        self.run = Run()
        self.label = label
        self.seq = 0
        auth = {"Authorization": f"Bearer {KEY_OF[VICTIM]}"}
        self.http = httpx.AsyncClient(base_url=url, headers=auth, timeout=CALL_TIMEOUT_S)
        self.probe_http = httpx.AsyncClient(base_url=url, headers=auth, timeout=CALL_TIMEOUT_S)
        self.health = httpx.AsyncClient(base_url=url, timeout=CALL_TIMEOUT_S)

    async def close(self) -> None:
        for http in (self.http, self.probe_http, self.health):
            await http.aclose()

    async def post_one(self) -> None:
        n, self.seq = self.seq, self.seq + 1
        body = {"events": [_ordinary(n, f"adv-{VICTIM}-u{n % 5}")]}
        answer, took = await _timed_call(self.run, "globex POST /v1/events")(
            self.http.post("/v1/events", json=body)
        )
        self.run.events += 1
        if answer is not None:
            self.run.post_ms.append(took)

    async def retrieve_one(self) -> None:
        n = self.seq
        body = {"user_id": f"adv-{VICTIM}-u{n % 5}", "query": QUERIES[n % len(QUERIES)]}
        _, took = await _timed_call(self.run, "globex POST /v1/retrieve")(
            self.http.post("/v1/retrieve", json=body)
        )
        self.run.retrieve_ms.append(took)  # a call with no answer counts at its timeout

    async def healthz_one(self) -> None:
        answer, took = await _timed_call(self.run, "GET /healthz", victim=False)(
            self.health.get("/healthz")
        )
        self.run.healthz_ms.append(took)
        if answer is None or answer.status_code != 200 or took > HEALTHZ_LIMIT_MS:
            self.run.healthz_bad += 1

    async def probe(self, n: int) -> float | None:
        """Posts one event for a fresh user and polls retrieve until its turn comes back:
        the milliseconds from the 202 to the first answer holding it (None: not in time)."""
        user = f"adv-{self.label}-probe-{n}-{uuid.uuid4().hex[:6]}"
        event_id = f"{user}-1"
        event = {**_ordinary(n, user), "event_id": event_id}
        call = _timed_call(self.run, "globex probe")
        answer, took = await call(self.probe_http.post("/v1/events", json={"events": [event]}))
        self.run.events += 1
        if answer is None or answer.status_code != 202:
            return None
        self.run.post_ms.append(took)
        t0 = time.perf_counter()
        query = {"user_id": user, "query": event["text"]}
        while (time.perf_counter() - t0) < 2 * CALL_TIMEOUT_S:
            found, _ = await call(self.probe_http.post("/v1/retrieve", json=query))
            if found is not None and found.status_code == 200:
                items = found.json().get("items", [])
                if any(i["id"] == event_id or event_id in i["source_event_ids"] for i in items):
                    return (time.perf_counter() - t0) * 1000
            await asyncio.sleep(0.1)
        return None

    async def probes(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            took = await self.probe(n)
            n += 1
            if took is None:
                self.run.unretrievable += 1
                self.run.retrievable_ms.append(2 * CALL_TIMEOUT_S * 1000)
            else:
                self.run.retrievable_ms.append(took)
            await asyncio.sleep(0.3)

    def load(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(_every(0.1, stop, self.post_one)),
            asyncio.create_task(_every(0.2, stop, self.retrieve_one)),
            asyncio.create_task(_every(0.1, stop, self.healthz_one)),
            asyncio.create_task(self.probes(stop)),
        ]


def _event(user: str, n: int, text: str, speaker: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event_id": f"adv-{user}-{n}-{uuid.uuid4().hex[:8]}",
        "user_id": user,
        "session_id": f"adv-s{n // 50}",
        "role": "user",
        "text": text,
    }
    if speaker is not None:
        event["metadata"] = {"speaker": speaker}
    return event


def _speaker(i: int) -> str:
    """One-word names, and every 100th of two words (the other path of the name matcher)."""
    return f"Mary Ann{i}" if i % 100 == 99 else f"speaker{i}"


@dataclass(frozen=True)
class Plan:
    """acme's requests, encoded before the clock starts (building 1 MB of JSON must not
    delay the measuring client): (what, body, events) in order; the speakers' user and
    the id of its last event."""

    requests: list[tuple[str, bytes, int]]
    speaker_user: str
    last_speaker: str


def _bodies() -> tuple[list[tuple[str, bytes, int]], Callable[[str, list[Any]], None]]:
    out: list[tuple[str, bytes, int]] = []

    def add(what: str, events: list[dict[str, Any]]) -> None:
        out.append((what, json.dumps({"events": events}).encode(), len(events)))

    return out, add


def plan_texts(sizes: Sizes) -> Plan:
    """The texts of the security report's findings 2 and 3: costly per character."""
    tag = uuid.uuid4().hex[:6]
    out, add = _bodies()
    for name, text in (("welcome-to", WELCOME), ("this-is-bob-from", BOB), ("ones", ONES)):
        user = f"adv-{tag}-{name}"
        add(f"{sizes.each} x '{name}'", [_event(user, n, text) for n in range(sizes.each)])
    for u in range(sizes.promise_users):
        user = f"adv-{tag}-promises-{u}"
        add("40 x 8,000 chars of promises", [_event(user, n, PROMISES) for n in range(40)])
    return Plan(out, "", "")


def plan_floods(sizes: Sizes) -> Plan:
    """Volume at the limits: thousands of speakers for one user, bodies just under 1 MB."""
    tag = uuid.uuid4().hex[:6]
    out, add = _bodies()
    speaker_user = f"adv-{tag}-speakers"
    speakers = [
        _event(speaker_user, i, f"Hi, {_speaker(i)} here about order B-{i}.", _speaker(i))
        for i in range(sizes.speakers)
    ]
    for at in range(0, len(speakers), MAX_BATCH_EVENTS):
        add(f"{sizes.speakers} speakers", speakers[at : at + MAX_BATCH_EVENTS])
    for b in range(sizes.full_bodies):
        events: list[dict[str, Any]] = []
        size = len(b'{"events": []}')
        while True:
            n = len(events)
            nxt = _event(f"adv-{tag}-bulk-{b}-{n % 4}", n, HOSTILE[n % len(HOSTILE)])
            grows = len(json.dumps(nxt).encode()) + 2  # the event and its ", "
            if size + grows > MAX_BODY_BYTES - 2000:
                break
            events.append(nxt)
            size += grows
        add("a body just under 1 MB", events)
    return Plan(out, speaker_user, speakers[-1]["event_id"])


def _speaker_query() -> str:
    """8,000 characters naming speakers (some of the user's, some nobody's)."""
    words = []
    i = 0
    while sum(len(w) + 1 for w in words) < MAX_TEXT_CHARS:
        words.append(_speaker(i * 7 % 2500))
        i += 1
    return ("What did " + " ".join(words))[:MAX_TEXT_CHARS].rstrip()


async def attack(url: str, sizes: Sizes, todo: Plan, victim: Run, sent: Attack) -> None:
    """acme's posts one after another, then its speaker retrievals; every call bounded."""
    auth = {"Authorization": f"Bearer {KEY_OF[ATTACKER]}"}
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=ATTACK_TIMEOUT_S) as http:
        call = _timed_call(victim, "acme POST /v1/events", victim=False)
        headers = {"Content-Type": "application/json"}
        for what, body, count in todo.requests:
            sent.events += count
            answer, _ = await call(http.post("/v1/events", content=body, headers=headers))
            if answer is None:
                sent.failed.append(what)
                continue
            sent.answers[answer.status_code] = sent.answers.get(answer.status_code, 0) + 1
            if answer.status_code == 202:
                sent.accepted += count
        sent.posting_s = time.monotonic() - began
        if not todo.speaker_user:
            return
        # The speakers' turns stored (their last one retrievable), then the long query.
        call = _timed_call(victim, "acme POST /v1/retrieve", victim=False)
        deadline = time.monotonic() + 30
        find = {"user_id": todo.speaker_user, "query": f"{_speaker(sizes.speakers - 1)} order"}
        while time.monotonic() < deadline and not sent.speakers_found:
            answer, _ = await call(http.post("/v1/retrieve", json=find, timeout=CALL_TIMEOUT_S))
            if answer is not None and answer.status_code == 200:
                items = answer.json().get("items", [])
                sent.speakers_found = any(i["id"] == todo.last_speaker for i in items)
            if not sent.speakers_found:
                await asyncio.sleep(0.5)
        query = {"user_id": todo.speaker_user, "query": _speaker_query(), "top_k": 50}
        for _ in range(3):
            answer, took = await call(http.post("/v1/retrieve", json=query))
            sent.speaker_retrieve_ms.append(took)


async def one_run(
    url: str, label: str, sizes: Sizes, hostile: tuple[Plan, Attack] | None = None
) -> Run:
    """globex's load for a run; with ``hostile``, acme's attack during it (from its first
    second; the run lasts until attack_tail_s after it, within attack_min_s and _cap_s)."""
    victim = Victim(url, label)
    stop = asyncio.Event()
    began = time.monotonic()
    tasks = victim.load(stop)
    try:
        if hostile is None:
            await asyncio.sleep(sizes.baseline_s)
        else:
            await asyncio.sleep(1.0)
            todo, sent = hostile
            sender = asyncio.create_task(attack(url, sizes, todo, victim.run, sent))
            cap = began + sizes.attack_cap_s
            try:
                await asyncio.wait_for(asyncio.shield(sender), max(1.0, cap - time.monotonic()))
            except TimeoutError:
                sender.cancel()
                sent.failed.append("the attack did not finish within the run's cap")
            until = max(began + sizes.attack_min_s, time.monotonic() + sizes.attack_tail_s)
            await asyncio.sleep(max(0.0, min(until, cap) - time.monotonic()))
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await victim.close()
    victim.run.seconds = time.monotonic() - began
    return victim.run


async def warm_up(url: str) -> None:
    """A few calls down every path first: the undisturbed run must not pay for cold caches."""
    victim = Victim(url, "warm")
    try:
        for _ in range(5):
            await victim.post_one()
            await victim.retrieve_one()
        await victim.probe(0)
    finally:
        await victim.close()


def _limit(baseline: float | None, floor_ms: float) -> float | None:
    return None if baseline is None else max(2 * baseline, baseline + floor_ms)


def _attacked_row(
    title: str,
    baseline: Run,
    attacked: Run,
    hostile: Attack,
    sent: str,
    promise_latency: bool,
) -> Row:
    """One attack's row: its errors by the rule of the module docstring (the latency
    comparisons only where ``promise_latency``; otherwise reported in the note)."""
    p99_limit = _limit(baseline.p99(), RETRIEVE_FLOOR_MS)
    p95_limit = _limit(baseline.p95_retrievable(), RETRIEVABLE_FLOOR_MS)
    slow_retrieve = p99_limit is None or (attacked.p99() or float("inf")) > p99_limit
    slow_ingest = p95_limit is None or (attacked.p95_retrievable() or float("inf")) > p95_limit
    server_errors, failed = attacked.server_errors, attacked.failed
    errors = len(server_errors) + len(failed)
    if promise_latency:
        errors += int(slow_retrieve) + int(slow_ingest) + attacked.healthz_bad
    answers = ", ".join(f"{n} answered {s}" for s, n in sorted(hostile.answers.items()))
    rule = "Errors" if promise_latency else "Reported, not promised"
    note = (
        f"Under attack: {attacked.summary()}. acme posted {hostile.events} events in "
        f"{sum(hostile.answers.values())} bodies over {hostile.posting_s:.1f} s "
        f"({answers or 'none answered'}; {hostile.accepted} accepted with 202"
        + (f"; no answer in time: {', '.join(hostile.failed)}" if hostile.failed else "")
        + f"): {sent}. {rule}: globex retrieval p99 {attacked.p99() or 0:.0f} ms > "
        f"max(2x, +{RETRIEVE_FLOOR_MS:.0f} ms) of undisturbed = {p99_limit or 0:.0f} ms: "
        f"{int(slow_retrieve)}; event -> retrievable p95 {attacked.p95_retrievable() or 0:.0f} "
        f"ms > max(2x, +{RETRIEVABLE_FLOOR_MS:.0f} ms) = {p95_limit or 0:.0f} ms: "
        f"{int(slow_ingest)}; /healthz answers > {HEALTHZ_LIMIT_MS:.0f} ms or failing: "
        f"{attacked.healthz_bad}. Errors in every case: 5xx {len(server_errors)}, globex calls "
        f"refused or unanswered within {CALL_TIMEOUT_S:.0f} s {len(failed)}"
        + (
            f" (first: {'; '.join((server_errors + failed)[:3])})"
            if server_errors or failed
            else ""
        )
        + ". Client and server share the 2 cores."
    )
    return Row(
        title,
        attacked.events + hostile.events,
        errors=errors,
        p99_ms=attacked.p99(),
        promised=("errors",),
        note=note,
    )


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    url = deployment["memory"].url
    sizes = QUICK if ctx.quick else FULL
    await warm_up(url)
    baseline = await one_run(url, "base", sizes)
    ctx.say(f"adversarial baseline: {baseline.summary()}")
    rows = [
        Row(
            "adversarial: another tenant undisturbed (the reference)",
            baseline.events,
            errors=len(baseline.server_errors) + len(baseline.failed) + baseline.healthz_bad,
            p99_ms=baseline.p99(),
            promised=("errors",),
            note=f"Undisturbed: {baseline.summary()}.",
        )
    ]
    await asyncio.sleep(2.0)
    texts = Attack()
    attacked = await one_run(url, "texts", sizes, (plan_texts(sizes), texts))
    ctx.say(f"adversarial texts: {attacked.summary()}")
    rows.append(
        _attacked_row(
            "adversarial: worst-case texts at the size limit (regex runs, 40 x 8,000-char "
            "promises) vs another tenant's latency",
            baseline,
            attacked,
            texts,
            f"{sizes.each} each of 'welcome to' / 'this is bob from' + spaces and '1' x "
            f"8,000, {sizes.promise_users} user(s) x 40 x 8,000 chars of "
            f"'{PROMISE.strip()}'",
            promise_latency=True,
        )
    )
    await asyncio.sleep(2.0)
    floods = Attack()
    flooded = await one_run(url, "floods", sizes, (plan_floods(sizes), floods))
    ctx.say(f"adversarial floods: {flooded.summary()}")
    rows.append(
        _attacked_row(
            "adversarial: floods at the limits (2,000 speakers, 1 MB bodies) vs another "
            "tenant's latency",
            baseline,
            flooded,
            floods,
            f"{sizes.speakers} speakers for one user (stored: "
            f"{'yes' if floods.speakers_found else 'not within 30 s'}) then 8,000-char "
            f"retrievals {', '.join(f'{ms:.0f}' for ms in floods.speaker_retrieve_ms)} ms, "
            f"{sizes.full_bodies} bodies just under 1 MB of the texts above",
            promise_latency=False,
        )
    )
    return rows
