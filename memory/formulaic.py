"""Formulaic turns: what a user's chats say session after session says nothing about any one.

An opener ("Hi, I need a hand with something"), a bot's greeting or sign-off, "is that
everything for now?": such a line comes back, in the same words or nearly, in many of the
user's sessions. Whatever its wording, that recurrence is what makes it formulaic -- no list
of phrases is needed, and a typo ("Hi thre") does not hide it, since it is measured on the
turns' vectors. A turn naming an entity, pinned or promising something is never formulaic
(the caller leaves those out): a customer repeating their order number is recurrence itself.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# all-MiniLM-L6-v2: the same opener with a typo or a changed word 0.9+; two different
# requests about one order rarely above 0.85.
SAME_LINE_COSINE = 0.9
OTHER_SESSIONS = 1  # said in another session of the user too: formulaic


def formulaic(
    rows: npt.NDArray[np.intp],
    against: npt.NDArray[np.intp],
    vectors: npt.NDArray[np.float32],
    sessions: Sequence[str],
) -> npt.NDArray[np.bool_]:
    """For each of ``rows``, whether a turn as close as ``SAME_LINE_COSINE`` was said in at
    least ``OTHER_SESSIONS`` other sessions among the ``against`` rows (``sessions[row]``:
    its session)."""
    out = np.zeros(len(rows), dtype=bool)
    if not len(rows) or not len(against):
        return out
    close = vectors[rows] @ vectors[against].T >= SAME_LINE_COSINE
    for i, row in enumerate(rows.tolist()):
        own = sessions[row]
        others = {sessions[j] for j in against[close[i]].tolist()} - {own}
        out[i] = len(others) >= OTHER_SESSIONS
    return out
