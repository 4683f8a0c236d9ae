"""The customer's standing attributes: which turn states which, and the newest read first.

Asked "how do we reach this customer?", a support bot needs the *current* phone, address,
delivery instruction or contact preference: the newest statement of it, whatever its words,
though it rarely shares words with the question ("Noted that we should call me after six":
cosine 0.06 to "how does the customer like to get updates?"). So each turn is marked with
the attribute it states:

- by the value's shape where the value has one: an email address, a phone number, a postal
  code (``memory.text``);
- by meaning for standing instructions, which have no shape: the turn's vector is close to
  exemplars of delivery instructions or of contact preferences (written here, in our own
  words), and it is neither a question nor a promise (a one-off commitment, not a standing
  arrangement).

At query time (``lift_attributes``, from ``memory.candidates``), when the question's best
turns include statements of an attribute, the newest statements of that attribute are lifted
to the best one's relevance; turns are listed newest first, so the current value is read
before the ones it replaced. Pure: the caller embeds the exemplars once with the encoder
that embeds turns (``LabelledRows.build(EXEMPLARS, encode)``, in ``memory.turns.Exemplars``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memstream.memory.promises import is_promise
from memstream.memory.text import has_postal_code
from memstream.memory.vectors import FloatArray, LabelledRows
from memstream.schemas import StoredTurn

ATTRIBUTES = ("email", "phone", "address", "delivery", "contact")
NO_ATTRIBUTE = -1
# all-MiniLM-L6-v2: a standing instruction in other words is 0.45-0.7 from its nearest
# exemplar; order news and chit-chat mostly below 0.45 (bench: an attribute lab on generated
# support chats, development half).
MIN_COSINE = 0.45
SEEDS = 20  # the question's best turns looked at for the attributes it is about
NEWEST = 3  # statements of an attribute lifted: the current value and the ones it replaced

# Several wordings a kind: the nearest exemplar decides. Generic on purpose (no shop, product
# or street), so what is close to them is close by what it arranges.
EXEMPLARS: dict[str, tuple[str, ...]] = {
    "delivery": (
        "If nobody answers, the courier can put the box in my garage.",
        "Please leave deliveries at the front desk of our building.",
        "Drivers should knock loudly, the bell is broken.",
        "Leave my packages under the stairs by the door.",
        "Next time, drop it with the concierge downstairs.",
        "Your delivery note now says to use the side entrance.",
        "Can couriers put parcels in the green box by the gate?",
        "I'd like future deliveries left in the carport.",
        "Please don't leave parcels on the doorstep any more, take them to the post office.",
        "The driver should ring my flatmate if I'm not home.",
    ),
    "contact": (
        "Please only contact me by email, I can't take calls at work.",
        "Send me a text instead of ringing.",
        "You can call me, but only in the mornings.",
        "I prefer messages on Signal rather than phone calls.",
        "Don't phone me before noon please.",
        "We'll contact you by letter from now on, as you asked.",
        "Our note says to email you rather than call.",
        "Reach me by SMS, I rarely check my inbox.",
        "Ring my landline in the evenings, not the mobile.",
        "I'd like updates by WhatsApp message only.",
    ),
}
# What a question about each attribute sounds like (our own words, generic): a question
# rarely shares a word with the statement it is about ("how do we reach them by phone?" /
# "I've swapped your number for 07515 870389"), so its best turns may hold no statement of
# the attribute at all; asked by meaning, the attribute's newest statements are lifted.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "email": (
        "What email address do we have for them?",
        "Where do we send emails to this person?",
        "Which inbox should the confirmation go to?",
        "What is the email on their account?",
        "Do we have an email for the customer?",
        "What address do we write to by email?",
    ),
    "phone": (
        "What is their phone number?",
        "Which number do we call or text?",
        "Do we have a mobile number on file?",
        "What number can we ring them on?",
        "What's the contact number for this customer?",
        "Which phone should the driver call?",
    ),
    "address": (
        "Where do we send their orders?",
        "What is the shipping address on file?",
        "Where does this person live?",
        "Which address should the parcel go to?",
        "What's their street and postcode?",
        "Where are deliveries addressed to now?",
    ),
    "delivery": (
        "Where should the driver leave the package?",
        "Are there any delivery instructions?",
        "What should the courier do when nobody answers?",
        "Is there a safe place for parcels?",
        "How do they want parcels delivered?",
        "What does the delivery note say?",
    ),
    "contact": (
        "How would they like us to contact them?",
        "Should we call, text or email them?",
        "What's their preferred way of getting updates?",
        "When is it okay to call them?",
        "Which channel do they want us to use?",
        "Do they have a contact preference?",
    ),
}
# A question this close to its nearest question exemplar asks about that attribute.
MIN_QUESTION_COSINE = 0.6
_SENTENCE_END = re.compile(r"(?<=[.!])\s+")
_QUESTION_WORDS = frozenset(
    [
        "what",
        "where",
        "when",
        "why",
        "how",
        "which",
        "who",
        "whom",
        "whose",
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "any",
        "anything",
    ]
)


def attributes_of(
    turns: Sequence[StoredTurn], vectors: FloatArray, prototypes: LabelledRows | None
) -> npt.NDArray[np.int8]:
    """The attribute each turn states (an index into ``ATTRIBUTES``, ``NO_ATTRIBUTE`` if none);
    ``vectors``: the turns' unit rows; without prototypes only the shaped values count."""
    out = np.full(len(turns), NO_ATTRIBUTE, dtype=np.int8)
    if not len(turns):
        return out
    nearest = kind = None
    if prototypes is not None and len(prototypes.vectors):
        cosines = np.asarray(vectors, np.float32) @ prototypes.vectors.T
        best = cosines.argmax(axis=1)
        kinds = np.asarray([ATTRIBUTES.index(label) for label in prototypes.labels], np.int8)
        nearest, kind = cosines.max(axis=1), kinds[best]
    for i, turn in enumerate(turns):
        if _asks(turn.text):
            continue
        keys = turn.entities
        if any(k.startswith("email:") for k in keys):
            out[i] = ATTRIBUTES.index("email")
        elif any(k.startswith("phone:") for k in keys):
            out[i] = ATTRIBUTES.index("phone")
        elif has_postal_code(turn.text):
            out[i] = ATTRIBUTES.index("address")
        elif (
            nearest is not None
            and kind is not None
            and nearest[i] >= MIN_COSINE
            and not keys
            and not is_promise(turn.text, turn.role)
        ):
            out[i] = kind[i]
    return out


def asked_attribute(vector: FloatArray, questions: LabelledRows | None) -> int:
    """The attribute a question asks about by meaning (an index into ``ATTRIBUTES``):
    that of its nearest question exemplar, when at least ``MIN_QUESTION_COSINE`` close;
    else ``NO_ATTRIBUTE``. ``vector``: the question's unit row."""
    if questions is None or not len(questions.vectors):
        return NO_ATTRIBUTE
    cosines = questions.vectors @ np.asarray(vector, np.float32)
    best = int(cosines.argmax())
    if float(cosines[best]) < MIN_QUESTION_COSINE:
        return NO_ATTRIBUTE
    return ATTRIBUTES.index(questions.labels[best])


def lift_attributes(
    relevance: npt.NDArray[np.float64],
    attribute: npt.NDArray[np.int8],
    ts: npt.NDArray[np.float64],
    asked: int = NO_ATTRIBUTE,
) -> npt.NDArray[np.float64]:
    """``relevance`` (of candidate turns) with, for each attribute stated among the best
    ``SEEDS``, its ``NEWEST`` statements raised to that attribute's best relevance there;
    and those of the attribute the question asks about (``asked_attribute``) raised to the
    best relevance of all, whether or not the best turns state it."""
    out = relevance.copy()
    if not len(out) or not (attribute >= 0).any():
        return out
    seeds = np.argsort(-relevance, kind="stable")[:SEEDS]
    lifts = {
        a: float(relevance[seeds][attribute[seeds] == a].max())
        for a in np.unique(attribute[seeds]).tolist()
        if a >= 0
    }
    if asked >= 0:
        lifts[asked] = float(relevance.max())
    for a, best in lifts.items():
        stating = np.flatnonzero(attribute == a)
        newest = stating[np.argsort(-ts[stating], kind="stable")[:NEWEST]]
        out[newest] = np.maximum(out[newest], best)
    return out


def _asks(text: str) -> bool:
    """A question about something ("What's my delivery address?"), not a request phrased as
    one ("Could you leave it with the neighbour?")."""
    last = _SENTENCE_END.split(text.strip())[-1]
    if not last.endswith("?"):
        return False
    first = last.lower().split(maxsplit=1)[0] if last else ""
    return first.split("'")[0].strip(",;:") in _QUESTION_WORDS
