"""Relative time made explicit: "yesterday", "last week", "two years ago" in a turn, resolved
against the turn's own time and shown as a date right after the phrase.

A reader sees ``[8 May 2023] Caroline: I went to a support group yesterday (7 May)`` and
need not do date arithmetic (LoCoMo's gold answer: "7 May 2023"). Pure: the turn's ``ts``
(its event time) is the only clock, so the same turn always renders the same.

Shown, for a turn on Mon 8 May 2023 (the year only where it is not the turn's: the day's
heading shows that one, and "2023" is two tokens of a 256-token budget):

- a day: yesterday / last night (7 May), the day before yesterday (6 May), tomorrow
  (9 May), the day after tomorrow (10 May);
- last / this / next + weekday: last Friday (5 May), this Friday (12 May), next Friday
  (12 May) -- "this" is the day of the turn's Monday-to-Sunday week, "next" the first one
  after the turn's day (as ``memory.due`` reads "by next Friday"), "last" the latest one
  before it;
- last / next week (week of 1 May), last / this / next weekend (6–7 May), "this past
  week/weekend" read as "last";
- last / next month (Apr), last / next year (2022);
- N days ago (5 May), N weeks ago (~24 Apr), N weekends ago (29–30 Apr), N months ago
  (Feb), N years ago (2021), N in digits or words; "a couple of" and "a few" are marked
  ``~``, and only for days and weeks (a few years is no year).

Left as written: what the day's heading already says (today, tonight, this week, this
month, this year), what is vague ("the other day", "recently", "years ago"), phrases that
are no point in time ("the last week of June", "over the next year"), and a phrase the
text already dates ("yesterday (7 May)").

Shown, not searched: the BM25 index reads the turn's own words
(``memory.lexical.lexical_text``). Indexing the dates too lowered R@10 (0.779 -> 0.777)
and ER@512 (0.779 -> 0.771) on LoCoMo-dev and raised no answer-token figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import MAXYEAR, MINYEAR, date, datetime, timedelta

import numpy as np
import numpy.typing as npt

from memstream.memory.text import extract_entities

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
           "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
           "fifteen": 15, "twenty": 20, "thirty": 30}  # fmt: skip
_VAGUE = {"couple": 2, "few": 3}  # "~": a couple is about two, a few about three
_VAGUE_UNITS = ("day", "week", "weekend")

# One pass, linear on any input: every alternative starts with a literal word after "\b"
# (tried once per word, never inside one), the runs of spaces are possessive, and a count
# is at most three digits. Longer phrases come first ("the day before yesterday").
_PHRASE = re.compile(
    r"\b(?:"
    r"(?P<day>the\s++day\s++before\s++yesterday|the\s++day\s++after\s++tomorrow"
    r"|yesterday|last\s++night|tomorrow)"
    r"|(?<!the\s)(?P<rel>last|this\s++past|this|next)\s++"
    r"(?P<unit>weekend|week|month|year|" + "|".join(_WEEKDAYS) + r")(?!\s++of\b)"
    r"|(?P<count>\d{1,3}|" + "|".join(_COUNTS) + r"|(?:a\s++)?couple\s++of|a\s++few)\s++"
    r"(?P<ago>day|weekend|week|month|year)s?\s++ago"
    r")\b(?:'s)?",
    re.IGNORECASE | re.ASCII,
)
_SHOWN = re.compile(r" ?\((?:~|\d|week of )")


def annotate_times(text: str, ts: datetime) -> str:
    """``text`` with each relative time it states followed by the date it means, read from
    ``ts`` (the turn's event time): "yesterday" -> "yesterday (7 May)". Text without
    one comes back unchanged (the same object).

    Python's ``re`` takes ~20 us to find nothing in a 130-character line; ``in`` rules out
    most lines in ~1 us (on LoCoMo 9 lines in 10; of the rest, 9 in 10 are dated). Exact, not
    a heuristic: every phrase dated holds "yesterday" or "tomorrow", or "ago", "last",
    "next" or "this" with a unit ("day" is in every weekday), and the pattern folds case as
    ASCII does, as ``lower`` does.
    """
    low = text.lower()
    if not (
        "yesterday" in low
        or "tomorrow" in low
        or (
            ("ago" in low or "last" in low or "next" in low or "this" in low)
            and ("day" in low or "week" in low or "month" in low or "year" in low or "night" in low)
        )
    ):
        return text
    return _PHRASE.sub(lambda m: _annotated(m, ts.date()), text)


def _annotated(m: re.Match[str], day: date) -> str:
    phrase = m.group(0)
    if _SHOWN.match(m.string, m.end()):
        return phrase  # the text says the date already (or was rendered before)
    try:
        shown = _resolve(m, day)
    except OverflowError:  # a day out of 1-9999 (and months and years, below): a bad clock
        return phrase
    return f"{phrase} ({shown})" if shown else phrase


def _resolve(m: re.Match[str], day: date) -> str | None:
    """What the phrase ``m`` means, written for a reader; None: nothing the day's heading
    does not already say."""
    if said := m.group("day"):
        words = said.lower().split()
        offset = {"yesterday": -1, "night": -1, "tomorrow": 1}[words[-1]]
        return _day(day + timedelta(days=offset * (2 if len(words) > 2 else 1)), day.year)
    if rel := m.group("rel"):
        step = {"last": -1, "this": 0, "next": 1}[rel.lower().split()[0]]
        step = -1 if "past" in rel.lower() else step
        return _relative(step, m.group("unit").lower(), day)
    count, unit = m.group("count").lower(), m.group("ago").lower()
    vague = count.split()[-2 if count.endswith("of") else -1]
    if vague in _VAGUE:
        if unit not in _VAGUE_UNITS:
            return None
        n, approx = _VAGUE[vague], "~"
    else:
        n, approx = int(count) if count.isdigit() else _COUNTS[count], ""
    return _ago(n, unit, day, approx)


def _relative(step: int, unit: str, day: date) -> str | None:
    monday = day - timedelta(days=day.weekday())
    if unit in _WEEKDAYS:
        wd = _WEEKDAYS.index(unit)
        if step < 0:
            return _day(day - timedelta(days=(day.weekday() - wd) % 7 or 7), day.year)
        if step > 0:
            return _day(day + timedelta(days=(wd - day.weekday()) % 7 or 7), day.year)
        return _day(monday + timedelta(days=wd), day.year)
    if step == 0 and unit != "weekend":
        return None  # this week / month / year: the heading's
    if unit == "week":
        return f"week of {_day(monday + timedelta(weeks=step), day.year)}"
    if unit == "weekend":
        return _weekend(monday + timedelta(weeks=step, days=5), day.year)
    if unit == "month":
        return _month(day, step)
    return _year(day.year + step)


def _ago(n: int, unit: str, day: date, approx: str) -> str | None:
    if unit == "day":
        return approx + _day(day - timedelta(days=n), day.year)
    if unit == "week":
        # "~": "two weeks ago" is never to the day
        return "~" + _day(day - timedelta(weeks=n), day.year)
    if unit == "weekend":
        monday = day - timedelta(days=day.weekday())
        return _weekend(monday - timedelta(weeks=n, days=-5), day.year)
    if unit == "month":
        return _month(day, -n)
    return _year(day.year - n)


def _day(d: date, year: int) -> str:
    """``7 May``, or ``7 May 2022`` out of the turn's ``year``: the day's heading already
    shows its year, and "2023" is two tokens of a 256-token budget."""
    return f"{d.day} {_MONTHS[d.month - 1]}" + (f" {d.year}" if d.year != year else "")


def _weekend(saturday: date, year: int) -> str:
    sunday = saturday + timedelta(days=1)
    if saturday.month == sunday.month:
        return f"{saturday.day}–{_day(sunday, year)}"
    if saturday.year == sunday.year:
        return f"{saturday.day} {_MONTHS[saturday.month - 1]}–{_day(sunday, year)}"
    return f"{_day(saturday, 0)}–{_day(sunday, 0)}"


def _month(day: date, step: int) -> str | None:
    year, month = divmod(day.year * 12 + day.month - 1 + step, 12)
    if not MINYEAR <= year <= MAXYEAR:
        return None
    return _MONTHS[month] + (f" {year}" if year != day.year else "")


def _year(year: int) -> str | None:
    return str(year) if MINYEAR <= year <= MAXYEAR else None


@dataclass(frozen=True)
class Period:
    """A stretch of event time a query names: a day, a month (of a year, or of any year when
    none is said) or a year. Compared in UTC, as event times are stored."""

    year: int | None
    month: int | None = None
    day: int | None = None

    def contains(self, ts: datetime) -> bool:
        return (
            (self.year is None or ts.year == self.year)
            and (self.month is None or ts.month == self.month)
            and (self.day is None or ts.day == self.day)
        )

    def contains_epochs(self, epochs: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        """``contains`` for each of ``epochs`` (seconds since 1970, UTC), vectorised."""
        days = epochs.astype("datetime64[s]").astype("datetime64[D]")
        months = days.astype("datetime64[M]")
        years = months.astype("datetime64[Y]")
        inside = np.ones(epochs.shape, dtype=bool)
        if self.year is not None:
            inside &= years.astype(np.int64) + 1970 == self.year
        if self.month is not None:
            inside &= months.astype(np.int64) % 12 + 1 == self.month
        if self.day is not None:
            inside &= (days - months).astype(np.int64) + 1 == self.day
        return inside


_MONTH_WORD = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
# A month with its year ("July 2023", "in Oct, 2023"), or after "in" / "during" alone ("in
# June": any June); a year after "in" / "during" ("in 2023"); Chinese "2023年10月". Each
# alternative starts at a word boundary with a literal: linear on any input.
_PERIOD = re.compile(
    r"\b(?:(?P<prep>in|during)\s++)?" + _MONTH_WORD + r"(?:,?\s++(?P<year>\d{4}))?(?![\w-])"
    r"|\b(?:in|during)\s++(?P<only>\d{4})\b"
    r"|(?<!\d)(?P<zy>\d{4})\s*+年\s*+(?P<zm>\d{1,2})\s*+月",
    re.IGNORECASE | re.ASCII,
)


def asked_period(query: str) -> Period | None:
    """The day, month or year a query asks about, when it names one ("on October 13, 2023",
    "in July 2023", "in June", "in 2023"); the first named wins. None: it names none."""
    for key in extract_entities(query):  # a whole date, in any form memstream reads
        if key.startswith("date:"):
            day = date.fromisoformat(key.removeprefix("date:"))
            return Period(day.year, day.month, day.day)
    for m in _PERIOD.finditer(query):
        if m["month"] and m["year"]:
            return Period(int(m["year"]), _month_of(m["month"]))
        if m["month"] and m["prep"]:
            return Period(None, _month_of(m["month"]))
        if m["only"]:
            return Period(int(m["only"]))
        if m["zm"] and 1 <= int(m["zm"]) <= 12:
            return Period(int(m["zy"]), int(m["zm"]))
    return None  # a month word alone ("I may") names no time


def _month_of(word: str) -> int:
    return _MONTHS.index(word[:3].title()) + 1
