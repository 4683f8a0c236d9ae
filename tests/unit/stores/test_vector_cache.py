"""The vector cache's ranking: a float32 rough pass, then the float64 order, ties by id."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memstream.stores.vector_cache import UserVectors


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> npt.NDArray[np.float32]:
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    unit: npt.NDArray[np.float32] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit


def test_top_is_the_float64_order_ties_by_id() -> None:
    rng = np.random.default_rng(7)
    rows = _unit_rows(rng, 2000, 384)
    entry = UserVectors(384)
    ids = [f"m{i:05d}" for i in range(len(rows))]
    entry.put(ids, rows, [[] for _ in ids])
    entry.put(["m99999"], rows[:1], [[]])  # the same vector as m00000: a tie, broken by id
    query = rows[0]
    exact = [(-float(s), i) for s, i in zip(rows.astype(np.float64) @ query, ids, strict=True)]
    exact.append((exact[0][0], "m99999"))
    expected = [i for _, i in sorted(exact)[:8]]
    assert [i for i, _ in entry.top(query, 8)] == expected
    assert expected[:2] == ["m00000", "m99999"]


def test_keys_follow_every_put_and_rekey() -> None:
    entry = UserVectors(2)
    x = np.array([[1, 0], [0, 1], [1, 0]], np.float32)
    entry.put(["c", "a", "b"], x, [["order:1", "sku:9"], ["order:1"], ["order:2"]])
    assert entry.with_keys(["order:1"]) == ["a", "c"]  # scroll order: by id
    assert entry.with_keys(["order:2", "sku:9", "order:404"]) == ["b", "c"]
    entry.put(["c"], x[:1], [["order:2"]])  # re-written: its old keys are gone
    assert entry.with_keys(["order:1"]) == ["a"]
    assert entry.with_keys(["sku:9"]) == []
    entry.rekey("a", [])
    assert entry.with_keys(["order:1"]) == []
    assert set(entry.ids_by_key) == {"order:2"}  # an emptied key leaves no entry
    assert entry.with_keys(["order:2"]) == ["b", "c"]
