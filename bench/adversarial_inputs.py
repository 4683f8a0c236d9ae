"""Inputs built to make a backtracking regex slow, and the per-turn text functions they are
aimed at: shared by the linear-time test (``tests/unit/memory/test_linear_time.py``) and
the benchmark (``bench.adversarial_cost``), which times the slowest function on them. Pure
and deterministic: no timing here, only the texts and the functions.

Python's ``re`` backtracks, so a pattern with two quantifiers that can read the same
characters (``\\s+[\\w ]{1,40}?\\s+``, or ``\\d+`` tried at every start of a digit run) costs
the square of a long run of those characters. The inputs are therefore long runs of each
character class, repeated pairs ("a a a ..."), and each pattern's own literal phrases
("welcome to", "订单号") followed by such runs, so that the match gets as far as the
repeated part before it fails.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from types import ModuleType

# A single character, or a short unit, repeated to the limit. Each class a pattern may
# repeat over: spaces, letters, digits, CJK numerals and ideographs, punctuation, NUL (the
# entity scanner's mask), and mixtures that alternate a word and a separator.
RUN_UNITS: tuple[str, ...] = (
    " ", "\n", "\t", "a", "A", "1", "_", "'", "-", ".", ",", "#", ":", "!", "?", "@", "/",
    "\x00", "一", "十", "号", "。",
    "a ", "1 ", "a-", "1-", "a.", "1.", "a'", "a1", "1a", "a@", "a:", "#1", "a, ",
    "a1 ", "1 a ", "ab-", "一 ", "1个", "is ", "no ", "the ", "a\n",
)  # fmt: skip
# What follows a pattern's literal phrase: the runs most patterns repeat over.
PHRASE_RUNS: tuple[str, ...] = (" ", "a", "1", "a ", "1 ", ":")

MEMORY_MODULES: tuple[str, ...] = (
    "memstream.memory.cluster_describe",
    "memstream.memory.due",
    "memstream.memory.extractive",
    "memstream.memory.names",
    "memstream.memory.phrases",
    "memstream.memory.profile",
    "memstream.memory.promises",
    "memstream.memory.ranking",
    "memstream.memory.text",
    "memstream.memory.when",
)

# ``\\s`` (with its quantifier) joins two words of a phrase; any other escape (``\\w``,
# ``\\b``, ``\\.``), a group's syntax, a character class or a count ends one.
_SPACE_ESCAPE = re.compile(r"\\s[+*?]?")
_OTHER_ESCAPE = re.compile(r"\\.")
_GROUP_SYNTAX = re.compile(r"\(\?(?:P<\w+>|P=\w+\)|[:=!]|<[=!]|[aiLmsux-]+[:)])|\{\d*,?\d*\}")
_CHAR_CLASS = re.compile(r"\[(?:\\.|[^\]])*\]")
_PHRASE = re.compile(r"[^\W\d_](?:[^\W\d_]|'|\x01|[ \t]+(?=[^\W\d_]))*")


def _fill(unit: str, length: int) -> str:
    return (unit * (length // len(unit) + 1))[:length]


def literal_phrases(pattern: re.Pattern[str]) -> list[str]:
    """The words a pattern spells out, joined into phrases where ``\\s`` (or a space) joins
    them: ``\\b(?:welcome\\s+to|this\\s+is\\s+\\w+)`` gives "welcome to", "this is". In
    source order, unique; a heuristic on the pattern's text, not a parser."""
    source = pattern.pattern
    if pattern.flags & re.VERBOSE:  # whitespace and comments are not the pattern's
        source = re.sub(r"(?m)\s+|#.*$", "", source)
    source = _OTHER_ESCAPE.sub("|", _SPACE_ESCAPE.sub("\x01", source))
    source = _CHAR_CLASS.sub("|", _GROUP_SYNTAX.sub("|", source))
    phrases = [" ".join(m.group(0).replace("\x01", " ").split()) for m in _PHRASE.finditer(source)]
    return list(dict.fromkeys(p for p in phrases if p))


def module_patterns(modules: Iterable[str] = MEMORY_MODULES) -> dict[str, re.Pattern[str]]:
    """Every compiled pattern held at module level by ``modules`` (already imported by the
    caller), also inside tuples, lists and dicts (``phrases._STATES``), by a readable name."""
    found: dict[str, re.Pattern[str]] = {}

    def walk(name: str, value: object) -> None:
        if isinstance(value, re.Pattern):
            if isinstance(value.pattern, str) and value not in found.values():
                found[name] = value
        elif isinstance(value, tuple | list | frozenset | set):
            for i, item in enumerate(value):
                walk(f"{name}[{i}]", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{name}[{key!r}]", item)

    for module_name in modules:
        module = sys.modules.get(module_name)
        if not isinstance(module, ModuleType):
            continue
        for attr, value in vars(module).items():
            walk(f"{module_name}.{attr}", value)
    return found


def runs(limit: int) -> list[str]:
    """Each ``RUN_UNITS`` unit repeated to ``limit`` characters."""
    return [_fill(unit, limit) for unit in RUN_UNITS]


def pattern_texts(pattern: re.Pattern[str], limit: int) -> list[str]:
    """The inputs aimed at one pattern: every run, and each of its literal phrases followed
    by each ``PHRASE_RUNS`` run (and repeated), all of ``limit`` characters."""
    texts = runs(limit)
    for phrase in literal_phrases(pattern):
        texts += [phrase + _fill(run, limit - len(phrase)) for run in PHRASE_RUNS]
        texts.append(_fill(phrase + " ", limit))
    return list(dict.fromkeys(texts))


# The phrases of all patterns are many (~650): for the per-turn functions they are packed,
# ``PACKED_PHRASES`` to a text, each followed by a run of its share of the length. A pattern
# that is quadratic on a run of 1,000 still costs ~1/8 of its full-length worst there (the
# full-length runs after each phrase are ``pattern_texts``, run pattern by pattern).
PACKED_PHRASES = 8
PACKED_RUNS: tuple[str, ...] = (" ", "1 ", "a ")


def adversarial_texts(limit: int) -> list[str]:
    """The deterministic adversarial inputs of ``limit`` characters for the per-turn
    functions: every run, and the literal phrases of every pattern of memory/ packed with
    runs after them. Unique, in a fixed order."""
    _import_all()
    phrases = list(
        dict.fromkeys(
            phrase for pattern in module_patterns().values() for phrase in literal_phrases(pattern)
        )
    )
    share = limit // PACKED_PHRASES
    packed = []
    for run in PACKED_RUNS:
        for i in range(0, len(phrases), PACKED_PHRASES):
            text = "".join(p + _fill(run, share - len(p)) for p in phrases[i : i + PACKED_PHRASES])
            packed.append(text[:limit] + _fill(run, limit - len(text)))
    return list(dict.fromkeys([*runs(limit), *packed]))


def _import_all() -> None:
    import importlib

    for name in MEMORY_MODULES:
        importlib.import_module(name)


# Speakers a user may have (the retrieval checks which of them a query names): many, and
# some the adversarial texts are made of.
SPEAKERS: tuple[str, ...] = (
    *(f"speaker{i}" for i in range(2_000)),
    *("a", "1", "a a", "a-1", "Mary Ann", "O'Brien"),
)
_TURN_TIME = datetime(2026, 3, 3, 12, 0)


def per_turn_functions() -> dict[str, Callable[[str], object]]:
    """The text functions of memory/ that run on every turn (``decide_event`` and the stored
    turn), on every sentence of a consolidation (states, promises, due times), or on every
    query (speaker names, "latest"), by name: each takes the one text."""
    from memstream.memory.cluster_describe import terms_of
    from memstream.memory.due import parse_due
    from memstream.memory.lexical import tokens_of
    from memstream.memory.names import names_in
    from memstream.memory.phrases import action_family, find_state, is_commitment, norm
    from memstream.memory.promises import promise_sentence, reports_done
    from memstream.memory.ranking import _named_speakers, asks_for_latest, strip_names
    from memstream.memory.text import (
        extract_entities,
        is_remember_request,
        is_salient,
        is_small_talk,
        phrase_keys,
        tokenize,
    )
    from memstream.memory.when import annotate_times

    return {
        "is_salient": is_salient,
        "is_salient(common)": lambda text: is_salient(text, frozenset({"0" * 16})),
        "is_remember_request": is_remember_request,
        "extract_entities": extract_entities,
        "phrase_keys": phrase_keys,
        "tokenize": tokenize,
        "tokens_of": tokens_of.__wrapped__,  # unmemoised: a benchmark calls it again
        "terms_of": terms_of,
        "parse_due": lambda text: parse_due(text, _TURN_TIME),
        "annotate_times": lambda text: annotate_times(text, _TURN_TIME),
        "names_in": lambda text: names_in(text, "order:C-73120"),
        "find_state": find_state,
        "is_commitment(user)": lambda text: is_commitment(text, "user"),
        "is_commitment(assistant)": lambda text: is_commitment(text, "assistant"),
        "promise_sentence": lambda text: promise_sentence(text, "assistant"),
        "reports_done": reports_done,
        "is_small_talk": is_small_talk,
        "action_family": action_family,
        "norm": norm,
        "asks_for_latest": asks_for_latest,
        "named_speakers": lambda text: _named_speakers.__wrapped__(text, SPEAKERS),
        "strip_names": lambda text: strip_names(text, frozenset(SPEAKERS)),
    }
