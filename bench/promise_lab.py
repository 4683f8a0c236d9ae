"""How well ``memory.promises`` reads the paraphrase bank (``python -m bench.promise_lab``).

For each half of ``bench.cs_phrases`` (A: development, B: held out, only measured), the
templates are filled several times and read by ``is_promise`` (recall on PROMISES, false
positives on everything else), ``reports_done`` (recall on FULFILMENTS, false positives on
chases, promises and pending states) and ``fulfilment`` with the product's encoder: each
promise against its true fulfilment hidden among chases of the same topic, other topics'
fulfilments and the customer's other turns, then against the same turns without the true
one (where any pair is wrong: it would show a promise still owed as kept), and once more
without it but with the order's other events about the promise's own product (a delivery,
a replacement, a refund of another amount...): a turn about the same thing but another
act, which must not keep it either.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench import cs_phrases as P
from bench.cs_stream import COURIERS, PRODUCTS, WEEKDAYS, render
from memory.promises import (
    MIN_COSINE,
    MIN_COSINE_WITH_EVIDENCE,
    fulfilment,
    is_promise,
    reports_done,
)

FILLINGS = 4
SEED = 7

# Half C: promises and their fulfilments written for this lab alone, after half B had been
# measured, in wordings of their own; development data like half A (its misses are shown),
# read with half A's negatives. The stream never uses them.
FRESH_PROMISES: dict[str, tuple[str, ...]] = {
    "collection": (
        "Our courier will swing by for the {product} on {weekday}.",
        "I've scheduled {courier} to fetch the {product} on {weekday}.",
        "We will get the {product} picked up from you on {weekday}.",
        "Leave the {product} by the door and a driver will take it on {weekday}.",
        "I'll organise a return pickup for the {product} this {weekday}.",
        "Someone will come round to take the {product} back on {weekday}.",
    ),
    "refund": (
        "I'll process a refund of {amount} today.",
        "You will be reimbursed {amount} within a week.",
        "We're going to credit {amount} back to your card.",
        "Your {amount} will be paid back in 3 to 5 days.",
        "I'll make sure the {amount} is returned to you.",
        "We'll pay back the {amount} by {weekday}.",
    ),
    "callback": (
        "I'll get a supervisor to phone you on {weekday}.",
        "We will ring you back on {weekday} morning.",
        "Somebody will give you a call on {weekday}.",
        "I'll phone you on {weekday} once the warehouse replies.",
        "Our team will be in touch by phone on {weekday}.",
        "I'll call you on {weekday} to confirm.",
    ),
    "voucher": (
        "I'll send over a {amount} voucher by email.",
        "We'll issue you a {amount} gift card as an apology.",
        "You'll get a {amount} code for your next order.",
        "I'll put {amount} of goodwill credit on your account.",
        "We're going to give you {amount} in store credit.",
        "I'll email a discount code worth {amount} today.",
    ),
}
FRESH_FULFILMENTS: dict[str, tuple[P.Template, ...]] = {
    "collection": (
        (P.U, "Your driver turned up on {weekday} and the {product} is gone."),
        (P.AG, "The returns depot has logged the {product} as received."),
        (P.U, "They fetched the {product} from my porch yesterday."),
        (P.AG, "{courier} confirms they have the {product} now."),
        (P.U, "All sorted, the {product} was taken back on {weekday}."),
        (P.AG, "The collection went ahead on {weekday} without any issues."),
    ),
    "refund": (
        (P.U, "I can see {amount} credited to my account now."),
        (P.AG, "Your {amount} was paid back to you on {weekday}."),
        (P.U, "The refund landed this morning."),
        (P.AG, "We processed the reimbursement and it has gone through."),
        (P.U, "My bank shows the {amount} returned."),
        (P.AG, "The {amount} has been reimbursed to your card."),
    ),
    "callback": (
        (P.U, "Your manager phoned me on {weekday}, all good."),
        (P.AG, "We rang you on {weekday} as promised."),
        (P.U, "I had the call from your team yesterday."),
        (P.AG, "My colleague got through to you by phone on {weekday}."),
        (P.U, "Someone from support called on {weekday} and we talked it through."),
        (P.AG, "The follow-up call took place on {weekday}."),
    ),
    "voucher": (
        (P.U, "The {amount} code came through by email."),
        (P.AG, "The voucher was emailed to you on {weekday}."),
        (P.U, "I've received the store credit, thanks."),
        (P.AG, "We issued the {amount} gift card yesterday."),
        (P.U, "The discount showed up on my account."),
        (P.AG, "Your {amount} credit has been applied."),
    ),
}
# Half D: a second lab-only bank, in the register of emails and longer replies (the
# passive, "is on its way", present progressives, hedged reports), written after C.
FRESH_PROMISES_D: dict[str, tuple[str, ...]] = {
    "collection": (
        "No problem at all. A collection has been arranged for {weekday}.",
        "Please have the {product} packed, {courier} are coming to get it on {weekday}.",
        "I've asked {courier} to pick the {product} up on {weekday}.",
        "The {product} will be picked up from your address on {weekday}.",
        "Our returns partner will call round for the {product} on {weekday}.",
        "We are sending a driver to collect the {product} on {weekday}.",
    ),
    "refund": (
        "I've raised a refund for {amount}, you should see it within five working days.",
        "You're getting the full {amount} back, it'll be on your card by {weekday}.",
        "We'll be refunding {amount} to your original payment method.",
        "I'm arranging a refund of {amount} for you now.",
        "The {amount} will go back to your bank by {weekday}.",
        "Rest assured the {amount} will be returned to your card.",
    ),
    "callback": (
        "I'll give you a ring back on {weekday} once I hear from the depot.",
        "A specialist will phone you {weekday} afternoon.",
        "Expect to hear from me by phone on {weekday}.",
        "I've booked a callback for {weekday} morning.",
        "We're going to ring you on {weekday} to go through the options.",
        "My manager will call you personally on {weekday}.",
    ),
    "voucher": (
        "As a goodwill gesture I'm sending you a {amount} voucher.",
        "I'll add {amount} store credit to your account today.",
        "A {amount} e-voucher will be emailed to you shortly.",
        "You're due a {amount} gift card from us, I'll send it this week.",
        "We'll email over a code for {amount} off.",
        "I'm going to credit your account with a {amount} voucher.",
    ),
}
FRESH_FULFILMENTS_D: dict[str, tuple[P.Template, ...]] = {
    "collection": (
        (P.U, "The courier came by on {weekday} and took the {product}."),
        (P.AG, "Our warehouse has now got the {product} back."),
        (P.U, "{courier} picked up the {product} earlier today."),
        (P.AG, "Tracking shows the {product} was collected on {weekday}."),
        (P.U, "The {product} went back with the driver this morning."),
        (P.AG, "We've had the {product} returned to us safely."),
    ),
    "refund": (
        (P.U, "Refund's come through, {amount} back in my account."),
        (P.AG, "The {amount} was refunded on {weekday}."),
        (P.U, "I've been paid back the {amount} now."),
        (P.AG, "Our finance team released the {amount} refund yesterday."),
        (P.U, "Just to confirm the refund arrived."),
        (P.AG, "I can confirm the {amount} has gone back onto your card."),
    ),
    "callback": (
        (P.U, "Your colleague phoned on {weekday}, thanks."),
        (P.AG, "We spoke by phone on {weekday}."),
        (P.U, "Got the call back on {weekday}."),
        (P.U, "The specialist rang me this morning."),
        (P.AG, "Our records show a call to you on {weekday}."),
        (P.U, "Had a chat with your supervisor on the phone yesterday."),
    ),
    "voucher": (
        (P.U, "Your voucher arrived, thanks a lot."),
        (P.AG, "The {amount} store credit was added on {weekday}."),
        (P.U, "I've got the gift card now."),
        (P.AG, "We emailed you the {amount} code on {weekday}."),
        (P.U, "The e-voucher came through this morning."),
        (P.AG, "The {amount} voucher has been sent to your inbox."),
    ),
}
Half = Literal["A", "B", "C", "D"]
PENDING_STATES = ("placed", "shipped", "delayed", "lost")


def _slots(rng: random.Random) -> dict[str, str]:
    product, parts = rng.choice(PRODUCTS)
    return {
        "product": product,
        "amount": f"£{rng.randint(5, 240)}.{rng.choice(('00', '50', '99'))}",
        "weekday": rng.choice(WEEKDAYS),
        "courier": rng.choice(COURIERS),
        "what": rng.choice((f"the {product}", "my parcel", "your parcel", "order C-73120")),
        "date": f"{rng.randint(1, 28)} March",
        "tracking": f"BX{rng.randint(1000000, 9999999)}",
        "city": rng.choice(("Daventry", "Rugby", "Bristol")),
        "hour": f"{rng.randint(9, 17)}:00",
        "part": rng.choice(parts),
        "first": "",
        "value": "peanuts",
        "ref": "C-73120",
    }


class _Slots(dict[str, str]):
    """Slots with a stand-in for any slot this lab does not fill."""

    def __missing__(self, key: str) -> str:
        return "a neighbour" if key == "signer" else key


def _fill(template: str, slots: dict[str, str], rng: random.Random) -> str:
    slots = _Slots(slots)
    slots.setdefault("topic", P.TOPICS["refund"].format(**slots))
    return render(template, slots, rng, typo_rate=0.0)[0]


def _texts(templates: Iterable[str], rng: random.Random) -> list[str]:
    return [_fill(t, _slots(rng), rng) for t in templates for _ in range(FILLINGS)]


def _with_topic(templates: Iterable[str], rng: random.Random) -> list[str]:
    out = []
    for t in templates:
        for _ in range(FILLINGS):
            slots = _slots(rng)
            slots["topic"] = P.TOPICS[rng.choice(list(P.TOPICS))].format(**slots)
            out.append(_fill(t, slots, rng))
    return out


def _rate(texts: list[str], test: Callable[[str], bool]) -> str:
    hits = sum(test(t) for t in texts)
    return f"{hits}/{len(texts)} ({hits / max(len(texts), 1):.0%})"


@dataclass
class Bank:
    promises: list[tuple[str, dict[str, str], str]]  # (topic, slots, text)
    fulfilments: list[tuple[str, str, dict[str, str], str]]  # (topic, role, slots, template)
    chases: list[str]  # templates with {topic}
    others: dict[str, list[str]]  # negatives by kind, filled
    states: dict[str, list[str]]  # order-state templates by state, unfilled


def _bank(which: Half, rng: random.Random) -> Bank:
    half: P.Half = "B" if which == "B" else "A"
    own_promises = {k: P.half(v, half) for k, v in P.PROMISES.items()}
    own_fulfilments = {k: P.half(v, half) for k, v in P.FULFILMENTS.items()}
    if which == "C":
        own_promises, own_fulfilments = FRESH_PROMISES, FRESH_FULFILMENTS
    elif which == "D":
        own_promises, own_fulfilments = FRESH_PROMISES_D, FRESH_FULFILMENTS_D
    promises = [
        (topic, slots, _fill(t, slots, rng))
        for topic, templates in own_promises.items()
        for t in templates
        for slots in (_slots(rng) for _ in range(FILLINGS))
    ]
    fulfilments: list[tuple[str, str, dict[str, str], str]] = [
        (topic, role, {}, t)
        for topic, templates in own_fulfilments.items()
        for role, t in templates
    ]
    small = [t for ts in P.SMALL_TALK.values() for t in P.half(ts, half)]
    states = [t for ts in P.STATES.values() for _, t in P.half(ts, half)]
    pending = [t for k in PENDING_STATES for _, t in P.half(P.STATES[k], half)]
    questions = [t for ts in P.QUESTIONS.values() for t in P.half(ts, half)]
    others = {
        "chases": _with_topic(P.half(P.CHASES, half), rng),
        "chase replies": _texts(P.half(P.CHASE_REPLIES, half), rng),
        "requests": _texts(P.half(P.REQUESTS, half), rng),
        "small talk": _texts(small, rng),
        "states": _texts(states, rng),
        "pending states": _texts(pending, rng),
        "questions": _with_topic(questions, rng),
        "enquiries": _texts(P.half(P.ENQUIRIES, half), rng),
        "follow-up replies": _texts(P.half(P.FOLLOW_UP_REPLIES, half), rng),
        "one-offs": _texts([t for ts in P.ONE_OFFS.values() for t in P.half(ts, half)], rng),
    }
    by_state = {k: [t for _, t in P.half(ts, half)] for k, ts in P.STATES.items()}
    return Bank(promises, fulfilments, list(P.half(P.CHASES, half)), others, by_state)


# The order state that is the promised act itself (a refund promise kept by "refunded").
_SAME_ACT = {"refund": ("refunded",)}
SAME_PRODUCT_ROWS = 4


def _same_product(bank: Bank, topic: str, slots: dict[str, str], rng: random.Random) -> list[str]:
    """Other events of the promise's own product, as the order's story tells them: the same
    product, weekdays and amounts of their own (an order's amount is not the promise's)."""
    kinds = [k for k in bank.states if k not in _SAME_ACT.get(topic, ())]
    out = []
    for _ in range(SAME_PRODUCT_ROWS):
        kind = rng.choice(kinds)
        own = {**_slots(rng), "product": slots["product"], "part": slots["part"]}
        own["what"] = rng.choice((f"the {own['product']}", f"my {own['product']}"))
        out.append(_fill(rng.choice(bank.states[kind]), own, rng))
    return out


def _recognisers(bank: Bank, rng: random.Random, *, show: bool) -> None:
    promise_texts = [text for _, _, text in bank.promises]
    done_texts = [_fill(t, _slots(rng), rng) for _, _, _, t in bank.fulfilments for _ in "abcd"]
    print(f"  is_promise recall on PROMISES: {_rate(promise_texts, _agent_promise)}")
    fulfil_fp = [
        _fill(t, _slots(rng), rng)
        for _, role, _, t in bank.fulfilments
        for _ in range(FILLINGS)
        if role == "assistant"
    ]
    print(f"  is_promise FP on FULFILMENTS (agent side): {_rate(fulfil_fp, _agent_promise)}")
    for kind, texts in bank.others.items():
        role_test = _agent_promise if kind in _AGENT_KINDS else _any_promise
        print(f"  is_promise FP on {kind}: {_rate(texts, role_test)}")
    print(f"  reports_done recall on FULFILMENTS: {_rate(done_texts, reports_done)}")
    for kind in ("chases", "pending states", "questions", "enquiries", "requests"):
        print(f"  reports_done FP on {kind}: {_rate(bank.others[kind], reports_done)}")
    print(f"  reports_done FP on PROMISES: {_rate(promise_texts, reports_done)}")
    if show:  # development halves only: half B is measured, never read
        _show_misses(bank, promise_texts, done_texts)


def _show_misses(bank: Bank, promise_texts: list[str], done_texts: list[str]) -> None:
    for text in promise_texts:
        if not _agent_promise(text):
            print(f"    missed promise: {text}")
    for text in done_texts:
        if not reports_done(text):
            print(f"    missed done: {text}")
    for kind in ("chases", "pending states"):
        for text in bank.others[kind]:
            if reports_done(text):
                print(f"    done FP ({kind}): {text}")
    for kind, texts in bank.others.items():
        for text in texts:
            if (_agent_promise if kind in _AGENT_KINDS else _any_promise)(text):
                print(f"    promise FP ({kind}): {text}")


# Agent-side lists are read as the agent; lists with both sides as either (the worst case).
_AGENT_KINDS = frozenset(("chase replies", "follow-up replies"))


def _agent_promise(text: str) -> bool:
    return is_promise(text, "assistant")


def _any_promise(text: str) -> bool:
    return is_promise(text, "assistant") or is_promise(text, "user")


def _pairing(
    bank: Bank, rng: random.Random, encode: Callable[[list[str]], np.ndarray], *, show: bool
) -> None:
    outcomes = {"true": 0, "chase": 0, "other topic": 0, "other turn": 0, "none": 0}
    absent = {"none": 0, "chase": 0, "other topic": 0, "other turn": 0}
    own: list[float] = []
    foreign: list[float] = []
    same_rng = random.Random(SEED + 1)  # its own draws: the figures above stay comparable
    same_act = {"none": 0, "same product": 0, "other": 0}
    same_with_true = {"true": 0, "same product": 0, "other": 0, "none": 0}
    for topic, slots, promise in bank.promises:
        true = _fill(rng.choice([t for tp, _, _, t in bank.fulfilments if tp == topic]), slots, rng)
        rows: list[tuple[str, str]] = [(true, "true")]
        topic_text = P.TOPICS[topic].format(**slots)
        for chase in rng.sample(bank.chases, 2):
            rows.append((_fill(chase, {**slots, "topic": topic_text}, rng), "chase"))
        for other, _, _, t in rng.sample(bank.fulfilments, 4):
            if other != topic:
                rows.append((_fill(t, _slots(rng), rng), "other topic"))
        for kind in ("small talk", "one-offs", "states", "requests"):
            rows.append((rng.choice(bank.others[kind]), "other turn"))
        rng.shuffle(rows)
        texts = [promise] + [t for t, _ in rows]
        vectors = encode(texts)
        done = np.array([False] + [reports_done(t) for t in texts[1:]])
        found = fulfilment(0, list(range(1, len(texts))), vectors, done, texts)
        outcome = "none" if found is None else rows[found - 1][1]
        outcomes[outcome] += 1
        # The same turns without the true one: a promise not kept yet must stay open.
        true_row = 1 + [kind for _, kind in rows].index("true")
        rest = [i for i in range(1, len(texts)) if i != true_row]
        wrong = fulfilment(0, rest, vectors, done, texts)
        absent["none" if wrong is None else rows[wrong - 1][1]] += 1
        if show and wrong is not None:
            print(f"    absent true, pairs: {promise!r} -> {texts[wrong]!r}")
        if show and outcome != "true":
            got = "-" if found is None else texts[found]
            print(
                f"    {outcome}: {promise!r} -> {got!r} (true: {true!r}, done={reports_done(true)})"
            )
        # Without the true turn, with the product's other events: a delivery of the bookcase
        # does not keep "a driver will come for the bookcase".
        product_rows = _same_product(bank, topic, slots, same_rng)
        extra = [t for i, t in enumerate(texts) if i != true_row] + product_rows
        first_product = len(extra) - len(product_rows)
        ex_vectors = encode(extra)
        ex_done = np.array([False] + [reports_done(t) for t in extra[1:]])
        paired = fulfilment(0, list(range(1, len(extra))), ex_vectors, ex_done, extra)
        same_act[
            "none" if paired is None else "same product" if paired >= first_product else "other"
        ] += 1
        if show and paired is not None and paired >= first_product:
            print(f"    same product, other act: {promise!r} -> {extra[paired]!r}")
        # ... and with the true turn among them, it is still the one found
        both = [*texts, *product_rows]
        b_vectors = encode(both)
        b_done = np.array([False] + [reports_done(t) for t in both[1:]])
        paired = fulfilment(0, list(range(1, len(both))), b_vectors, b_done, both)
        same_with_true[
            "none"
            if paired is None
            else "true"
            if paired == true_row
            else "same product"
            if paired >= len(texts)
            else "other"
        ] += 1
        for i, (_, kind) in enumerate(rows, start=1):
            cosine = float(vectors[i] @ vectors[0])
            if kind == "true":
                own.append(cosine)
            elif kind == "other topic":
                foreign.append(cosine)
    n = len(bank.promises)
    print(
        f"  fulfilment (min_cosine={MIN_COSINE}, with evidence {MIN_COSINE_WITH_EVIDENCE})"
        f" over {n} promises:"
    )
    for kind, count in outcomes.items():
        print(f"    returns {kind}: {count}/{n} ({count / n:.0%})")
    print("  fulfilment with the true turn left out (should stay open):")
    for kind, count in absent.items():
        print(f"    returns {kind}: {count}/{n} ({count / n:.0%})")
    print(
        f"  fulfilment without the true turn, {SAME_PRODUCT_ROWS} events of the same product"
        " but another act added (should stay open):"
    )
    for kind, count in same_act.items():
        print(f"    returns {kind}: {count}/{n} ({count / n:.0%})")
    print("  fulfilment with the true turn and the same-product events:")
    for kind, count in same_with_true.items():
        print(f"    returns {kind}: {count}/{n} ({count / n:.0%})")
    q = (0.0, 0.1, 0.5, 0.9, 1.0)
    print(f"    cosine to own fulfilment, quantiles {q}: {np.quantile(own, q).round(2)}")
    print(f"    cosine to other topics' done turns: {np.quantile(foreign, q).round(2)}")


def main() -> None:
    from memstream.settings import Settings
    from stores.encoder import OnnxEncoder

    enc = OnnxEncoder.from_settings(Settings().encoder)

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(enc.encode(texts), dtype=np.float32)

    halves: tuple[Half, ...] = ("A", "B", "C", "D")
    for half in halves:
        rng = random.Random(SEED)
        bank = _bank(half, rng)
        print(f"== half {half}")
        _recognisers(bank, rng, show=half != "B")
        _pairing(bank, rng, encode, show=half != "B")


if __name__ == "__main__":
    main()
