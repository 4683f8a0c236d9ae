"""Hot-tier expiry in event time: TTL from the user's newest event, then the per-user cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memstream.memory.hot_tier import cutoff, evictions, prefix_needed

DAY = 86_400.0


def timeline(*days: float) -> list[tuple[str, float]]:
    return [(f"e{i}", d * DAY) for i, d in enumerate(days)]


def test_age_counts_from_the_newest_event_not_the_clock() -> None:
    # Turns of 2023 stay hot however late the wall clock: only newer events age them.
    tl = timeline(0, 1, 2)
    kept = evictions(tl, 3, (), ("e3", 3 * DAY, False), 2 * DAY, 7 * DAY, 100)
    assert kept.evicted == ()
    assert kept.keep_new
    assert kept.newest == 3 * DAY
    aged = evictions(tl, 3, (), ("e3", 8.5 * DAY, False), 2 * DAY, 7 * DAY, 100)
    assert aged.evicted == ("e0", "e1")  # older than 8.5 - 7 = 1.5 days
    assert aged.keep_new


def test_a_late_turn_older_than_the_cutoff_is_not_kept_hot() -> None:
    tl = timeline(10, 11)
    late = evictions(tl, 2, (), ("old", 1 * DAY, False), 11 * DAY, 7 * DAY, 100)
    assert late.evicted == ()
    assert not late.keep_new
    assert late.newest == 11 * DAY
    pinned = evictions(tl, 2, (), ("old", 1 * DAY, True), 11 * DAY, 7 * DAY, 100)
    assert pinned.keep_new  # pinned turns never expire by age


def test_cap_drops_the_oldest_unpinned_first() -> None:
    tl = timeline(0, 1, 2, 3)
    out = evictions(tl, 4, {"e0"}, ("e4", 4 * DAY, False), 3 * DAY, 0.0, 3)
    assert out.evicted == ("e1", "e2")
    assert out.keep_new
    assert prefix_needed(4, 1, 3) == 3


def test_reapplied_event_is_not_counted_twice() -> None:
    tl = timeline(0, 1, 2)
    out = evictions(tl, 3, (), ("e2", 2 * DAY, False), 2 * DAY, 0.0, 3, already=True)
    assert out.evicted == ()
    assert out.keep_new


def test_no_ttl_and_no_cap_keep_everything() -> None:
    assert cutoff(5.0, 0.0) == float("-inf")
    out = evictions(timeline(0, 100), 2, (), ("e2", 1e9, False), 100 * DAY, 0.0, 0)
    assert out.evicted == ()
    assert out.keep_new
    assert prefix_needed(10, 2, 0) == 0


@given(
    st.lists(st.floats(0, 60), min_size=0, max_size=30),
    st.floats(0, 80),
    st.integers(1, 12),
    st.floats(0.5, 20),
)
def test_after_a_write_the_hot_tier_is_within_both_bounds(
    days: list[float], new_day: float, cap: int, ttl_days: float
) -> None:
    tl = sorted(timeline(*days), key=lambda e: (e[1], e[0]))
    newest = max((ts for _, ts in tl), default=None)
    out = evictions(tl, len(tl), (), ("new", new_day * DAY, False), newest, ttl_days * DAY, cap)
    hot = [e for e in tl if e[0] not in out.evicted]
    if out.keep_new:
        hot.append(("new", new_day * DAY))
    assert len(hot) <= cap
    assert all(ts >= out.newest - ttl_days * DAY for _, ts in hot)
    # Only what breaks a bound leaves: the oldest go, and a fresh turn within bounds stays.
    limit = out.newest - ttl_days * DAY
    fresh = [e for e in tl if e[1] >= limit]
    assert len(hot) == min(cap, len(fresh) + int(new_day * DAY >= limit))
