"""A deterministic multi-customer support stream with labelled probes (``customer_service``).

This module owns the generated traffic and what it is scored against: each customer chats
with support in four to six sessions spread over about six months, with weeks between
them, about one to three orders whose status moves on (placed, shipped, stuck at a hub,
delivered, lost, damaged, replaced, refunded), profile attributes that change (address,
phone, email, delivery and contact preference), agent promises that are kept, kept late or
never kept (a fulfilment is said in other words), and one-off facts said once, with small
talk between them and a few typos in words that carry no value. Sentences come from one
half of ``bench.cs_phrases`` (A: development, B: held out).

A probe is one question a bot would ask about one fact, with the value strings a context
shows when it shows the current value and the stale ones. The same ``(customers, seed)``
gives the same customers, facts and session plan in both halves; only the wording differs.
The same arguments give the same events, byte for byte. Pure apart from ``write_jsonl``.

``python -m bench.cs_stream N SEED HALF FILE`` writes the events of N customers as JSONL.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast

from bench import cs_phrases as P
from bench.cs_phrases import Half

# Fixed, in the past: every timestamp is plausible whenever this runs.
BASE_TS = datetime(2025, 2, 3, 8, 0, tzinfo=UTC)
TYPO_RATE = 0.12  # share of turns with one typo in a word that carries no value
RETRIES = 12  # renderings tried before a span that collides with another fact's is accepted

ProbeKind = Literal[
    "status", "address", "phone", "email", "preference", "promise_owed", "promise_kept",
    "one_off",
]  # fmt: skip
KINDS: tuple[ProbeKind, ...] = (
    "status", "address", "phone", "email", "preference", "promise_owed", "promise_kept",
    "one_off",
)  # fmt: skip
VALUE_KINDS: tuple[ProbeKind, ...] = ("status", "address", "phone", "email", "preference")

PRODUCTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("walnut desk", ("leg", "drawer front")),
    ("kettle", ("lid", "handle")),
    ("standing lamp", ("shade", "base")),
    ("coffee grinder", ("hopper", "glass jar")),
    ("rowing machine", ("seat rail", "display")),
    ("oak bookcase", ("side panel", "top shelf")),
    ("rice cooker", ("inner pot", "lid hinge")),
    ("office chair", ("armrest", "gas lift")),
    ("garden bench", ("backrest", "slat")),
    ("stand mixer", ("bowl", "whisk attachment")),
    ("air purifier", ("filter door", "front grille")),
    ("bedside table", ("drawer", "leg")),
)
COURIERS = ("DPD", "Evri", "Royal Mail", "Yodel", "Parcelforce", "DHL")
CITIES = ("Daventry", "Warrington", "Bristol", "Coventry", "Glasgow", "Rugby", "Doncaster")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
SIGNERS = ("a neighbour", "someone called Priya", "a D. Walsh", "your housemate", "M. Osei")
FIRST = ("ana", "ben", "chloe", "dev", "ella", "finn", "grace", "hamza", "isla", "jack")
LAST = ("reid", "okafor", "wong", "berg", "novak", "silva", "moreau", "khan", "ito", "hale")
STREETS = (
    "Mill Street", "Harbour Road", "Juniper Lane", "Oak Avenue", "Station Road",
    "Kings Crescent", "Abbey Close", "Quarry Hill", "Fern Grove", "Elm Terrace",
)  # fmt: skip
TOWNS = ("Leeds", "York", "Bath", "Derby", "Exeter", "Hull", "Kendal", "Ripon", "Truro")
DOMAINS = ("example.com", "mail.example.org", "post.example.net", "inbox.example.co.uk")


@dataclass(frozen=True)
class Probe:
    """One question about one fact and the strings that show its current and stale values."""

    user_id: str
    kind: ProbeKind
    question: str
    current: tuple[str, ...]
    stale: tuple[str, ...]
    event_id_current: str
    fact: str  # "order 1", "address", "promise callback", "one_off allergy", ...
    stale_event_ids: tuple[str, ...] = ()
    fulfilled_by: tuple[str, ...] = ()  # promise_kept: the fulfilment spans, other words
    outcome: str = ""  # promises: "kept", "kept late", "never"
    # status: whether the text lets a reader tie the name asked by to the current statement
    # (it names the order as asked, or some turn names its number and its thing together)
    names_tied: bool | None = None


@dataclass(frozen=True)
class CsStream:
    customers: int
    seed: int
    half: Half
    events: tuple[dict[str, Any], ...]
    probes: tuple[Probe, ...]
    small_talk: frozenset[str]  # the text of every small-talk turn, as sent
    templates_used: frozenset[str]  # every template a turn or question was made from
    dropped: int = 0  # probes left out: a value string also said about another fact


def norm(text: str) -> str:
    """Lowercase, whitespace collapsed: the form every value search uses."""
    return " ".join(text.lower().split())


# --- rendering ------------------------------------------------------------------------------

_TOKEN = re.compile(r"\{(\w+)\}|\[|\]")
_WORD = re.compile(r"[A-Za-z]{5,}")


def _typo(word: str, rng: random.Random) -> str:
    """Swap two adjacent inner letters or drop one (first and last letters kept)."""
    i = rng.randrange(1, len(word) - 2)
    if rng.random() < 0.5:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + word[i + 1 :]


def render(
    template: str, slots: dict[str, str], rng: random.Random, typo_rate: float = TYPO_RATE
) -> tuple[str, str | None]:
    """The text (slots filled, brackets dropped, first letter capitalised, maybe a typo
    outside the value span and the slots) and the value span, if the template marks one."""
    pieces: list[tuple[str, bool]] = []  # (text, protected from typos)
    span: list[str] | None = None
    spans: list[str] = []
    at = 0
    for m in _TOKEN.finditer(template):
        literal = template[at : m.start()]
        at = m.end()
        if literal:
            pieces.append((literal, span is not None))
            if span is not None:
                span.append(literal)
        if m.group(1) is not None:
            value = slots[m.group(1)]
            pieces.append((value, True))
            if span is not None:
                span.append(value)
        elif m.group(0) == "[":
            span = []
        else:
            spans.append("".join(span or []))
            span = None
    if template[at:]:
        pieces.append((template[at:], False))
    if rng.random() < typo_rate:
        open_words = [
            (i, w) for i, (text, protected) in enumerate(pieces) if not protected
            for w in _WORD.finditer(text)
        ]  # fmt: skip
        if open_words:
            i, w = rng.choice(open_words)
            text = pieces[i][0]
            pieces[i] = (text[: w.start()] + _typo(w.group(), rng) + text[w.end() :], False)
    text = "".join(p for p, _ in pieces)
    text = text[:1].upper() + text[1:]
    return text, (spans[0] if spans else None)


# --- a customer's plan ----------------------------------------------------------------------


@dataclass
class Step:
    """One thing said in a session: a state, an attribute value, a promise, ..."""

    kind: str  # state | attr | promise | fulfil | chase | one_off
    fact: str
    value: str  # the state, the attribute's value, the one-off's value, "promise", ...
    data: dict[str, str] = field(default_factory=dict)


def _sessions_for(rng: random.Random, n_steps: int, first: int, sessions: int) -> list[int]:
    """Non-decreasing sessions for a chain of steps, distinct where there is room."""
    room = list(range(first, sessions))
    if n_steps <= len(room):
        return sorted(rng.sample(room, n_steps))
    return sorted(rng.choice(room) for _ in range(n_steps))


def _address(rng: random.Random) -> str:
    letters = "ABDEHLMNPRSTW"
    postcode = (
        f"{rng.choice(letters)}{rng.choice(letters)}{rng.randint(1, 19)} "
        f"{rng.randint(1, 9)}{rng.choice(letters)}{rng.choice(letters)}"
    )
    return f"{rng.randint(2, 180)} {rng.choice(STREETS)}, {rng.choice(TOWNS)} {postcode}"


def _phone(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return f"07{rng.randint(100, 999)} {rng.randint(100000, 999999)}"
    return f"+44 7{rng.randint(100, 999)} {rng.randint(100, 999)} {rng.randint(100, 999)}"


def _order_ref(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return f"{rng.choice('CKRT')}-{rng.randint(10000, 99999)}"
    if kind == 1:
        return f"#{rng.randint(10000, 99999)}"
    return str(rng.randint(1000000, 9999999))


def _amount(rng: random.Random) -> str:
    return f"£{rng.randint(5, 240)}.{rng.choice(('00', '50', '99', '49', '20'))}"


def _distinct(rng: random.Random, make: Any, n: int) -> list[str]:
    values: list[str] = []
    while len(values) < n:
        v = make(rng)
        if v not in values:
            values.append(v)
    return values


def plan_customer(rng: random.Random) -> tuple[int, list[list[Step]]]:
    """The number of sessions and each session's steps, in the order they are said."""
    sessions = rng.randint(4, 6)
    first, last = rng.choice(FIRST), rng.choice(LAST)
    chains: list[tuple[list[int], list[Step]]] = []  # (each step's session, steps)

    def chain(steps: list[Step], start: int) -> None:
        chains.append((_sessions_for(rng, len(steps), start, sessions), steps))

    products = rng.sample(PRODUCTS, rng.randint(1, 3))
    for o, (product, parts) in enumerate(products, start=1):
        path = rng.choice(P.PATHS)
        states = path[: rng.randint(2, len(path))]
        order = {
            "ref": _order_ref(rng), "product": product, "part": rng.choice(parts),
            "courier": rng.choice(COURIERS), "city": rng.choice(CITIES),
            "amount": _amount(rng), "single": "1" if len(products) == 1 else "",
        }  # fmt: skip
        steps = [Step("state", f"order {o}", s, order) for s in states]
        chain(steps, rng.randint(0, max(0, sessions - len(states))))
    profile: list[tuple[str, list[str]]] = [
        ("address", _distinct(rng, _address, rng.randint(2, 3))),
        ("phone", _distinct(rng, _phone, 2)),
        ("email", [
            f"{first}.{last}{rng.randint(1, 99)}@{d}" for d in rng.sample(DOMAINS, 2)
        ]),
        ("delivery", [
            o.format(n=rng.randint(2, 90), street=rng.choice(STREETS))
            for o in rng.sample(P.DELIVERY_OPTIONS, 3)
        ]),
        ("contact", rng.sample(P.CONTACT_OPTIONS, rng.randint(1, 2))),
    ]  # fmt: skip
    for name, values in profile:
        steps = [
            Step("attr", name, v, {"template": name if j == 0 else f"{name}_change"})
            for j, v in enumerate(values)
        ]
        chain(steps, rng.randint(0, max(0, sessions - len(values) - 1)))
    for kind in rng.sample(sorted(P.PROMISES), rng.randint(2, 3)):
        product, _ = rng.choice(products)
        data = {
            "product": product, "amount": _amount(rng), "weekday": rng.choice(WEEKDAYS),
            "courier": rng.choice(COURIERS), "type": kind,
        }  # fmt: skip
        start = rng.randint(0, sessions - 1)
        room = sessions - 1 - start  # later sessions left
        outcome = rng.choice(("kept", "kept", "kept late", "never", "never"))
        if outcome == "kept late" and room < 2:
            outcome = "kept" if room == 1 else "never"
        if outcome == "kept" and room < 1:
            outcome = "never"
        fact = f"promise {kind}"
        later: list[Step] = []
        if outcome == "kept late":
            later = [Step("chase", fact, "chase", data), Step("fulfil", fact, "kept", data)]
        elif outcome == "kept":
            later = [Step("fulfil", fact, "kept", data)]
        elif room and rng.random() < 0.5:  # never kept: sometimes chased
            later = [Step("chase", fact, "chase", data)]
        # The promise in its session, what follows in later ones.
        where = [start, *_sessions_for(rng, len(later), start + 1, sessions)] if later else [start]
        chains.append((where, [Step("promise", fact, "promise", data), *later]))
    for kind in rng.sample(sorted(P.ONE_OFFS), rng.randint(2, 3)):
        value = rng.choice(P.ONE_OFF_VALUES[kind])
        chain([Step("one_off", f"one_off {kind}", value)], rng.randint(0, sessions - 1))
    plan: list[list[tuple[int, Step]]] = [[] for _ in range(sessions)]
    for c, (where, steps) in enumerate(chains):
        for s, step in zip(where, steps, strict=True):
            plan[s].append((c, step))
    ordered: list[list[Step]] = []
    for items in plan:  # interleave chains at random, each chain's steps in order
        queues: dict[int, list[Step]] = {}
        for c, step in items:
            queues.setdefault(c, []).append(step)
        out: list[Step] = []
        while queues:
            c = rng.choice(sorted(queues))
            out.append(queues[c].pop(0))
            if not queues[c]:
                del queues[c]
        ordered.append(out)
    return sessions, ordered


# --- a customer's turns ---------------------------------------------------------------------


@dataclass
class Said:
    """A value statement: which fact and value it states, in which event, with which span."""

    event_id: str
    fact: str
    value: str
    span: str
    kind: str  # the step kind


class Customer:
    """Renders one customer's plan into events with one half's templates."""

    def __init__(
        self, user_id: str, tenant: str, half: Half, rng: random.Random, plan: list[list[Step]]
    ) -> None:
        self.user_id, self.tenant, self.half, self.rng = user_id, tenant, half, rng
        self.plan = plan
        # Each fact's slots (an order's ref and product, a promise's amount): for questions.
        self.step_data = {step.fact: step.data for steps in plan for step in steps if step.data}
        self.events: list[dict[str, Any]] = []
        self.said: list[Said] = []
        self.small_talk: set[str] = set()
        self.used: set[str] = set()
        self.ts = BASE_TS
        self.session = 0
        self.turn = 0

    # Templates of this half only.
    def pick(self, name: str, items: tuple[Any, ...]) -> Any:
        chosen = self.rng.choice(P.half(items, self.half))
        self.used.add(f"{name}|{chosen if isinstance(chosen, str) else chosen[1]}")
        return chosen

    def emit(self, role: P.Side, text: str, *, small_talk: bool = False) -> str:
        self.turn += 1
        self.ts += timedelta(seconds=self.rng.randint(15, 110))
        event_id = f"{self.user_id}-s{self.session}-t{self.turn:02d}"
        self.events.append(
            {
                "event_id": event_id,
                "tenant_id": self.tenant,
                "user_id": self.user_id,
                "session_id": f"{self.user_id}-s{self.session}",
                "role": role,
                "text": text,
                "ts": self.ts.isoformat().replace("+00:00", "Z"),
                "metadata": {
                    "importance": 0.5,
                    "speaker": "customer" if role == "user" else "agent",
                    "channel": "web-chat",
                },
            }
        )
        if small_talk:
            self.small_talk.add(text)
        return event_id

    def content(
        self,
        name: str,
        templates: tuple[str, ...],
        role: P.Side,
        slots: dict[str, str] | None = None,
    ) -> None:
        """A turn that is neither small talk nor a value statement."""
        text, _ = render(self.pick(f"misc.{name}", templates), slots or {}, self.rng)
        self.emit(role, text)

    def chat(self, kind: str, role: P.Side) -> None:
        text, _ = render(self.pick(f"small_talk.{kind}", P.SMALL_TALK[kind]), {}, self.rng)
        self.emit(role, text, small_talk=True)

    def statement(
        self,
        name: str,
        templates: tuple[Any, ...],
        slots: dict[str, str],
        fact: str,
        value: str,
        *,
        role: P.Side | None = None,
        side: P.Side | None = None,
    ) -> tuple[P.Side, str, str]:
        """Render a value template (``role``: the list is of bare strings said by it;
        ``side``: only that side's templates) whose span no other fact's span contains or
        is contained in, tried ``RETRIES`` times; returns the role, the text and the span."""
        taken = [norm(s.span) for s in self.said if (s.fact, s.value) != (fact, value)]
        mine = P.half(templates, self.half)
        if side is not None:
            mine = tuple(t for t in mine if t[0] == side)
        for attempt in range(RETRIES):
            chosen = self.rng.choice(mine)
            speaker, template = (role, chosen) if role is not None else chosen
            text, marked = render(template, self._slots(slots, speaker), self.rng)
            if marked is None:
                raise ValueError(f"no [value span] in {template!r}")
            span = marked
            if attempt == RETRIES - 1 or not any(norm(span) in t or t in norm(span) for t in taken):
                break
        self.used.add(f"{name}|{template}")
        return speaker, text, span

    def _slots(self, slots: dict[str, str], side: P.Side) -> dict[str, str]:
        """Fill ``{what}`` (the order as this side would name it) and per-sentence slots."""
        out = {
            **slots,
            "weekday": self.rng.choice(WEEKDAYS),
            "hour": f"{self.rng.randint(8, 19)}:{self.rng.randint(0, 59):02d}",
            "signer": self.rng.choice(SIGNERS),
            "tracking": f"JD{self.rng.randint(10**9, 10**10 - 1)}",
            "date": (self.ts - timedelta(days=self.rng.randint(1, 5))).strftime("%-d %B"),
        }
        if "ref" in slots:
            mine = "my" if side == "user" else "your"
            ways = [
                f"order {slots['ref']}",
                f"the {slots['product']}",
                f"{mine} {slots['product']}",
            ]
            if slots.get("first"):  # the first mention names the order
                ways = [f"order {slots['ref']}", f"the {slots['product']} (order {slots['ref']})"]
            elif slots.get("single"):
                ways.append(f"{mine} parcel")
            out["what"] = self.rng.choice(ways)
        return out

    def record(self, event_id: str, fact: str, value: str, span: str, kind: str) -> None:
        self.said.append(Said(event_id, fact, value, span, kind))

    def say(self, step: Step, mentioned: set[str]) -> None:
        rng = self.rng
        if step.kind == "state":
            slots = dict(step.data)
            slots["first"] = "" if step.fact in mentioned else "1"
            mentioned.add(step.fact)
            side, text, span = self.statement(
                f"state.{step.value}", P.STATES[step.value], slots, step.fact, step.value
            )
            if side == "assistant" and rng.random() < 0.7:
                self.content("enquiry", P.ENQUIRIES, "user", self._slots(slots, "user"))
                if rng.random() < 0.3:
                    self.chat("filler", "assistant")
            event_id = self.emit(side, text)
            self.record(event_id, step.fact, step.value, span, "state")
            if side == "assistant" and rng.random() < 0.4:
                self.content("follow_up", P.FOLLOW_UPS, "user")
                self.content("follow_up_reply", P.FOLLOW_UP_REPLIES, "assistant")
            else:
                self._ack(side, 0.3)
        elif step.kind == "attr":
            name = step.data["template"]
            side, text, span = self.statement(
                f"attribute.{name}", P.ATTRIBUTES[name], {"value": step.value}, step.fact,
                step.value,
            )  # fmt: skip
            event_id = self.emit(side, text)
            self.record(event_id, step.fact, step.value, span, "attr")
            if side == "user" and rng.random() < 0.3:  # the agent repeats it back
                _, text, span = self.statement(
                    f"attribute.{name}", P.ATTRIBUTES[name], {"value": step.value}, step.fact,
                    step.value, side="assistant",
                )  # fmt: skip
                self.record(self.emit("assistant", text), step.fact, step.value, span, "attr")
            else:
                self._ack(side, 0.3)
        elif step.kind == "promise":
            kind = step.data["type"]
            if rng.random() < 0.7:
                self.content("request", P.REQUESTS, "user")
            _, text, span = self.statement(
                f"promise.{kind}", P.PROMISES[kind], step.data, step.fact, "promise",
                role="assistant",
            )  # fmt: skip
            event_id = self.emit("assistant", text)
            self.record(event_id, step.fact, "promise", span, "promise")
            self._ack("assistant", 0.3)
        elif step.kind == "fulfil":
            kind = step.data["type"]
            side, text, span = self.statement(
                f"fulfilment.{kind}", P.FULFILMENTS[kind], step.data, step.fact, "kept"
            )
            event_id = self.emit(side, text)
            self.record(event_id, step.fact, "kept", span, "fulfil")
            self._ack(side, 0.3)
        elif step.kind == "chase":
            topic = P.TOPICS[step.data["type"]].format(**step.data)
            self.content("chase", P.CHASES, "user", {"topic": topic})
            self.content("chase_reply", P.CHASE_REPLIES, "assistant")
        elif step.kind == "one_off":
            kind = step.fact.split()[-1]
            _, text, span = self.statement(
                f"one_off.{kind}", P.ONE_OFFS[kind], {"value": step.value}, step.fact,
                step.value, role="user",
            )  # fmt: skip
            event_id = self.emit("user", text)
            self.record(event_id, step.fact, step.value, span, "one_off")
            self._ack("user", 0.3)

    def _ack(self, side: P.Side, p: float) -> None:
        """The other side acknowledges, sometimes (small talk)."""
        if self.rng.random() < p:
            self.chat(
                "agent_ack" if side == "user" else "ack", "assistant" if side == "user" else "user"
            )

    def run(self) -> None:
        rng, plan = self.rng, self.plan
        day = BASE_TS + timedelta(days=rng.randint(0, 20))
        mentioned: set[str] = set()
        for s in range(len(plan)):
            self.session, self.turn = s + 1, 0
            self.ts = day + timedelta(hours=rng.randint(0, 11), minutes=rng.randint(0, 59))
            if rng.random() < 0.6:  # else the customer starts with the matter itself
                self.chat("greeting", "user")
            self.chat("agent_greeting", "assistant")
            if rng.random() < 0.2:
                self.chat("chitchat", "user")
                self.chat("agent_chitchat", "assistant")
            for step in plan[s]:
                self.say(step, mentioned)
            if rng.random() < 0.35:
                self.chat("anything_else", "assistant")
                self.chat("nothing_else", "user")
            if rng.random() < 0.25:
                self.chat("signoff", "assistant")
            if rng.random() < 0.2:
                self.chat("customer_signoff", "user")
            day += timedelta(days=rng.randint(12, 40))  # weeks of quiet before the next


# --- probes ---------------------------------------------------------------------------------


def _question(customer: Customer, name: str, slots: dict[str, str]) -> str:
    text = customer.pick(f"question.{name}", P.QUESTIONS[name])
    return str(text).format(**slots)


def _probes(customer: Customer) -> tuple[list[Probe], int]:
    """One probe per fact; a probe whose value strings another fact's turns also hold is
    dropped (its stale strings that do are left out)."""
    said = customer.said
    texts = {e["event_id"]: norm(e["text"]) for e in customer.events}
    order = {e["event_id"]: i for i, e in enumerate(customer.events)}
    facts: dict[str, list[Said]] = {}
    for s in said:
        facts.setdefault(s.fact, []).append(s)

    def clean(fact: str, value: str, spans: Sequence[str]) -> list[str]:
        """Spans found only in this (fact, value)'s own statements."""
        own = {s.event_id for s in said if (s.fact, s.value) == (fact, value)}
        keep = []
        for span in dict.fromkeys(spans):
            holders = {e for e, t in texts.items() if norm(span) in t}
            if holders and holders <= own:
                keep.append(span)
        return keep

    probes: list[Probe] = []
    dropped = 0
    for fact, items in facts.items():
        uid = customer.user_id
        if fact.startswith("promise"):
            promise = next(s for s in items if s.kind == "promise")
            kept = [s for s in items if s.kind == "fulfil"]
            outcome = "never" if not kept else ("kept late" if len(items) > 2 else "kept")
            data = customer.step_data[fact]
            topic = P.TOPICS[fact.split()[-1]].format(**data)
            current = clean(fact, "promise", [promise.span])
            if not current:
                dropped += 1
                continue
            probes.append(
                Probe(
                    uid, "promise_kept" if kept else "promise_owed",
                    _question(customer, "promise", {"topic": topic}), tuple(current), (),
                    promise.event_id, fact, fulfilled_by=tuple(s.span for s in kept),
                    outcome=outcome,
                )
            )  # fmt: skip
            continue
        last = items[-1]
        current = clean(fact, last.value, [s.span for s in items if s.value == last.value])
        stale_said = [s for s in items if s.value != last.value]
        stale = [
            span for s in stale_said for span in clean(fact, s.value, [s.span])
            if order[s.event_id] < order[last.event_id]
        ]  # fmt: skip
        if not current:
            dropped += 1
            continue
        kind: ProbeKind
        tied: bool | None = None
        if fact.startswith("order"):
            kind = "status"
            data = customer.step_data[fact]
            by_ref = customer.rng.random() < 0.5
            name = "status_ref" if by_ref else "status_product"
            question = _question(customer, name, data)
            tied = order_names_tied(texts, last.event_id, data, by_ref)
        elif fact.startswith("one_off"):
            kind = "one_off"
            question = _question(customer, fact.split()[-1], {})
        elif fact in ("delivery", "contact"):
            kind = "preference"
            question = _question(customer, fact, {})
        else:
            kind = cast(ProbeKind, fact)
            question = _question(customer, fact, {})
        probes.append(
            Probe(
                uid, kind, question, tuple(current), tuple(dict.fromkeys(stale)),
                last.event_id, fact,
                stale_event_ids=tuple(dict.fromkeys(s.event_id for s in stale_said)),
                names_tied=tied,
            )
        )  # fmt: skip
    return probes, dropped


def order_names_tied(
    texts: dict[str, str], current_id: str, data: dict[str, str], by_ref: bool
) -> bool:
    """Whether the current statement names the order as the question does, or a turn names its
    number and its thing together: else no reader of the text can know they are one order."""

    def words(text: str) -> str:
        return f" {' '.join(re.findall(r'[a-z0-9]+', text.lower()))} "

    ref, product = words(data["ref"]), words(data["product"])
    asked = ref if by_ref else product
    said = [words(t) for t in texts.values()]
    return asked in words(texts[current_id]) or any(ref in t and product in t for t in said)


def generate(customers: int, seed: int, half: Half, tenant: str = "demo") -> CsStream:
    """``customers`` customers' events in time order, and their probes."""
    events: list[dict[str, Any]] = []
    probes: list[Probe] = []
    small_talk: set[str] = set()
    used: set[str] = set()
    dropped = 0
    for i in range(customers):
        # The plan depends on the seed only (both halves tell the same story); the wording,
        # typos and timings on the half too. String seeds hash the same in every process.
        _, plan = plan_customer(random.Random(f"cs-plan:{seed}:{i}"))
        user_id = f"cs{seed}{half.lower()}-{i:03d}"
        text_rng = random.Random(f"cs-text:{seed}:{half}:{i}")
        customer = Customer(user_id, tenant, half, text_rng, plan)
        customer.run()
        found, lost = _probes(customer)
        events += customer.events
        probes += found
        small_talk |= customer.small_talk
        used |= customer.used
        dropped += lost
    events.sort(key=lambda e: (e["ts"], e["event_id"]))
    return CsStream(
        customers, seed, half, tuple(events), tuple(probes), frozenset(small_talk),
        frozenset(used), dropped,
    )  # fmt: skip


def write_jsonl(events: Sequence[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events))
    return path


if __name__ == "__main__":
    n, seed, which, target = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    if which not in ("A", "B"):
        sys.exit("HALF must be A or B")
    stream = generate(n, seed, cast(Half, which))
    write_jsonl(stream.events, target)
    print(f"wrote {len(stream.events)} events, {len(stream.probes)} probes, to {target}")
