"""A consolidated memory rendered as context text, for the bot that reads it and the encoder.

A bot reads from the top and may stop early, so the current state comes first and history
after it, newest first: title, status, the current value of each attribute, open actions,
the other facts newest first, then a few superseded values. Every time shown is an event
time (when it was said), never when memstream processed it. Pure.
"""

from __future__ import annotations

from datetime import datetime

from memstream.memory.phrases import norm
from memstream.schemas import ConsolidatedMemory, Fact, HistoryEntry

_TIME = "%Y-%m-%d %H:%M"
_DAY = "%Y-%m-%d"
MAX_HISTORY_LINES = 3  # the newest superseded values; the rest stays in the stored memory
_HISTORY_LABEL = {"open_action": "Closed"}


def memory_text(m: ConsolidatedMemory) -> str:
    """One line each: title, status, attributes, open actions with due, facts, history."""
    lines = [f"{_line(m.title)} (updated {m.updated_at.strftime(_TIME)})"]
    status = norm(m.status)
    facts = [f for f in m.facts if not (f.attribute == "status" or norm(f.text) == status)]
    if m.status:
        when = next(
            (f.ts for f in m.facts if f.attribute == "status" and norm(f.text) == status), None
        )
        # What was said after the state was recognised goes above it, whatever its words:
        # no older state is read before a newer statement.
        newer = sorted((f for f in facts if _after(f, when)), key=_newest_first)
        lines.extend(f"- {_line(f.text)}{_day(f.ts)}" for f in newer)
        facts = [f for f in facts if not _after(f, when)]
        lines.append(f"Status{_day(when)}: {_line(m.status)}")
    attributes = sorted((f for f in facts if f.attribute), key=_newest_first)
    lines.extend(f"- {_line(f.text)}{_day(f.ts)}" for f in attributes)
    for a in m.open_actions:
        due = f" (due {a.due.strftime(_TIME)})" if a.due is not None else ""
        lines.append(f"- Open: {_line(a.text)}{due}")
    others = sorted((f for f in facts if not f.attribute), key=_newest_first)
    lines.extend(f"- {_line(f.text)}{_day(f.ts)}" for f in others)
    history = sorted(m.history, key=_history_order)[:MAX_HISTORY_LINES]
    lines.extend(
        f"- {_HISTORY_LABEL.get(h.attribute, 'Earlier')}{_day(h.stated_at or h.superseded_at)}: "
        f"{_line(h.value)}"
        for h in history
    )
    return "\n".join(lines)


def _after(f: Fact, when: datetime | None) -> bool:
    return when is not None and f.ts is not None and f.ts > when


def _newest_first(f: Fact) -> tuple[float, str]:
    return (-f.ts.timestamp() if f.ts is not None else 0.0, f.text)


def _history_order(h: HistoryEntry) -> tuple[float, float, str]:
    """Newest first by the time shown (when it was said), then by when it stopped."""
    shown = h.stated_at or h.superseded_at
    return (-shown.timestamp(), -h.superseded_at.timestamp(), h.value)


def _day(ts: datetime | None) -> str:
    return "" if ts is None else f" ({ts.strftime(_DAY)})"


def _line(text: str) -> str:
    return " ".join(text.split())
