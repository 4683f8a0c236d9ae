"""``memory.formulaic``: a line said word for word in another of a user's sessions too."""

from __future__ import annotations

import numpy as np

from memstream.memory.formulaic import formulaic, line_key


def rows(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.intp)


TEXTS = [
    "Hi, I need a hand with something.",
    "hi i need a hand with something",  # the same words: case and punctuation aside
    "Please leave it with the neighbour.",
    "Please don't leave it with the neighbour.",  # a negation is another line
    "Any news?",
    "Any news?",
]
KEYS = np.array([line_key(t) for t in TEXTS], dtype=np.int64)
SESSIONS = ["s1", "s2", "s1", "s2", "s3", "s3"]
EVERYTHING = rows(*range(len(TEXTS)))


def test_a_line_said_word_for_word_in_another_session_too_is_formulaic() -> None:
    found = formulaic(rows(0, 1, 2, 3, 4), EVERYTHING, KEYS, SESSIONS)
    # rows 2-3 differ by a negation; row 4 is repeated in its own session only
    assert found.tolist() == [True, True, False, False, False]


def test_only_the_rows_compared_with_count() -> None:
    assert formulaic(rows(0), rows(0), KEYS, SESSIONS).tolist() == [False]
    assert formulaic(rows(), EVERYTHING, KEYS, SESSIONS).tolist() == []
    assert formulaic(rows(0), rows(), KEYS, SESSIONS).tolist() == [False]
