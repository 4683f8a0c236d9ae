"""A memory's strength: how much ranking trusts it. Grows with use, fades with time.

- It starts from the trigger's score, weighted by the turns' importance
  (``initial_strength``).
- Each retrieval that hands the memory to an agent multiplies it by ``boost`` (1.2).
- Each whole ``interval_s`` (a day) that passes multiplies it by ``decay`` (0.99).
- It never falls under ``floor`` (0.1), so an old memory can still be found again.

Both updates are idempotent, because the broker delivers at least once and a periodic
worker may run twice: a boost records its feedback id on the memory (a redelivered
message is recognised and ignored), and decay is derived from the whole intervals elapsed
since ``decayed_to``, which it advances by exactly those intervals (running it again at
the same time finds no whole interval left). Pure: time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from memstream.schemas import ConsolidatedMemory


@dataclass(frozen=True)
class StrengthParams:
    boost: float = 1.2
    decay: float = 0.99
    floor: float = 0.1
    interval_s: float = 86_400.0
    remembered_feedback: int = 64  # feedback ids kept per memory for idempotency

    def __post_init__(self) -> None:
        if self.boost < 1.0 or not 0.0 < self.decay <= 1.0:
            raise ValueError("boost must be >= 1 and decay in (0, 1]")
        if self.floor <= 0.0 or self.interval_s <= 0.0 or self.remembered_feedback < 1:
            raise ValueError("floor, interval_s and remembered_feedback must be positive")


def initial_strength(score: float, importance: float, params: StrengthParams) -> float:
    """The trigger's score weighted by importance in [0, 1] (x0.5 to x1.5), at least the floor."""
    return round(max(params.floor, score * (0.5 + importance)), 4)


def boosted(
    memory: ConsolidatedMemory, feedback_id: str, params: StrengthParams
) -> ConsolidatedMemory:
    """``memory`` boosted once for ``feedback_id``; itself when that id was already counted."""
    if feedback_id in memory.feedback_ids:
        return memory
    ids = [*memory.feedback_ids, feedback_id][-params.remembered_feedback :]
    strength = max(params.floor, memory.strength * params.boost)
    return memory.model_copy(update={"strength": round(strength, 6), "feedback_ids": ids})


def decayed(
    memory: ConsolidatedMemory, now: datetime, params: StrengthParams
) -> ConsolidatedMemory:
    """``memory`` decayed by the whole intervals between its ``decayed_to`` and ``now``.

    Itself when no whole interval has passed (a repeated run, a clock behind the memory).
    """
    since = memory.decayed_to or memory.created_at
    intervals = math.floor((now - since).total_seconds() / params.interval_s)
    if intervals <= 0:
        return memory
    strength = max(params.floor, memory.strength * params.decay**intervals)
    return memory.model_copy(
        update={
            "strength": round(strength, 6),
            "decayed_to": since + timedelta(seconds=intervals * params.interval_s),
        }
    )


def boost_all(
    memories: Sequence[ConsolidatedMemory], feedback_id: str, params: StrengthParams
) -> list[ConsolidatedMemory]:
    """The memories that one feedback message actually changes, boosted."""
    changed = []
    for memory in memories:
        after = boosted(memory, feedback_id, params)
        if after is not memory:
            changed.append(after)
    return changed
