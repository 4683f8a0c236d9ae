"""Which short-term turns leave the hot tier (Redis): expiry counted in event time.

A turn leaves when it is older than the user's newest event minus the TTL, or when the
user holds more than ``max_turns`` (oldest first). Pinned turns never expire by age and
go last under the cap. Nothing is lost by leaving: every turn is also in the archive tier
(``workers.archive``); the hot tier only bounds what Redis holds. Time is an argument, so
a replay of an old log evicts exactly what the live stream did.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Eviction:
    """What one write changes in the hot tier."""

    evicted: tuple[str, ...]  # timeline ids to remove, oldest first
    keep_new: bool  # whether the turn being written stays hot (a late old turn does not)
    newest: float  # the user's newest event time after this write (epoch seconds)


def cutoff(newest: float, ttl_s: float) -> float:
    """Turns stamped before this have expired (``ttl_s <= 0``: nothing expires by age)."""
    return newest - ttl_s if ttl_s > 0 else float("-inf")


def evictions(
    oldest: Sequence[tuple[str, float]],
    total: int,
    pinned: Collection[str],
    new: tuple[str, float, bool],
    newest: float | None,
    ttl_s: float,
    max_turns: int,
    *,
    already: bool = False,
) -> Eviction:
    """What leaves the hot tier when ``new`` (id, ts, pinned) is written.

    ``oldest`` is a prefix of the timeline (id, ts), oldest first, out of ``total`` entries
    (``new`` not counted): it must hold every entry older than ``cutoff`` and at least
    ``prefix_needed`` entries, so the cap can pass over pinned ones. ``newest`` is the
    user's newest event time before this write (None: no turn yet); ``already``: ``new`` is
    on the timeline already (an event applied again), so it is not counted twice.
    """
    new_id, new_ts, new_pinned = new
    latest = new_ts if newest is None else max(newest, new_ts)
    limit = cutoff(latest, ttl_s)
    pins = set(pinned) | ({new_id} if new_pinned else set())
    entries = [(i, ts) for i, ts in oldest if i != new_id]
    complete = len(oldest) >= total
    if complete or (entries and (new_ts, new_id) < (entries[-1][1], entries[-1][0])):
        entries.append((new_id, new_ts))
        entries.sort(key=lambda e: (e[1], e[0]))  # Redis orders a zset by score, then member
    count = total + (0 if already else 1)
    expired = {i for i, ts in entries if ts < limit and i not in pins}
    over = count - len(expired) - max_turns if max_turns > 0 else 0
    survivors = [i for i, _ in entries if i not in expired]
    by_priority = [i for i in survivors if i not in pins] + [i for i in survivors if i in pins]
    drop = expired | set(by_priority[: max(over, 0)])
    keep_new = new_id not in drop
    evicted = tuple(i for i, _ in entries if i in drop and (i != new_id or already))
    return Eviction(evicted=evicted, keep_new=keep_new, newest=latest)


def prefix_needed(total: int, pinned: int, max_turns: int) -> int:
    """How many of the oldest timeline entries ``evictions`` needs to apply the cap."""
    if max_turns <= 0:
        return 0
    return max(0, total + 1 - max_turns) + pinned
