"""Unit vectors and cosine similarity, the only geometry the rest of ``memory`` needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]


def normalize(v: npt.ArrayLike) -> FloatArray:
    """Scale to unit L2 norm as float32: one vector (1-d) or each row (2-d).

    A zero vector (or row) stays zero rather than becoming NaN: it has no direction, and a
    NaN would silently poison every centroid it touched.
    """
    a = np.asarray(v, dtype=np.float32)
    if a.ndim == 1:
        norm = float(np.linalg.norm(a))
        return (a / norm).astype(np.float32) if norm > 0.0 else a.copy()
    if a.ndim == 2:
        norms = np.linalg.norm(a, axis=1, keepdims=True)
        safe = np.where(norms > 0.0, norms, np.float32(1.0))
        scaled: FloatArray = (a / safe).astype(np.float32)
        return scaled
    raise ValueError(f"normalize expects a 1-d or 2-d array, got {a.ndim}-d")


def cosine_to_rows(v: npt.ArrayLike, rows: npt.ArrayLike) -> FloatArray:
    """Cosine of unit vector ``v`` to each unit row of ``rows`` (n, d) -> (n,) float32.

    Both sides must already be unit-norm (that is the caller's contract, and it makes this a
    single matrix-vector product). Results are clipped to [-1, 1] because float32 rounding can
    land a hair outside, which would break threshold comparisons at exactly 1.0.
    """
    r = np.asarray(rows, dtype=np.float32)
    if r.size == 0:
        return np.zeros(0, dtype=np.float32)
    q = np.asarray(v, dtype=np.float32)
    if r.ndim != 2 or q.ndim != 1 or r.shape[1] != q.shape[0]:
        raise ValueError(f"shape mismatch: vector {q.shape} against rows {r.shape}")
    return np.clip(r @ q, -1.0, 1.0).astype(np.float32)


def mean_direction(rows: npt.ArrayLike) -> FloatArray:
    """The unit mean of unit rows (n, d) -> (d,): the direction a set of texts shares.

    Summed in float64 row by row (numpy adds along axis 0 element-wise, in row order), so the
    result is the same bytes on every CPU for the same rows in the same order.
    """
    r = np.asarray(rows, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] == 0:
        raise ValueError(f"mean_direction expects a non-empty (n, d) array, got shape {r.shape}")
    return normalize(r.sum(axis=0))


@dataclass(frozen=True)
class LabelledRows:
    """Exemplar sentences as unit rows, embedded by the encoder that embeds the turns, and
    the label each row stands for: what a turn is compared with by meaning (an attribute it
    states, an act it reports)."""

    vectors: FloatArray = field(repr=False)  # (n, d)
    labels: tuple[str, ...] = field(repr=False)  # per row

    @classmethod
    def build(
        cls, exemplars: Mapping[str, Sequence[str]], encode: Callable[[Sequence[str]], FloatArray]
    ) -> LabelledRows:
        texts = [text for said in exemplars.values() for text in said]
        labels = tuple(label for label, said in exemplars.items() for _ in said)
        return cls(np.asarray(encode(texts), np.float32), labels)
