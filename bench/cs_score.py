"""How a context is scored in the customer-service benchmark, and its BM25 baseline.

This module owns the one rule both memstream's contexts and the baseline's are scored by
(``score``): text lowercased and whitespace-normalised, a value "shown" where one of its
strings occurs, its position the offset of the first occurrence of any of them; an open
promise shown where a ``- Open:`` line holds its span; a context line counted as small talk
where, stripped of its day, list marker and speaker, it is a small-talk turn of the stream
or one of its sentences, or holds one of 12 characters or more. And the baseline
(``NewestFirstBM25``): BM25 over the customer's turns, its positive-scoring turns best
first into the token budget, then the newest of the others while they fit, all shown newest
first as ``[d Mon YYYY] speaker: text``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from bench.baselines import BM25
from bench.cs_stream import VALUE_KINDS, Probe, norm
from memstream.memory.text import tokenize

DAY_HEADING = re.compile(r"^\[\d{1,2} [A-Z][a-z]{2} \d{4}\]$")
_DAY_PREFIX = re.compile(r"^\[\d{1,2} [A-Za-z]{3} \d{4}\]\s*")
_SPEAKER = re.compile(r"^(?:customer|agent|user|assistant|support agent):\s*")
_TRAILING_DAY = re.compile(r"\s*\(\d{4}-\d{2}-\d{2}\)$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MIN_CONTAINED = 12  # a shorter small-talk text ("ok", "bye!") counts only as a whole line


def first_at(context: str, strings: Iterable[str]) -> int | None:
    """Offset in the normalised context of the first occurrence of any of ``strings``."""
    found = [context.find(norm(s)) for s in strings if s]
    hits = [i for i in found if i >= 0]
    return min(hits) if hits else None


def content_lines(context: str) -> list[str]:
    """Non-empty lines that are neither a section header (``## ``) nor a day heading."""
    lines = (line.strip() for line in context.splitlines())
    return [x for x in lines if x and not x.startswith("## ") and not DAY_HEADING.match(x)]


def open_lines(context: str) -> list[str]:
    return [norm(x) for x in content_lines(context) if x.startswith("- Open:")]


class SmallTalk:
    """The small-talk turns of a stream, normalised, and their sentences."""

    def __init__(self, texts: Iterable[str]) -> None:
        whole = {norm(t) for t in texts}
        sentences = {norm(s) for t in texts for s in _SENTENCE_END.split(t)}
        self.exact = whole | sentences
        self.contained = sorted(x for x in self.exact if len(x) >= MIN_CONTAINED)

    def matches(self, line: str) -> bool:
        text = _DAY_PREFIX.sub("", line.strip())
        text = text[2:] if text.startswith("- ") else text
        text = _TRAILING_DAY.sub("", _SPEAKER.sub("", norm(text)))
        return text in self.exact or any(x in text for x in self.contained)


@dataclass(frozen=True)
class Scored:
    """One probe's outcome on one context (``None``: the figure does not apply)."""

    current_first: bool | None  # value kinds
    stale_first: bool | None  # value kinds
    open_shown: bool | None  # promise kinds: a "- Open:" line holds the promise
    recalled: bool | None  # one_off
    lines: int  # content lines of the context
    small_talk_lines: int


def score(probe: Probe, context: str, small_talk: SmallTalk) -> Scored:
    text = norm(context)
    current_first = stale_first = open_shown = recalled = None
    if probe.kind in VALUE_KINDS:
        c, s = first_at(text, probe.current), first_at(text, probe.stale)
        current_first = c is not None and (s is None or s > c)
        stale_first = s is not None and (c is None or s < c)
    elif probe.kind in ("promise_owed", "promise_kept"):
        spans = [norm(x) for x in probe.current]
        open_shown = any(span in line for line in open_lines(context) for span in spans)
    else:
        recalled = first_at(text, probe.current) is not None
    lines = content_lines(context)
    chatty = sum(1 for line in lines if small_talk.matches(line))
    return Scored(current_first, stale_first, open_shown, recalled, len(lines), chatty)


# --- the baseline ---------------------------------------------------------------------------


def turn_line(event: dict[str, Any]) -> str:
    """``[3 Nov 2025] customer: text``: memstream's turn line, the day on every line."""
    ts = datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))
    speaker = (event.get("metadata") or {}).get("speaker") or event["role"]
    return f"[{ts.day} {ts.strftime('%b %Y')}] {speaker}: {' '.join(event['text'].split())}"


class NewestFirstBM25:
    """BM25 over one customer's turns; a question's context within a token budget."""

    def __init__(self, events: Sequence[dict[str, Any]], count_tokens: Callable[[str], int]):
        self.events = sorted(events, key=lambda e: (e["ts"], e["event_id"]))
        self.lines = [turn_line(e) for e in self.events]
        self.costs = [count_tokens(line) for line in self.lines]
        self.index = BM25([tokenize(e["text"]) for e in self.events])

    def context(self, question: str, budget_tokens: int) -> tuple[str, int]:
        """The context and its tokens: positive-scoring turns best first (ties: newer
        first), then the other turns newest first, each while it fits (one that does not
        fit is skipped), all shown newest first. The budget is filled as memstream fills
        it: a reader of the customer's newest turns sees the current values most often."""
        scores = self.index.scores(tokenize(question))
        # by score (the non-positive all as 0), ties newest first
        order = np.lexsort((-np.arange(len(scores)), -np.maximum(scores, 0.0)))
        chosen: list[int] = []
        used = 0
        for i in (int(i) for i in order):
            if used + self.costs[i] <= budget_tokens:
                chosen.append(i)
                used += self.costs[i]
        return "\n".join(self.lines[i] for i in sorted(chosen, reverse=True)), used
