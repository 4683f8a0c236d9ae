"""Due times stated in a sentence ("within 24 hours", "by Friday", "3个工作日内", "明天"), read
relative to the time of the turn that states them. Pure: the turn's time is the only clock.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                 "six": 6, "seven": 7, "ten": 10, "twelve": 12, "twenty-four": 24}  # fmt: skip
_ZH_DIGITS = {c: n for n, c in enumerate("零一二三四五六七八九")} | {"两": 2}
_ZH_WEEKDAYS = {c: n for n, c in enumerate("一二三四五六日")} | {"天": 6}
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2}))?\b")
_RELATIVE = re.compile(
    r"\b(?:within|in|next)\s+(\d+|[a-z]+(?:-[a-z]+)?)\s+"
    r"(minute|hour|business day|working day|day|week)s?\b"
)
# Linear: a number is tried from the first character of its run only (the lookbehinds; the
# runs are possessive, what follows them cannot extend them), and "\s*个?\s*" is read as
# "\s*(?:个\s*)?" (two runs of spaces one after the other were quadratic).
_ZH_NUMERALS = "零一二两三四五六七八九十"
_ZH_RELATIVE = re.compile(
    rf"((?<!\d)\d++|(?<![{_ZH_NUMERALS}])[{_ZH_NUMERALS}]++)\s*(?:个\s*)?"
    r"(小时|工作日|天|日|周|星期)(?:之|以)?内"
)
_ZH_UNITS = {"小时": "hour", "工作日": "business day", "周": "week", "星期": "week"}
_EN_WEEKDAY = re.compile(r"\b(?:by|on|before|until|next)\s+(" + "|".join(_WEEKDAYS) + r")\b")
_ZH_WEEKDAY = re.compile(r"(?:周|星期|礼拜)([一二三四五六日天])")
_TOMORROW = re.compile(r"\btomorrow\b|明天")
_TODAY = re.compile(r"\b(?:today|tonight|end of (?:the )?day|eod)\b|今天|今晚")


def parse_due(text: str, ts: datetime) -> datetime | None:
    """The due time a sentence states, relative to the turn's ``ts``; None when it states none.

    Understands an ISO date (with optional HH:MM), "within/in N minutes|hours|days|business
    days|weeks" and "N小时内 / N天内 / N个工作日内", "by Friday" / "周五", "tomorrow" / "明天",
    "today / end of day" / "今天". A day without a time means the end of that day.
    """
    lower = text.lower()
    end_of_day = ts.replace(hour=23, minute=59, second=59, microsecond=0)
    if m := _ISO_DATE.search(lower):
        try:
            day = date.fromisoformat(m.group(1))
            at = end_of_day
            if m.group(2):
                at = ts.replace(
                    hour=int(m.group(2)), minute=int(m.group(3)), second=0, microsecond=0
                )
            return at.replace(year=day.year, month=day.month, day=day.day)
        except ValueError:
            return None
    if m := _RELATIVE.search(lower):
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBER_WORDS.get(m.group(1))
        if n is not None:
            return _add(ts, n, m.group(2))
    if m := _ZH_RELATIVE.search(text):
        n = _zh_int(m.group(1))
        if n is not None:
            return _add(ts, n, _ZH_UNITS.get(m.group(2), "day"))
    weekday = None
    if m := _EN_WEEKDAY.search(lower):
        weekday = _WEEKDAYS.index(m.group(1))
    elif m := _ZH_WEEKDAY.search(text):
        weekday = _ZH_WEEKDAYS[m.group(1)]
    if weekday is not None:
        return end_of_day + timedelta(days=(weekday - ts.weekday()) % 7 or 7)
    if _TOMORROW.search(lower):
        return end_of_day + timedelta(days=1)
    if _TODAY.search(lower):
        return end_of_day
    return None


def _add(ts: datetime, n: int, unit: str) -> datetime:
    if unit in ("business day", "working day"):
        day = ts
        while n > 0:
            day += timedelta(days=1)
            n -= day.weekday() < 5
        return day
    return ts + {
        "minute": timedelta(minutes=n),
        "hour": timedelta(hours=n),
        "week": timedelta(weeks=n),
    }.get(unit, timedelta(days=n))


def _zh_int(text: str) -> int | None:
    if text.isdigit():
        return int(text)
    if "十" in text:
        tens, _, ones = text.partition("十")
        return _ZH_DIGITS.get(tens, 1) * 10 + _ZH_DIGITS.get(ones, 0) if len(tens) <= 1 else None
    return _ZH_DIGITS.get(text) if len(text) == 1 else None
