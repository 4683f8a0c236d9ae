"""Formulaic turns: what a user's chats say session after session says nothing about any one.

An opener ("Hi, I need a hand with something"), a bot's greeting or sign-off, "is that
everything for now?": such a line comes back word for word in several of the user's
sessions. That recurrence, whatever the words, is what makes it formulaic; no list of
phrases is needed. Word for word, not "close in meaning": a sentence and its negation
("please leave it with the neighbour" / "please don't ...") are 0.97 alike for the encoder,
and a status that changed one word ("order status: shipped" / "... delivered") 0.82. A turn
naming an entity, pinned or promising something is never formulaic (the caller leaves those
out): a customer repeating their order number is recurrence itself. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memstream.memory.phrases import norm

OTHER_SESSIONS = 1  # said word for word in this many other sessions of the user: formulaic


def line_key(text: str) -> int:
    """A turn's words, case and punctuation aside, as one number to compare (the RPC's
    turn index keeps it per turn; equal texts, equal keys, within a process)."""
    return hash(norm(text))


def formulaic(
    rows: npt.NDArray[np.intp],
    against: npt.NDArray[np.intp],
    line_keys: npt.NDArray[np.int64],
    sessions: Sequence[str],
) -> npt.NDArray[np.bool_]:
    """For each of ``rows``, whether its words (``line_keys[row]``) were said in at least
    ``OTHER_SESSIONS`` other sessions among the ``against`` rows (``sessions[row]``: its
    session)."""
    out = np.zeros(len(rows), dtype=bool)
    if not len(rows) or not len(against):
        return out
    keys = line_keys[against]
    for i, row in enumerate(rows.tolist()):
        same = against[keys == line_keys[row]].tolist()
        others = {sessions[j] for j in same} - {sessions[row]}
        out[i] = len(others) >= OTHER_SESSIONS
    return out
