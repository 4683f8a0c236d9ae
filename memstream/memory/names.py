"""One key, many names: what a customer calls an order besides its number.

People name an order once with its number and its thing side by side -- "the oak bookcase
(order #40593)", "order 40593 (the kettle)", "my kettle order #40593" -- and from then on
often by the thing alone: "the bookcase turned up at last". Such an apposition ties the name
to the key, so a later turn naming the thing is about the key, and a question naming the
thing asks about the key. Read by grammar (a noun phrase in apposition to the key's
mention, its last two words: the head and one modifier), not from a list of products.

A question and its answer tie a name to a key too: "Is there an update on order #90118?"
answered by "I've sent a replacement out for the oak bookcase." (or "Any news on my stand
mixer?" answered by "Order K-2211 was delivered on Thursday."). The side that names no key
gives its first definite noun phrase ("the oak bookcase", "my stand mixer"), read up to the
first function word or punctuation, not from a list of products.

Where no turn ties them, an order number nobody gave a name and a thing no number holds
may still be one order (asked by one, said by the other in a later chat): the newer
statements by the other name are candidates for a question with the ones it asked by
(``untied_statements``); ``memory.candidates`` brings those that say something like them,
never above them.

Pure: the RPC's turn index learns each turn's names once (``names_of``); a question only
looks them up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.memory.lexical import LexicalIndex, tokens_of
from memstream.memory.text import text_memo, word_set
from memstream.schemas import StoredTurn

NAME_WORDS = 2  # an English noun phrase ends in its head: "oak bookcase", "office chair"
WINDOW = 80  # characters read on each side of a key's mention
MARKER_WINDOW = 24  # "(order no. #" and the like, right before the key
_KINDS = ("order:", "product:")  # keys a thing is ordered or sold under

_DET = r"(?:the|my|your|our|his|her|their|this|that|a|an)"
_WORD = rf"(?!{_DET}\b)[a-z][a-z'-]*"  # the phrase after the nearest determiner only
_WORDS = rf"((?:{_WORD}\s+){{0,3}}{_WORD})"
# One marker word or sign at the end: stripped one at a time (a run of them matched at once
# is searched from every start, the square of the text's length).
_MARKER_END = re.compile(r"(?:\b(?:order|ref|reference|number|no)\b\.?|[#:\s])\Z", re.IGNORECASE)
# "the oak bookcase (order #40593)": the phrase closes right before the bracket.
_BEFORE_BRACKET = re.compile(rf"\b{_DET}\s+{_WORDS}\s*\($", re.IGNORECASE)
# "my kettle order #40593": the thing names the order.
_BEFORE_ORDER = re.compile(rf"\b{_DET}\s+{_WORDS}\s+order\s*#?\s*$", re.IGNORECASE)
# "order 40593 (the kettle)".
_AFTER_BRACKET = re.compile(rf"^\s*\(\s*(?:{_DET}\s+)?{_WORDS}\s*\)", re.IGNORECASE)


def names_in(text: str, key: str) -> tuple[tuple[str, ...], ...]:
    """The names ``text`` gives ``key`` (``order:40593``) in apposition to its mention, each
    as its BM25 tokens (``("oak", "bookcase")``); none when the text only names the key."""
    return _names_in(text, key)


@text_memo
def _names_in(text: str, key: str) -> tuple[tuple[str, ...], ...]:
    ident = key.partition(":")[2]
    if not ident:
        return ()
    found: list[tuple[str, ...]] = []
    for m in re.finditer(rf"(?<![\w-]){re.escape(ident)}(?![\w-])", text, re.IGNORECASE):
        # Bounded windows: each pattern is anchored at one end, so a search costs O(window).
        before, after = (
            text[max(0, m.start() - WINDOW) : m.start()],
            text[m.end() : m.end() + WINDOW],
        )
        for phrase in (
            _BEFORE_BRACKET.search(_without_marker(before)),
            _BEFORE_ORDER.search(before),
            _AFTER_BRACKET.match(after),
        ):
            name = _name(phrase.group(1)) if phrase else ()
            if name and name not in found:
                found.append(name)
    return tuple(found)


def _without_marker(before: str) -> str:
    """``before`` without the words that mark the key ("order no. #") at its end."""
    cut = max(0, len(before) - MARKER_WINDOW)
    tail = before[cut:]
    while marker := _MARKER_END.search(tail):
        tail = tail[: marker.start()]
    return before[:cut] + tail


def _name(phrase: str) -> tuple[str, ...]:
    tokens = tokens_of(phrase)
    if len(tokens) != len(phrase.split()):  # "a question about order 555": not a noun phrase
        return ()
    if any(word in _NOT_IN_A_NAME for word in phrase.lower().split()):
        return ()  # "the tracking says order #555": a verb ends a noun phrase
    if not tokens or len(tokens[-1]) < 3 or any(ch.isdigit() for t in tokens for ch in t):
        return ()
    return tokens[-NAME_WORDS:]


# A definite noun phrase: "the oak bookcase", "my stand mixer". The phrase ends at the first
# word that cannot be part of it -- a function word, a participle ("-ed"), a contraction -- or
# at punctuation; its name is its last two words, as in apposition. Not "our": in a support
# chat that is the seller's own (our system, our team, our warehouse), never the order.
_DEFINITE = re.compile(r"\b(?:the|my|your)\s+((?:[a-z][a-z-]*\s+){0,3}[a-z][a-z-]*)", re.I)
_NOT_IN_A_NAME = word_set(
    """is was were are be been being has have had do does did will would can could should
    may might must shall to for from with on in at by of off out up down into onto over about
    as and or but so that which who whose when where while if than then i you we they it he
    she me us them him her this these those there here still now yet never ever again not
    just already also too very really got get gets came come comes went go goes left says
    said arrived"""
)
# Words for the shipment itself: "the parcel" could be any order's, so it names none.
_ANY_ORDER = word_set(
    "parcel package order delivery item items box shipment replacement refund thing stuff"
    " tracking courier driver"
)


@text_memo
def _definite_name(text: str) -> tuple[str, ...]:
    """The name of the first definite noun phrase in ``text`` naming a particular thing,
    or ``()``."""
    for m in _DEFINITE.finditer(text):
        words: list[str] = []
        for word in m.group(1).lower().split():
            if word in _NOT_IN_A_NAME or word.endswith("ed"):
                break
            words.append(word)
        name = _name(" ".join(words)) if words else ()
        if name and not set(name) <= _ANY_ORDER:
            return name
    return ()


def _thing_keys(turn: StoredTurn) -> list[str]:
    return [k for k in turn.entities if k.startswith(_KINDS)]


def _answer_name(question: StoredTurn, answer: StoredTurn) -> tuple[str, tuple[str, ...]] | None:
    """(key, name) when ``answer`` answers ``question`` and one of them names a key, the other
    the thing: "Is there an update on order #90118?" -> "... for the oak bookcase."."""
    if (
        question.session_id != answer.session_id
        or question.role == answer.role
        or "?" not in question.text
    ):
        return None
    asked, told = _thing_keys(question), _thing_keys(answer)
    if len(asked) == 1 and not told:
        key, named = asked[0], _definite_name(answer.text)
    elif len(told) == 1 and not asked:
        key, named = told[0], _definite_name(question.text)
    else:
        return None
    return (key, named) if named else None


Names = dict[str, frozenset[tuple[str, ...]]]  # key -> the names given it


def names_of(
    turns: Sequence[StoredTurn],
    known: Names | None = None,
    *,
    before: StoredTurn | None = None,
    plain: Sequence[bool] | None = None,
) -> Names:
    """``known`` (not changed) with the names ``turns`` give their order and product keys.

    ``before``: the turn right before the first of ``turns`` (a question they may answer);
    ``plain[i]``: whether ``turns[i]`` may name a thing by answering (it says something and
    states no standing attribute: "I've updated your delivery address" names no order).
    """
    out = dict(known or {})

    def add(key: str, found: Iterable[tuple[str, ...]]) -> None:
        out[key] = out.get(key, frozenset()) | frozenset(found)

    for i, turn in enumerate(turns):
        for key in _thing_keys(turn):
            found = names_in(turn.text, key)
            if found:
                add(key, found)
        previous = turns[i - 1] if i else before
        plain_pair = plain is None or (plain[i] and (i == 0 or plain[i - 1]))
        if previous is not None and plain_pair:
            answered = _answer_name(previous, turn)
            if answered is not None and not _named_elsewhere(out, *answered):
                add(answered[0], [answered[1]])
    return out


def _named_elsewhere(names: Names, key: str, name: tuple[str, ...]) -> bool:
    """Whether another key already has ``name``: an answer never moves a name."""
    return any(name in found for k, found in names.items() if k != key)


def key_names(keys: Iterable[str], names: Names) -> list[tuple[str, ...]]:
    """The names of ``keys``, each once, in a stable order."""
    return sorted({n for k in keys for n in names.get(k, ())})


def keys_named(query_tokens: Sequence[str], names: Names) -> list[str]:
    """The keys a question names by one of their names ("is the oak bookcase here yet?" ->
    ``order:40593``), sorted."""
    asked = set(query_tokens)
    if not asked:
        return []
    return sorted(k for k, found in names.items() if any(asked.issuperset(n) for n in found))


def named_rows(
    names: Iterable[tuple[str, ...]], lexical: LexicalIndex, positions: Mapping[str, int]
) -> set[int]:
    """Rows whose turn holds every word of one of ``names``."""
    return {positions[d] for n in names for d in lexical.having(n) if d in positions}


# --- a key nobody named, a name no key holds -------------------------------------------------

UNTIED_ROWS = 6  # newer statements an untied name brings in: one a thing, a handful at most
UNTIED_HORIZON = 512  # newest rows read for them


class ThingRows(Protocol):
    """The parts of the RPC's turn index read here (rows in time order)."""

    @property
    def docs(self) -> list[StoredTurn]: ...
    @property
    def salient(self) -> npt.NDArray[np.bool_]: ...
    @property
    def attribute(self) -> npt.NDArray[np.int8]: ...  # the standing attribute (-1: none)
    @property
    def by_entity(self) -> dict[str, list[int]]: ...
    @property
    def names(self) -> Names: ...


@dataclass(frozen=True)
class Untied:
    """Newer statements that may be about the order asked for (``newer``, newest first) and
    the rows about it by the name it was asked by (``asked``), which they may supersede."""

    newer: list[int]
    asked: list[int]


NONE_UNTIED = Untied([], [])


def untied_statements(keys: Sequence[str], query_tokens: Sequence[str], turns: ThingRows) -> Untied:
    """The statements that may be about the order a question asks for though no turn ties
    the name they use to the one it asks by.

    One order is often called by its number in one chat and by its thing in another, and
    no turn says both. Then an order number nobody gave a name and a thing no number holds
    may be one order, and the newest statement using the other name may be its newest
    state: asked by a key that has no name (``keys``), the newest statement about each
    thing no key holds that came after the key's newest mention; asked by a thing no key
    holds, the newest statement about each key that has no name that came after the thing's
    newest mention. A name that is some other key's rules its statements out."""
    start = max(0, len(turns.docs) - UNTIED_HORIZON)
    nameless = [k for k in turns.by_entity if k.startswith(_KINDS) and not turns.names.get(k)]
    if not nameless:
        return NONE_UNTIED
    asked_keys = [k for k in keys if k.startswith(_KINDS)]
    if any(turns.names.get(k) for k in asked_keys):
        return NONE_UNTIED  # its names find its statements
    claimed = {n for found in turns.names.values() for n in found}
    things = _untied_things(turns, start, claimed)
    if asked_keys:
        asked = sorted({r for k in asked_keys for r in turns.by_entity.get(k, ())})
        if not asked:
            return NONE_UNTIED  # a key never mentioned: nothing to be newer than
        latest = (max(rows) for rows in things.values())
    else:
        words = set(query_tokens)
        asked = sorted({r for n, rows in things.items() if words.issuperset(n) for r in rows})
        if not asked:
            return NONE_UNTIED
        latest = (max(turns.by_entity[k]) for k in nameless)
    newer = sorted({r for r in latest if r > asked[-1] and r >= start}, reverse=True)
    return Untied(newer[:UNTIED_ROWS], asked) if newer else NONE_UNTIED


def _untied_things(
    turns: ThingRows, start: int, claimed: set[tuple[str, ...]]
) -> dict[tuple[str, ...], list[int]]:
    """Name -> the rows (from ``start``) naming it, for each thing a statement that names no
    key speaks of and no key holds as a name."""
    out: dict[tuple[str, ...], list[int]] = {}
    for row in range(start, len(turns.docs)):
        turn = turns.docs[row]
        if not turns.salient[row] or turns.attribute[row] >= 0 or _thing_keys(turn):
            continue
        name = _definite_name(turn.text)
        if name and name not in claimed:
            out.setdefault(name, []).append(row)
    return out
