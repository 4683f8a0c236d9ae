"""What act a report describes, by meaning: the encoder's nearest act description.

A promise is kept by a report of the same act (``memory.promises``), which the grammar reads
from the report's verbs and nouns -- and misses where the words are new ("the money's
landed", "your £40 hit the card"). The turn's embedding is compared with short descriptions
of each act, and the nearest, when near enough and clearly nearer than the next, names it.

Only acts without a direction are read this way: money paid back, a voucher or credit
given, a phone call. The encoder does not tell a thing brought from a thing taken away
("the driver dropped it off" lies nearer to a collection than to a delivery), so
collections and deliveries stay the grammar's alone; their descriptions are here only so
that a report of one is not read as money by default. Pure.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memstream.memory.vectors import LabelledRows

FloatArray = npt.NDArray[np.floating]

# The acts a meaning may name, as ``memory.promises`` labels them.
MEANT_ACTS = ("money", "voucher", "call")
NO_ACT = -1
MIN_COSINE = 0.5  # to the nearest description
MIN_MARGIN = 0.05  # over the nearest description of another act

# Descriptions in plain, varied words, both sides' voices; "collect" and "goods" name no
# meant act: they only keep a movement from reading as money.
DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "money": (
        "The refund has gone back to your card.",
        "I got my money back.",
        "The payment was returned to my account.",
        "You have been reimbursed in full.",
        "The amount was credited back.",
    ),
    "voucher": (
        "The voucher code arrived by email.",
        "A gift card was sent to me.",
        "Store credit has been added to my account.",
        "I received the discount code.",
    ),
    "call": (
        "Someone phoned me back.",
        "I had a call from your team.",
        "We rang the customer.",
        "The supervisor called me.",
    ),
    "collect": (
        "The courier picked the item up from me.",
        "They collected the parcel for the return.",
        "The returned item is back in our warehouse.",
        "The driver took it away.",
    ),
    "goods": (
        "The replacement arrived.",
        "The new one was delivered.",
        "The parcel turned up today.",
    ),
}


def acts_meant(vectors: FloatArray, prototypes: LabelledRows | None) -> npt.NDArray[np.int8]:
    """Per unit row of ``vectors``, the act it describes (an index into ``MEANT_ACTS``), or
    ``NO_ACT``: none near enough, one not clearly nearer than another act, or a movement."""
    out = np.full(len(vectors), NO_ACT, dtype=np.int8)
    if prototypes is None or not len(vectors) or len(set(prototypes.labels)) < 2:
        return out  # nothing to be nearest to, or no second act to be clearly nearer than
    cosines = np.asarray(vectors, np.float32) @ prototypes.vectors.T
    kinds = sorted(set(prototypes.labels))
    per_act = np.stack(
        [
            cosines[:, [i for i, a in enumerate(prototypes.labels) if a == k]].max(axis=1)
            for k in kinds
        ],
        axis=1,
    )
    order = np.argsort(-per_act, axis=1)
    rows = np.arange(len(vectors))
    best, second = per_act[rows, order[:, 0]], per_act[rows, order[:, 1]]
    sure = (best >= MIN_COSINE) & (best - second >= MIN_MARGIN)
    for row in np.flatnonzero(sure).tolist():
        act = kinds[int(order[row, 0])]
        if act in MEANT_ACTS:
            out[row] = MEANT_ACTS.index(act)
    return out
