"""A deterministic stream of realistic customer-service turns, for the ingest and cost benchmarks.

This module owns the generated stream: users of a fictional shop open chat sessions over a
few months about one to three issues each (a late order, a damaged item, a double charge,
an address change, a subscription, a product question, new contact details). An issue
comes back across sessions in paraphrases and with its order number, product code, email
or phone — the recurrence memstream consolidates — between greetings and thanks that must
trigger nothing. The same ``(n, seed)`` always gives the same events, byte for byte.

``python -m bench.generate N FILE`` writes N events as JSONL.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Fixed, in the past: timestamps must be plausible (not in the future) whenever this runs.
BASE_TS = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
SPAN_DAYS = 90
TURNS_PER_USER = 28  # rough mean, to size the user population for n events

PRODUCTS = (
    ("KX-200 kettle", "KX-200"),
    ("BL-450 blender", "BL-450"),
    ("TS-9 tea set", "TS-9"),
    ("CM-310 coffee maker", "CM-310"),
    ("LN-22 linen sheets", "LN-22"),
    ("DL-7 desk lamp", "DL-7"),
    ("VC-880 vacuum cleaner", "VC-880"),
    ("AF-120 air fryer", "AF-120"),
)
FIRST = ("ana", "ben", "chen", "dana", "eli", "fay", "gus", "hana", "ivan", "jo", "kai", "lea")
LAST = ("ruiz", "okafor", "wang", "berg", "novak", "silva", "moreau", "khan", "ito", "weber")
STREETS = ("Juniper Lane", "Harbour Road", "Lindenstrasse", "Oak Avenue", "Mill Street")
CITIES = ("Springfield", "Berlin", "Leeds", "Lyon", "Porto", "Utrecht")

# issue -> stages -> (user paraphrases, agent replies). Slots: {order} {product} {code}
# {amount} {address} {email} {phone} {date}. Paraphrases of one stage are what semantic
# recurrence must notice; the order / code / email / phone are what entity recurrence keys.
ISSUES: dict[str, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "late": [
        (
            (
                "My order {order} still hasn't arrived, it was due on {date}.",
                "Where is my order {order}? It should have been here by {date}.",
                "I'm still waiting for order {order}, the tracking hasn't moved for days.",
            ),
            (
                "I'm sorry about the delay. Order {order} is held at our warehouse; "
                "I've escalated it and you'll hear from us within 48 hours.",
                "Let me check order {order}... it is delayed at the carrier. I've opened a trace.",
            ),
        ),
        (
            (
                "Any news on order {order}? Nobody got back to me.",
                "It's been days and order {order} is still not here.",
                "Again no update about order {order}, this is getting frustrating.",
            ),
            (
                "I apologise, order {order} shipped this morning and should arrive in 2 days.",
                "Order {order} left the warehouse today; I'll email you the tracking link.",
            ),
        ),
        (
            (
                "Order {order} finally arrived today, thanks.",
                "Just to let you know the parcel for order {order} came, all good.",
            ),
            ("Great to hear that order {order} arrived! Sorry again for the wait.",),
        ),
    ],
    "damaged": [
        (
            (
                "The {product} from order {order} arrived broken, the lid is cracked.",
                "My {code} came damaged in order {order}, can I get a replacement?",
                "The {product} I received is not working at all, order {order}.",
            ),
            (
                "I'm sorry! I've arranged a free replacement {product} for order {order}.",
                "Please send a photo of the damaged {code}; a replacement will follow.",
            ),
        ),
        (
            (
                "The replacement {code} stopped working too, the light keeps blinking.",
                "Unfortunately the new {product} is also faulty.",
            ),
            ("I'm very sorry. I can offer a full refund of {amount} for the {product}.",),
        ),
    ],
    "charge": [
        (
            (
                "I was charged twice for order {order}, {amount} each time.",
                "There are two payments of {amount} for order {order} on my card.",
                "Why did you bill me double for order {order}?",
            ),
            (
                "I see the duplicate charge on order {order}. It's a pending hold and should "
                "drop within 3 business days.",
            ),
        ),
        (
            (
                "The second charge of {amount} for order {order} is still on my statement.",
                "The double payment on order {order} never dropped.",
            ),
            ("I've issued a refund of {amount} for order {order}; allow 5-7 days.",),
        ),
    ],
    "address": [
        (
            (
                "I moved, please update my address to {address}.",
                "My new delivery address is {address}, please use it from now on.",
            ),
            ("Done, your address is now {address} for all future orders.",),
        ),
        (
            (
                "Can you confirm you have my new address {address}?",
                "Please double check my next parcel goes to {address}.",
            ),
            ("Yes, the next delivery goes to {address}.",),
        ),
    ],
    "subscription": [
        (
            (
                "I'd like to pause my coffee subscription for a month.",
                "Can I skip the next delivery of my coffee subscription?",
            ),
            ("Your coffee subscription is paused; the next box ships in 4 weeks.",),
        ),
        (
            (
                "Please restart my coffee subscription, I'm back home.",
                "I want my coffee deliveries to resume next week.",
            ),
            ("Your coffee subscription is active again from next week.",),
        ),
    ],
    "question": [
        (
            (
                "Does the {product} work with 110 volt sockets?",
                "Is the {code} dishwasher safe?",
                "How long is the warranty on the {product}?",
            ),
            ("The {product} has a 2-year warranty and works on 100-240 volts.",),
        ),
    ],
    "contact": [
        (
            (
                "Please send my invoices to {email} from now on.",
                "My email changed, it is {email} now.",
            ),
            ("Noted, we will use {email} for your invoices.",),
        ),
        (
            (
                "My new phone number is {phone}, please text me there.",
                "Please use {phone} for delivery notifications.",
            ),
            ("Thanks, {phone} is saved for SMS updates.",),
        ),
    ],
}
GREETINGS = ("hi", "hello", "hey there", "good morning", "hi, I need some help")
AGENT_GREETINGS = (
    "Hi, welcome to Brightside Home support! How can I help you today?",
    "Hello! Thanks for contacting Brightside Home. What can I do for you?",
)
CLOSINGS = ("thanks!", "ok thank you", "great, thanks a lot", "ok", "perfect, bye")
AGENT_CLOSINGS = ("You're welcome! Have a nice day.", "Happy to help. Anything else?")
# Turns that carry no fact: retrieval leaves them out of a context by design.
SMALL_TALK = frozenset(GREETINGS + AGENT_GREETINGS + CLOSINGS + AGENT_CLOSINGS)


def _user_facts(rng: random.Random, uid: int) -> dict[str, str]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    product, code = rng.choice(PRODUCTS)
    return {
        "name": f"{first.title()} {last.title()}",
        "order": f"{rng.choice('ABDEF')}-{rng.randint(10000, 99999)}",
        "product": product,
        "code": code,
        "amount": f"${rng.randint(12, 240)}.{rng.randint(0, 99):02d}",
        "address": f"{rng.randint(1, 99)} {rng.choice(STREETS)}, {rng.choice(CITIES)}",
        "email": f"{first}.{last}{uid}@example.com",
        "phone": f"+1 415 555 {rng.randint(1000, 9999)}",
        "date": (BASE_TS + timedelta(days=rng.randint(0, SPAN_DAYS))).strftime("%B %d"),
    }


def _user_events(rng: random.Random, uid: int, tenant: str) -> list[dict[str, Any]]:
    facts = _user_facts(rng, uid)
    issues = rng.sample(sorted(ISSUES), k=rng.randint(1, 3))
    # Each session moves one open issue one stage on; a session may also revisit a stage.
    plan = [(issue, stage) for issue in issues for stage in range(len(ISSUES[issue]))]
    rng.shuffle(plan)
    plan.sort(key=lambda p: p[1])  # stages of an issue stay in order
    user_id = f"gen-u{uid:04d}"
    events: list[dict[str, Any]] = []
    ts = BASE_TS + timedelta(minutes=rng.randint(0, SPAN_DAYS * 24 * 60))
    for session, (issue, stage) in enumerate(plan, start=1):
        turns: list[tuple[str, str]] = [
            ("user", rng.choice(GREETINGS)),
            ("assistant", rng.choice(AGENT_GREETINGS)),
        ]
        asks, replies = ISSUES[issue][stage]
        for _ in range(rng.randint(1, 3)):  # the customer repeats or rephrases
            turns.append(("user", rng.choice(asks).format(**facts)))
            turns.append(("assistant", rng.choice(replies).format(**facts)))
        if rng.random() < 0.7:
            turns.append(("user", rng.choice(CLOSINGS)))
            turns.append(("assistant", rng.choice(AGENT_CLOSINGS)))
        for turn, (role, text) in enumerate(turns, start=1):
            ts += timedelta(seconds=rng.randint(10, 120))
            events.append(
                {
                    "event_id": f"{user_id}-s{session}-t{turn:02d}",
                    "tenant_id": tenant,
                    "user_id": user_id,
                    "session_id": f"{user_id}-s{session}",
                    "role": role,
                    "text": text,
                    "ts": ts.isoformat().replace("+00:00", "Z"),
                    "metadata": {
                        "importance": 0.5,
                        "speaker": facts["name"] if role == "user" else "support agent",
                        "channel": "web-chat",
                    },
                }
            )
        ts += timedelta(hours=rng.randint(6, 24 * 12))  # days pass between sessions
    return events


def generate_events(n: int, *, seed: int = 7, tenant: str = "demo") -> list[dict[str, Any]]:
    """The first ``n`` events, in time order, of a population sized to hold them."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    uid = 0
    while len(events) < n:
        for _ in range(max(8, (n - len(events)) // TURNS_PER_USER + 1)):
            events.extend(_user_events(rng, uid, tenant))
            uid += 1
    events.sort(key=lambda e: (e["ts"], e["event_id"]))
    return events[:n]


def write_jsonl(events: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events))
    return path


if __name__ == "__main__":
    count, target = int(sys.argv[1]), Path(sys.argv[2])
    write_jsonl(generate_events(count), target)
    print(f"wrote {count} events to {target}")
