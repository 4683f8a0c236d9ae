"""One key, many names: what a customer calls an order besides its number.

People name an order once with its number and its thing side by side -- "the oak bookcase
(order #40593)", "order 40593 (the kettle)", "my kettle order #40593" -- and from then on
often by the thing alone: "the bookcase turned up at last". Such an apposition ties the name
to the key, so a later turn naming the thing is about the key, and a question naming the
thing asks about the key. Read by grammar (a noun phrase in apposition to the key's
mention, its last two words: the head and one modifier), not from a list of products.
Pure: the RPC's turn index learns each turn's names once (``names_of``); a question only
looks them up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from memory.lexical import LexicalIndex, tokens_of
from memory.text import text_memo
from schemas import StoredTurn

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
    if not tokens or len(tokens[-1]) < 3 or any(ch.isdigit() for t in tokens for ch in t):
        return ()
    return tokens[-NAME_WORDS:]


Names = dict[str, frozenset[tuple[str, ...]]]  # key -> the names given it


def names_of(turns: Iterable[StoredTurn], known: Names | None = None) -> Names:
    """``known`` (not changed) with the names ``turns`` give their order and product keys."""
    out = dict(known or {})
    for turn in turns:
        for key in turn.entities:
            if key.startswith(_KINDS):
                found = names_in(turn.text, key)
                if found:
                    out[key] = out.get(key, frozenset()) | frozenset(found)
    return out


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
