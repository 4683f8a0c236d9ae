"""memory.when: relative times dated from the turn's own time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import adversarial_inputs as adversarial
from memstream.memory.ranking import split_turn_text, turn_line, turn_text
from memstream.memory.when import (
    _PERIOD,
    _PHRASE,
    _SHOWN,
    Period,
    _annotated,
    annotate_times,
    asked_period,
)
from memstream.schemas import StoredTurn
from memstream.schemas.common import MAX_TEXT_CHARS

MONDAY = datetime(2023, 5, 8, 13, 56)  # LoCoMo's first session: Mon 8 May 2023


def _at(text: str, ts: datetime = MONDAY) -> str:
    return annotate_times(text, ts)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a day
        ("I went yesterday and", "I went yesterday (7 May) and"),
        ("Last night was amazing!", "Last night (7 May) was amazing!"),
        ("the day before yesterday", "the day before yesterday (6 May)"),
        ("Opening night is tomorrow.", "Opening night is tomorrow (9 May)."),
        ("the day after tomorrow", "the day after tomorrow (10 May)"),
        # weekdays: last = latest before the day, this = of its week, next = first after
        ("Last Friday, I went", "Last Friday (5 May), I went"),
        ("last Monday", "last Monday (1 May)"),
        ("this Sunday", "this Sunday (14 May)"),
        ("next Friday works", "next Friday (12 May) works"),
        ("next Monday", "next Monday (15 May)"),
        # weeks and weekends (weeks start on Monday)
        ("my school event last week.", "my school event last week (week of 1 May)."),
        ("next week", "next week (week of 15 May)"),
        ("our work from last weekend.", "our work from last weekend (6–7 May)."),
        ("the roadtrip this past weekend", "the roadtrip this past weekend (6–7 May)"),
        ("this past week", "this past week (week of 1 May)"),
        ("this weekend", "this weekend (13–14 May)"),
        ("next weekend", "next weekend (20–21 May)"),
        # months and years
        ("camping next month.", "camping next month (Jun)."),
        ("the pride event last month", "the pride event last month (Apr)"),
        ("I painted that last year!", "I painted that last year (2022)!"),
        ("last year's festival", "last year's (2022) festival"),
        ("next year", "next year (2024)"),
        # N ago, digits and words
        ("a conference two days ago", "a conference two days ago (6 May)"),
        ("3 days ago", "3 days ago (5 May)"),
        ("a week ago", "a week ago (~1 May)"),
        ("2 weeks ago", "2 weeks ago (~24 Apr)"),
        ("two weekends ago", "two weekends ago (29–30 Apr)"),
        ("a month ago", "a month ago (Apr)"),
        ("six months ago", "six months ago (Nov 2022)"),
        ("three years ago", "three years ago (2020)"),
        ("my 18th birthday ten years ago.", "my 18th birthday ten years ago (2013)."),
        ("about 5 years ago;", "about 5 years ago (2018);"),
        ("an hour ago and a day ago", "an hour ago and a day ago (7 May)"),
        # vague counts: "~", and only for days and weeks
        ("a few days ago", "a few days ago (~5 May)"),
        ("a couple of days ago", "a couple of days ago (~6 May)"),
        ("a few weeks ago.", "a few weeks ago (~17 Apr)."),
        ("couple of weeks ago", "couple of weeks ago (~24 Apr)"),
        ("the tattoo a few years ago", "the tattoo a few years ago"),
        ("a couple months ago", "a couple months ago"),
    ],
)
def test_each_form_is_dated_from_the_turn(text: str, expected: str) -> None:
    assert _at(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Hey Mel! Good to see you! How have you been?",
        "I did it today, tonight too, this week, this month, this year.",  # the heading's
        "I saw someone drawing the other day; recently too; years ago.",  # vague
        "the last week of June, over the next year, the next month or so",  # no point in time
        "my last weekend of summer, the last Friday of the month",
        "Rome wasn't built in a day. At last! Next! This is it. Lasting agony.",
        "yesterday (7 May 2023) and last year (2022)",  # says the date already
        "1000 days ago, yesterdays, lastweek, 3days ago",
    ],
)
def test_other_text_is_unchanged(text: str) -> None:
    assert _at(text) == text


def test_text_without_a_trigger_word_is_returned_as_is() -> None:
    text = "Thanks, Caroline! I'm obsessed with those, so I made something to catch the eye."
    assert _at(text) is text


_WORDS = ("the", "day", "before", "after", "yesterday", "Tomorrow", "last", "THIS", "past",
          "next", "week", "weekend", "Month", "years", "Friday", "night", "two", "3", "a", "few",
          "couple", "of", "ago", "(7 May)", "İ", "K", "ſ", "é", "x")  # fmt: skip


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    words=st.lists(st.sampled_from(_WORDS), max_size=12),
    gaps=st.lists(st.sampled_from([" ", "  ", "\t", "\n", ", ", "", "'s "]), min_size=12),
)
def test_the_quick_check_never_skips_a_date(words: list[str], gaps: list[str]) -> None:
    """``annotate_times`` = the pattern's pass alone, whatever the words and case."""
    text = "".join(w + g for w, g in zip(words, gaps, strict=False))
    full = _PHRASE.sub(lambda m: _annotated(m, MONDAY.date()), text)
    assert annotate_times(text, MONDAY) == full


@pytest.mark.parametrize(
    ("ts", "text", "expected"),
    [
        (datetime(2024, 3, 1), "yesterday", "yesterday (29 Feb)"),  # a leap day
        (datetime(2023, 3, 1), "yesterday", "yesterday (28 Feb)"),
        (datetime(2023, 1, 31), "tomorrow", "tomorrow (1 Feb)"),
        (datetime(2024, 1, 1), "yesterday", "yesterday (31 Dec 2023)"),  # another year: shown
        (datetime(2023, 12, 31), "tomorrow", "tomorrow (1 Jan 2024)"),
        (datetime(2024, 1, 1), "last week", "last week (week of 25 Dec 2023)"),
        (datetime(2024, 1, 10), "last month", "last month (Dec 2023)"),
        (datetime(2023, 12, 10), "next month", "next month (Jan 2024)"),
        (datetime(2023, 2, 10), "3 months ago", "3 months ago (Nov 2022)"),
        (datetime(2023, 2, 10), "14 months ago", "14 months ago (Dec 2021)"),
        (datetime(2023, 10, 2), "last weekend", "last weekend (30 Sep–1 Oct)"),
        (datetime(2023, 1, 2), "last weekend", "last weekend (31 Dec 2022–1 Jan 2023)"),
        (datetime(2024, 1, 2), "last Friday", "last Friday (29 Dec 2023)"),
    ],
)
def test_month_and_year_boundaries(ts: datetime, text: str, expected: str) -> None:
    assert _at(text, ts) == expected


@pytest.mark.parametrize(
    ("weekday", "last", "this", "next_"),
    [
        # said on Friday 12 May 2023: "last Friday" is a week back, "next Friday" a week on
        ("Friday", "5 May", "12 May", "19 May"),
        ("Thursday", "11 May", "11 May", "18 May"),
        ("Saturday", "6 May", "13 May", "13 May"),
        ("Monday", "8 May", "8 May", "15 May"),
        ("Sunday", "7 May", "14 May", "14 May"),
    ],
)
def test_weekday_arithmetic(weekday: str, last: str, this: str, next_: str) -> None:
    friday = datetime(2023, 5, 12, 9, 0)
    assert _at(f"last {weekday}", friday) == f"last {weekday} ({last})"
    assert _at(f"this {weekday}", friday) == f"this {weekday} ({this})"
    assert _at(f"next {weekday}", friday) == f"next {weekday} ({next_})"


def test_the_day_is_the_turns_own_in_its_zone() -> None:
    """The event time's own date, as the heading (``turn_day``) shows it, never the clock."""
    late = datetime(2023, 5, 8, 23, 30, tzinfo=timezone(timedelta(hours=-7)))
    assert _at("yesterday", late) == "yesterday (7 May)"
    assert _at("yesterday", late.astimezone(UTC)) == "yesterday (8 May)"


def test_case_spacing_and_repeats() -> None:
    assert _at("YESTERDAY and Last  Week") == "YESTERDAY (7 May) and Last  Week (week of 1 May)"
    once = _at("yesterday, then last year, then two days ago")
    assert once == "yesterday (7 May), then last year (2022), then two days ago (6 May)"
    assert _at(once) == once  # rendering again adds nothing


def test_a_bad_clock_leaves_the_text() -> None:
    assert _at("tomorrow, next month, next year", datetime(9999, 12, 31)) == (
        "tomorrow, next month, next year"
    )
    assert _at("yesterday and 3 years ago", datetime(1, 1, 1)) == "yesterday and 3 years ago"


def test_turn_line_shows_the_date_and_turn_text_splits_as_before() -> None:
    turn = StoredTurn(
        event_id="e1",
        session_id="s1",
        role="user",
        speaker="Caroline",
        text="I went to a LGBTQ support group\nyesterday and it was so powerful.",
        ts=datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
    )
    line = "Caroline: I went to a LGBTQ support group yesterday (7 May) and it was so powerful."
    assert turn_line(turn) == line
    assert turn_text(turn) == f"[8 May 2023] {line}"
    assert split_turn_text(turn_text(turn)) == ("[8 May 2023]", line)


# Linear time: the same adversarial inputs and bound as tests/unit/memory/test_linear_time.py
# (which collects patterns from a fixed list of modules, not this one).
CALL_BUDGET_S = 0.300


def _fastest_of_three(call: object) -> float:
    assert callable(call)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
        if best <= CALL_BUDGET_S:
            break
    return best


@pytest.mark.parametrize(
    "pattern", [_PHRASE, _SHOWN, _PERIOD], ids=["_PHRASE", "_SHOWN", "_PERIOD"]
)
def test_patterns_are_linear(pattern: object) -> None:
    import re

    assert isinstance(pattern, re.Pattern)
    for text in adversarial.pattern_texts(pattern, MAX_TEXT_CHARS):
        seconds = _fastest_of_three(lambda t=text: sum(1 for _ in pattern.finditer(t)))
        assert seconds <= CALL_BUDGET_S, f"{seconds:.3f} s on {text[:40]!r}"


def test_annotate_times_is_linear() -> None:
    texts = [
        *adversarial.adversarial_texts(MAX_TEXT_CHARS),
        *adversarial.pattern_texts(_PHRASE, MAX_TEXT_CHARS),
    ]
    for text in texts:
        seconds = _fastest_of_three(lambda t=text: annotate_times(t, MONDAY))
        assert seconds <= CALL_BUDGET_S, f"{seconds:.3f} s on {text[:40]!r}"


def test_asked_period_is_linear() -> None:
    texts = [
        *adversarial.adversarial_texts(MAX_TEXT_CHARS),
        *adversarial.pattern_texts(_PERIOD, MAX_TEXT_CHARS),
    ]
    for text in texts:
        seconds = _fastest_of_three(lambda t=text: asked_period(t))
        assert seconds <= CALL_BUDGET_S, f"{seconds:.3f} s on {text[:40]!r}"


@pytest.mark.parametrize(
    ("query", "period"),
    [
        ("What did she show me on October 13, 2023?", Period(2023, 10, 13)),
        ("what did he find on 1 February, 2023", Period(2023, 2, 1)),
        ("any news from 2024-03-05?", Period(2024, 3, 5)),
        ("what did we paint in July 2023", Period(2023, 7)),
        ("the setback she faced in Oct, 2023", Period(2023, 10)),
        ("When did Melanie go camping in June?", Period(None, 6)),
        ("what happened during sept", Period(None, 9)),
        ("How many times did she go to the beach in 2023?", Period(2023)),
        ("我2023年10月下的订单到了吗", Period(2023, 10)),
        ("Where is my order?", None),
        ("I may call again in mayhem", None),  # a month word alone names no time
        ("order 2023 of 4000 units", None),  # a number is no year without "in"
    ],
)
def test_a_query_names_the_period_it_asks_about(query: str, period: Period | None) -> None:
    assert asked_period(query) == period


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1)))
@settings(max_examples=300, deadline=None)
def test_a_period_holds_the_same_times_one_by_one_and_at_once(moment: datetime) -> None:
    ts = moment.replace(tzinfo=UTC)
    epochs = np.array([ts.timestamp()])
    for period in (
        Period(ts.year, ts.month, ts.day),
        Period(ts.year, ts.month),
        Period(None, ts.month),
        Period(ts.year),
        Period(ts.year, ts.month % 12 + 1),
        Period(ts.year + 1),
        Period(ts.year, ts.month, ts.day % 28 + 1),
    ):
        assert bool(period.contains_epochs(epochs)[0]) == period.contains(ts)
    assert Period(ts.year, ts.month, ts.day).contains(ts)
