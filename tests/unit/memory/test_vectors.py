"""``memory.vectors``: unit vectors and the mean direction a memory's vector is."""

from __future__ import annotations

import numpy as np
import pytest

from memstream.memory.vectors import mean_direction, normalize


def test_the_mean_direction_is_the_unit_mean_of_its_rows() -> None:
    rows = normalize(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert mean_direction(rows) == pytest.approx(np.array([1.0, 1.0, 0.0]) / np.sqrt(2.0))
    assert float(np.linalg.norm(mean_direction(rows))) == pytest.approx(1.0)
    assert mean_direction(rows[:1]) == pytest.approx(rows[0])


def test_the_mean_direction_is_the_same_bytes_for_the_same_rows() -> None:
    rows = normalize(np.random.default_rng(3).normal(size=(40, 384)))
    first = mean_direction(rows)
    assert first.dtype == np.float32
    assert mean_direction(rows.copy()).tobytes() == first.tobytes()


def test_opposite_rows_have_no_direction_and_no_rows_are_an_error() -> None:
    rows = np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    assert not np.any(mean_direction(rows))  # zero, not NaN
    with pytest.raises(ValueError, match="non-empty"):
        mean_direction(np.zeros((0, 4), dtype=np.float32))
