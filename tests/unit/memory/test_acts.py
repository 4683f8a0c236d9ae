"""``memory.acts``: the act a report describes, read from its embedding's nearest act
description -- only when near, clearly nearest, and an act without a direction."""

from __future__ import annotations

import numpy as np

from memstream.memory.acts import DESCRIPTIONS, MEANT_ACTS, NO_ACT, acts_meant
from memstream.memory.vectors import LabelledRows


def _prototypes() -> LabelledRows:
    """One axis per act (each description is its act's unit vector) and one more, off every
    description."""
    acts = list(DESCRIPTIONS)

    def encode(texts: object) -> np.ndarray:
        rows = [acts.index(a) for a, said in DESCRIPTIONS.items() for _ in said]
        return np.eye(len(acts) + 1, dtype=np.float32)[rows]

    return LabelledRows.build(DESCRIPTIONS, encode)


def _towards(*weights: tuple[str, float]) -> np.ndarray:
    acts = list(DESCRIPTIONS)
    v = np.zeros(len(acts), dtype=np.float32)
    for act, w in weights:
        v[acts.index(act)] = w
    rest = max(0.0, 1.0 - float(v @ v))
    return np.append(v, np.sqrt(rest)).astype(np.float32)  # unit: the rest off every one


def test_the_nearest_act_when_near_and_clearly_nearest() -> None:
    rows = np.stack(
        [
            _towards(("money", 0.8)),  # money
            _towards(("call", 0.7), ("voucher", 0.3)),  # a call, clearly
            _towards(("money", 0.6), ("voucher", 0.58)),  # not clearly money
            _towards(("money", 0.4)),  # not near enough
            _towards(("collect", 0.9)),  # a movement: never read by meaning
        ]
    )
    got = acts_meant(rows, _prototypes()).tolist()
    assert got == [
        MEANT_ACTS.index("money"),
        MEANT_ACTS.index("call"),
        NO_ACT,
        NO_ACT,
        NO_ACT,
    ]


def test_without_prototypes_or_rows_nothing_is_read() -> None:
    assert acts_meant(np.zeros((3, 4), np.float32), None).tolist() == [NO_ACT] * 3
    assert acts_meant(np.zeros((0, 4), np.float32), _prototypes()).tolist() == []
