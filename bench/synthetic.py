"""Labelled synthetic chat streams for the clustering benchmark: every turn knows its topic.

Twelve topics of a fictional shop's customers (a late parcel, a refund, a password reset,
...), each written as several paraphrase templates with slots (products, amounts, dates).
Each topic *drifts*: its templates come in two stages (e.g. "my parcel is late" ->
"the courier says it was delivered but it wasn't"), and a user's later turns on the topic
use the later stage, still labelled with the same topic. Between them come noise turns
("thanks", "ok, one moment") labelled ``NOISE``, which the benchmark leaves out of the
scores (they belong to no topic). Users talk about five to eight of the topics, in sessions
of one or two topics each, interleaved. The same ``(users, turns_per_user, seed)`` always
gives the same stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NOISE = "noise"

PRODUCTS = ("kettle", "blender", "desk lamp", "air fryer", "vacuum cleaner", "tea set")
AMOUNTS = ("12.99", "49.00", "89.50", "120.00", "34.75")
DATES = ("Monday", "last Friday", "the 3rd", "two weeks ago", "yesterday")

# topic -> (stage 1 paraphrases, stage 2 paraphrases). Slots: {product} {amount} {date}.
TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "late_delivery": (
        (
            "My {product} order still hasn't arrived, it was supposed to come {date}.",
            "Where is my parcel with the {product}? It's very late.",
            "The delivery of my {product} is overdue, tracking hasn't moved.",
            "I'm still waiting for the {product} I ordered, shipping seems stuck.",
        ),
        (
            "The courier marked my {product} parcel as delivered but I never got it.",
            "Tracking says delivered {date} but there is no package at my door.",
            "My parcel shows delivered yet nothing arrived, can you check with the courier?",
        ),
    ),
    "refund": (
        (
            "I returned the {product} and want my {amount} refunded.",
            "When will I get my money back for the returned {product}?",
            "Please refund the {amount} for the {product} I sent back.",
            "I'm asking for a refund on my {product} return.",
        ),
        (
            "The refund of {amount} still hasn't reached my bank account.",
            "You said the refund was processed {date} but my card shows nothing.",
            "My bank has no record of the {amount} refund you issued.",
        ),
    ),
    "password": (
        (
            "I can't log in, my password doesn't work anymore.",
            "How do I reset my account password?",
            "The login page says my password is wrong.",
            "I forgot my password and can't get into my account.",
        ),
        (
            "The password reset email never arrives in my inbox.",
            "I clicked reset password but the link says it expired.",
            "Still locked out, the reset link from {date} is invalid.",
        ),
    ),
    "damaged_item": (
        (
            "The {product} arrived broken, the box was crushed.",
            "My new {product} is damaged, there's a crack in it.",
            "The {product} came with a shattered part.",
            "I received a defective {product}, it's cracked.",
        ),
        (
            "Can you send a replacement for the broken {product}?",
            "I'd like a new {product} instead of the damaged one.",
            "Please ship me a replacement, the {product} can't be used.",
        ),
    ),
    "subscription": (
        (
            "I want to cancel my monthly subscription.",
            "How can I stop the subscription renewing every month?",
            "Please end my membership plan.",
            "I no longer want the premium subscription.",
        ),
        (
            "I cancelled the subscription but was still charged {amount} this month.",
            "You billed my subscription again after I cancelled it.",
            "Why was my cancelled membership renewed {date}?",
        ),
    ),
    "address_change": (
        (
            "I moved, please update my shipping address.",
            "I need to change the delivery address on my account.",
            "Can you send future orders to my new home address?",
            "My address is wrong, I have a new flat now.",
        ),
        (
            "My order still went to the old address even though I updated it.",
            "The parcel was shipped to my previous flat, not the new address.",
            "You ignored my address change and sent it to the old place.",
        ),
    ),
    "double_charge": (
        (
            "I was charged twice for the same order, {amount} two times.",
            "My card shows a duplicate payment of {amount}.",
            "You took the payment twice for my {product}.",
            "There are two identical charges on my credit card statement.",
        ),
        (
            "My bank says the second charge is still pending, please reverse it.",
            "The duplicate charge of {amount} hasn't been reversed yet.",
            "Can you confirm you voided the extra payment from {date}?",
        ),
    ),
    "product_question": (
        (
            "Is the {product} dishwasher safe?",
            "What is the warranty on the {product}?",
            "Does the {product} come with a plug for Europe?",
            "How much power does the {product} use?",
        ),
        (
            "Which spare parts are available for the {product}?",
            "Can I buy a replacement filter for the {product}?",
            "Do you sell accessories that fit the {product}?",
        ),
    ),
    "discount_code": (
        (
            "My discount code doesn't work at checkout.",
            "The promo code says it is invalid.",
            "I entered the voucher but no discount was applied.",
            "Why is my coupon code rejected?",
        ),
        (
            "Can you apply the 20% discount to my past order manually?",
            "I paid full price because the voucher failed, please credit the difference.",
            "The coupon expired {date}, can you extend it?",
        ),
    ),
    "loyalty_points": (
        (
            "How many loyalty points do I have?",
            "My reward points are missing from my account.",
            "I didn't get bonus points for my last purchase.",
            "Where can I see my points balance?",
        ),
        (
            "Can I use my loyalty points to pay for the {product}?",
            "How do I redeem my reward points at checkout?",
            "The points discount was not applied to my order.",
        ),
    ),
    "invoice": (
        (
            "I need an invoice for my {product} purchase.",
            "Please send me a VAT invoice for order of {amount}.",
            "Where can I download the receipt for my order?",
            "My company needs a proper invoice with our tax number.",
        ),
        (
            "The invoice has the wrong company name on it.",
            "Please correct the VAT number on my invoice.",
            "The billing address on the receipt is incorrect.",
        ),
    ),
    "store_hours": (
        (
            "What time does your Berlin store open on Saturday?",
            "Are your shops open on public holidays?",
            "When does the store close today?",
            "What are the opening hours of the city centre shop?",
        ),
        (
            "Can I pick up my online order in the store?",
            "Is click and collect available at your shop?",
            "How long do you hold an order for in-store pickup?",
        ),
    ),
}
NOISE_TURNS = (
    "thanks",
    "ok, one moment please",
    "hello",
    "great, thank you so much",
    "hi there",
    "sure",
    "bye",
    "let me check",
)


@dataclass(frozen=True)
class LabelledTurn:
    user_id: str
    session: int
    index: int  # position in the user's stream
    text: str
    topic: str  # NOISE for noise turns
    ts: float  # seconds since the stream's start

    @property
    def event_id(self) -> str:
        return f"{self.user_id}:{self.index}"


def generate(
    users: int = 6, turns_per_user: int = 120, *, seed: int = 7, noise_share: float = 0.15
) -> list[LabelledTurn]:
    """Users' streams, each in time order, users one after another."""
    rng = random.Random(seed)
    out: list[LabelledTurn] = []
    names = sorted(TOPICS)
    for u in range(users):
        user = f"u{u}"
        topics = rng.sample(names, rng.randint(5, 8))
        seen: dict[str, int] = {t: 0 for t in topics}
        ts, session, index = 0.0, 0, 0
        while index < turns_per_user:
            session += 1
            ts += rng.uniform(0.5, 5.0) * 86_400  # sessions days apart
            session_topics = rng.sample(topics, rng.choice((1, 1, 2)))
            for _ in range(rng.randint(4, 12)):
                if index >= turns_per_user:
                    break
                ts += rng.uniform(10, 120)
                if rng.random() < noise_share:
                    text, topic = rng.choice(NOISE_TURNS), NOISE
                else:
                    topic = rng.choice(session_topics)
                    seen[topic] += 1
                    stage1, stage2 = TOPICS[topic]
                    # Drift: after a few turns a topic moves on to its later stage.
                    stages = stage1 if seen[topic] <= 4 or rng.random() < 0.2 else stage2
                    text = rng.choice(stages).format(
                        product=rng.choice(PRODUCTS),
                        amount=rng.choice(AMOUNTS),
                        date=rng.choice(DATES),
                    )
                out.append(LabelledTurn(user, session, index, text, topic, ts))
                index += 1
    return out
