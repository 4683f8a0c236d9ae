"""No user text makes a regex or a per-turn text function of memory/ super-linear.

Python's ``re`` backtracks: a pattern with two quantifiers over the same characters costs
the square (or worse) of a long run of them ("welcome to" + 8,000 spaces took 48 s in
``_AGENT_FRAME``). Every module-level pattern of memory/ is collected from the modules'
globals (a new one is covered without editing this file) and run on inputs of the largest
text a request may carry (``MAX_TEXT_CHARS``): runs of each character class, and the
pattern's own literal phrases followed by runs (``bench.adversarial_inputs``), then hypothesis
text. The per-turn functions (``bench.adversarial_inputs.per_turn_functions``) run on the same.

The bound: each call under ``CALL_BUDGET_S`` at 8,000 characters. Measured on the 2-core
development machine (with other work on it), the worst call was ~55 ms (``is_salient`` and
``find_state`` on packed phrases; a pattern's worst ~25 ms); 300 ms is over 5x that, and
far under what a quadratic pattern costs at this size (1.5 s to 48 s before the fix). A
call over the bound is timed twice more and the fastest of the three counts, so a busy
CPU does not fail the test; a call past ``WATCHDOG_S`` is interrupted.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import adversarial_inputs as adversarial
from memstream.schemas.common import MAX_TEXT_CHARS

CALL_BUDGET_S = 0.300
TRIES = 3
WATCHDOG_S = 3.0

adversarial._import_all()
PATTERNS = adversarial.module_patterns()
FUNCTIONS = adversarial.per_turn_functions()


class _TooSlow(Exception):
    pass


@contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Interrupts the block after ``seconds`` (``re`` checks for signals while it matches)."""

    def interrupt(signum: int, frame: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _seconds(call: Callable[[], object]) -> float:
    """The fastest of up to ``TRIES`` runs (one when the first is under the budget)."""
    best = float("inf")
    for _ in range(TRIES):
        start = time.perf_counter()
        try:
            with _watchdog(WATCHDOG_S):
                call()
        except _TooSlow:
            return float("inf")
        best = min(best, time.perf_counter() - start)
        if best <= CALL_BUDGET_S:
            break
    return best


def _scan(pattern: re.Pattern[str], text: str) -> Callable[[], object]:
    return lambda: sum(1 for _ in pattern.finditer(text))  # the first match is search's


def _slowest(calls: Iterator[tuple[str, Callable[[], object]]]) -> tuple[float, str]:
    return max(((_seconds(call), label) for label, call in calls), default=(0.0, ""))


def _describe(text: str) -> str:
    return repr(text[:40]) + f"... ({len(text)} chars)"


def test_patterns_are_collected() -> None:
    names = set(PATTERNS)
    assert "memstream.memory.text._AGENT_FRAME" in names
    assert "memstream.memory.due._ZH_RELATIVE" in names
    assert any(
        name.startswith("memstream.memory.phrases._STATES[") for name in names
    )  # inside tuples
    assert len(PATTERNS) >= 60


def test_literal_phrases_reach_the_repeated_part() -> None:
    phrases = adversarial.literal_phrases(PATTERNS["memstream.memory.text._AGENT_FRAME"])
    assert {"welcome to", "this is", "my name is"} <= set(phrases)
    assert "订单" in adversarial.literal_phrases(PATTERNS["memstream.memory.text._ORDER_ZH_RE"])


def test_adversarial_texts_are_deterministic_and_at_the_limit() -> None:
    texts = adversarial.adversarial_texts(MAX_TEXT_CHARS)
    assert texts == adversarial.adversarial_texts(MAX_TEXT_CHARS)
    assert all(len(t) == MAX_TEXT_CHARS for t in texts)
    assert " " * MAX_TEXT_CHARS in texts
    assert "1" * MAX_TEXT_CHARS in texts


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_is_linear(name: str) -> None:
    pattern = PATTERNS[name]
    texts = adversarial.pattern_texts(pattern, MAX_TEXT_CHARS)
    seconds, text = _slowest((t, _scan(pattern, t)) for t in texts)
    assert seconds <= CALL_BUDGET_S, f"{name}: {seconds:.3f} s on {_describe(text)}"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_per_turn_function_is_linear(name: str) -> None:
    fn = FUNCTIONS[name]
    texts = adversarial.adversarial_texts(MAX_TEXT_CHARS)
    seconds, text = _slowest((t, lambda t=t: fn(t)) for t in texts)
    assert seconds <= CALL_BUDGET_S, f"{name}: {seconds:.3f} s on {_describe(text)}"


_ALL_PHRASES = sorted(
    {phrase for pattern in PATTERNS.values() for phrase in adversarial.literal_phrases(pattern)}
)
_CHARS = "".join(
    dict.fromkeys("".join(adversarial.RUN_UNITS) + " \n\t.,;:!?'\"-_#@/()$+%&0aZ一号个是天")
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    prefix=st.sampled_from(["", *_ALL_PHRASES]),
    unit=st.text(alphabet=_CHARS, min_size=1, max_size=6),
    tail=st.text(alphabet=_CHARS, max_size=20),
)
def test_generated_text_is_linear(prefix: str, unit: str, tail: str) -> None:
    """A phrase, then a short generated unit repeated to the limit, then a generated tail."""
    body = MAX_TEXT_CHARS - len(prefix) - len(tail)
    text = prefix + (unit * (body // len(unit) + 1))[:body] + tail
    calls: list[tuple[str, Callable[[], object]]] = [
        (name, _scan(pattern, text)) for name, pattern in PATTERNS.items()
    ]
    calls += [(name, lambda fn=fn: fn(text)) for name, fn in FUNCTIONS.items()]
    seconds, name = _slowest(iter(calls))
    assert seconds <= CALL_BUDGET_S, f"{name}: {seconds:.3f} s on {_describe(text)}"
