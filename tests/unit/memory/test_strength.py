"""Strength: boost per use, decay per whole interval, floor, idempotent under replays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memstream.memory.strength import StrengthParams, boost_all, boosted, decayed, initial_strength
from memstream.schemas import ConsolidatedMemory

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)
PARAMS = StrengthParams()


def memory_factory(strength: float = 1.0, memory_id: str = "m1") -> ConsolidatedMemory:
    return ConsolidatedMemory(
        title="Order A-1",
        memory_id=memory_id,
        tenant_id="acme",
        user_id="u1",
        key="entity:order:A-1",
        strength=strength,
        created_at=T0,
        updated_at=T0,
    )


def test_initial_strength_weights_score_by_importance_with_a_floor() -> None:
    assert initial_strength(2.0, 0.5, PARAMS) == pytest.approx(2.0)
    assert initial_strength(2.0, 1.0, PARAMS) == pytest.approx(3.0)
    assert initial_strength(2.0, 0.0, PARAMS) == pytest.approx(1.0)
    assert initial_strength(0.01, 0.0, PARAMS) == PARAMS.floor


def test_a_use_multiplies_by_1_2_once_per_feedback_id() -> None:
    once = boosted(memory_factory(), "f1", PARAMS)
    assert once.strength == pytest.approx(1.2)
    assert boosted(once, "f1", PARAMS) is once  # a redelivered message changes nothing
    twice = boosted(once, "f2", PARAMS)
    assert twice.strength == pytest.approx(1.44)
    assert twice.feedback_ids == ["f1", "f2"]


def test_remembered_feedback_ids_are_bounded_newest_kept() -> None:
    params = StrengthParams(remembered_feedback=3)
    memory = memory_factory()
    for i in range(5):
        memory = boosted(memory, f"f{i}", params)
    assert memory.feedback_ids == ["f2", "f3", "f4"]
    assert memory.strength == pytest.approx(1.2**5)


def test_decay_counts_whole_intervals_and_a_repeated_run_changes_nothing() -> None:
    memory = memory_factory()
    assert decayed(memory, T0 + DAY - timedelta(seconds=1), PARAMS) is memory
    after = decayed(memory, T0 + 3 * DAY + timedelta(hours=5), PARAMS)
    assert after.strength == pytest.approx(0.99**3)
    assert after.decayed_to == T0 + 3 * DAY
    again = decayed(after, T0 + 3 * DAY + timedelta(hours=6), PARAMS)
    assert again is after  # same interval: nothing more to apply
    # Split runs decay exactly like one run over the same time.
    stepwise = decayed(decayed(memory, T0 + DAY, PARAMS), T0 + 3 * DAY, PARAMS)
    assert stepwise.strength == pytest.approx(after.strength)


def test_decay_never_goes_below_the_floor_nor_runs_backwards() -> None:
    memory = memory_factory(strength=0.11)
    assert decayed(memory, T0 + 400 * DAY, PARAMS).strength == PARAMS.floor
    assert decayed(memory, T0 - 5 * DAY, PARAMS) is memory


def test_boost_all_returns_only_what_changed() -> None:
    seen = boosted(memory_factory(memory_id="a"), "f1", PARAMS)
    fresh = memory_factory(memory_id="b")
    changed = boost_all([seen, fresh], "f1", PARAMS)
    assert [m.memory_id for m in changed] == ["b"]


@pytest.mark.parametrize(
    "kwargs",
    [{"boost": 0.9}, {"decay": 0.0}, {"decay": 1.5}, {"floor": 0.0}, {"interval_s": 0.0}],
)
def test_params_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        StrengthParams(**kwargs)  # type: ignore[arg-type]
