"""``memory.names``: a key learns the names people give it in apposition, and a turn or a
question naming the thing alone is about the key."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from memory.lexical import LexicalIndex, tokens_of
from memory.names import key_names, keys_named, named_rows, names_in


@pytest.mark.parametrize(
    ("text", "key", "names"),
    [
        ("I bought the walnut desk (order #40593) last week.", "order:40593", {("walnut", "desk")}),
        ("order 12345 (the standing lamp) is late", "order:12345", {("standing", "lamp")}),
        ("my blue kettle order #12345 never came", "order:12345", {("blue", "kettle")}),
        # The nearest determiner bounds the phrase: "says" is not part of the name.
        ("The app says the toaster (order K-2211) left.", "order:K-2211", {("toaster",)}),
        ("Order #40593 is lost somewhere after Leeds.", "order:40593", set()),
        ("I have a question about order 555 (urgent!)", "order:555", set()),  # not a name
        ("the desk (order #40593)", "order:99999", set()),  # another key's name
    ],
)
def test_names_in_apposition_to_the_key(text: str, key: str, names: set[tuple[str, ...]]) -> None:
    assert set(names_in(text, key)) == names


def test_a_long_run_before_the_key_is_read_in_a_bounded_window() -> None:
    text = "a " * 50_000 + "thing (order #123)"
    assert names_in(text, "order:123") == (("thing",),)


@dataclass
class Turns:
    texts: list[str]
    by_entity: dict[str, list[int]]
    lexical: LexicalIndex = field(default_factory=LexicalIndex)

    def __post_init__(self) -> None:
        for i, t in enumerate(self.texts):
            self.lexical.add(f"e{i}", tokens_of(t))

    @property
    def positions(self) -> dict[str, int]:
        return {f"e{i}": i for i in range(len(self.texts))}


TURNS = Turns(
    [
        "[3 Feb 2025] customer: I ordered the oak bookcase (order #40593) today.",
        "[9 Feb 2025] customer: Order #40593 is stuck at the depot.",
        "[2 Mar 2025] customer: The bookcase arrived, the oak one, all good.",
        "[4 Mar 2025] customer: My kettle (order K-1) is fine.",
    ],
    {"order:40593": [0, 1], "order:K-1": [3]},
)


def test_key_names_and_the_rows_that_name_the_thing() -> None:
    names = key_names(["order:40593", "order:77"], TURNS)
    assert names == {"order:40593": {("oak", "bookcase")}}
    assert named_rows(names["order:40593"], TURNS.lexical, TURNS.positions) == {0, 2}


def test_a_question_naming_the_thing_asks_about_its_key() -> None:
    assert keys_named(tokens_of("did the oak bookcase ever arrive?"), TURNS) == ["order:40593"]
    assert keys_named(tokens_of("where is the kettle?"), TURNS) == ["order:K-1"]
    assert keys_named(tokens_of("is the bookcase here?"), TURNS) == []  # half a name
    assert keys_named((), TURNS) == []


def test_having_every_term() -> None:
    assert TURNS.lexical.having(["oak", "bookcase"]) == {"e0", "e2"}
    assert TURNS.lexical.having(["oak", "kettle"]) == set()
    assert TURNS.lexical.having([]) == set()
