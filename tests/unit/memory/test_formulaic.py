"""``memory.formulaic``: a line said in many of a user's sessions is formulaic."""

from __future__ import annotations

import numpy as np

from memory.formulaic import formulaic


def rows(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.intp)


# Rows 0-3: one opener in four sessions (one with a typo: a slightly turned vector); row 4:
# a request said twice in one session; row 6 something else in another.
VECTORS = np.array(
    [
        [1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
        [0.98, 0.199, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
    ],
    dtype=np.float32,
)
SESSIONS = ["s1", "s2", "s3", "s4", "s1", "s1", "s2"]


def test_a_line_said_in_another_session_too_is_formulaic_typos_included() -> None:
    everything = rows(*range(len(SESSIONS)))
    found = formulaic(rows(0, 2, 4), everything, VECTORS, SESSIONS)
    assert found.tolist() == [True, True, False]  # row 4: repeated in its own session only


def test_only_the_rows_compared_with_count() -> None:
    assert formulaic(rows(0), rows(0), VECTORS, SESSIONS).tolist() == [False]
    assert formulaic(rows(), rows(0, 1), VECTORS, SESSIONS).tolist() == []
    assert formulaic(rows(0), rows(), VECTORS, SESSIONS).tolist() == [False]
