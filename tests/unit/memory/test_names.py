"""``memory.names``: a key learns the names people give it in apposition, and a turn or a
question naming the thing alone is about the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt
import pytest

from memstream.memory.lexical import LexicalIndex, tokens_of
from memstream.memory.names import (
    Names,
    Untied,
    key_names,
    keys_named,
    named_rows,
    names_in,
    names_of,
    untied_statements,
)
from memstream.schemas import StoredTurn


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
        # A word that cannot be part of a name ends the phrase: none is left to name it.
        ("My receipt never mentions order #40593.", "order:40593", set()),
        ("The van still carries order #40593.", "order:40593", set()),
    ],
)
def test_names_in_apposition_to_the_key(text: str, key: str, names: set[tuple[str, ...]]) -> None:
    assert set(names_in(text, key)) == names


def test_a_long_run_before_the_key_is_read_in_a_bounded_window() -> None:
    text = "a " * 50_000 + "thing (order #123)"
    assert names_in(text, "order:123") == (("thing",),)


def turn(i: int, text: str, entities: list[str]) -> StoredTurn:
    return StoredTurn(
        event_id=f"e{i}",
        session_id="s1",
        role="user",
        text=text,
        ts=datetime(2025, 2, 3 + i, tzinfo=UTC),
        entities=entities,
    )


TURNS = [
    turn(0, "I ordered the oak bookcase (order #40593) today.", ["order:40593"]),
    turn(1, "Order #40593 is stuck at the depot.", ["order:40593"]),
    turn(2, "The bookcase arrived, the oak one, all good.", []),
    turn(3, "My kettle (order K-1) is fine.", ["order:K-1"]),
]
NAMES = names_of(TURNS)
LEXICAL = LexicalIndex()
for t in TURNS:
    LEXICAL.add(t.event_id, tokens_of(t.text))
POSITIONS = {t.event_id: i for i, t in enumerate(TURNS)}


def test_key_names_and_the_rows_that_name_the_thing() -> None:
    assert {"order:40593": {("oak", "bookcase")}, "order:K-1": {("kettle",)}} == NAMES
    assert key_names(["order:40593", "order:77"], NAMES) == [("oak", "bookcase")]
    assert named_rows(key_names(["order:40593"], NAMES), LEXICAL, POSITIONS) == {0, 2}


def test_names_learnt_from_more_turns_add_to_what_was_known() -> None:
    more = turn(4, "order 40593 (the bookshelf) again", ["order:40593"])
    grown = names_of([more], NAMES)
    assert grown["order:40593"] == {("oak", "bookcase"), ("bookshelf",)}
    assert NAMES["order:40593"] == {("oak", "bookcase")}  # not changed


def test_a_question_naming_the_thing_asks_about_its_key() -> None:
    assert keys_named(tokens_of("did the oak bookcase ever arrive?"), NAMES) == ["order:40593"]
    assert keys_named(tokens_of("where is the kettle?"), NAMES) == ["order:K-1"]
    assert keys_named(tokens_of("is the bookcase here?"), NAMES) == []  # half a name
    assert keys_named((), NAMES) == []


def test_having_every_term() -> None:
    assert LEXICAL.having(["oak", "bookcase"]) == {"e0", "e2"}
    assert LEXICAL.having(["oak", "kettle"]) == set()
    assert LEXICAL.having([]) == set()


def said(i: int, role: str, text: str, entities: list[str], session: str = "s1") -> StoredTurn:
    return turn(i, text, entities).model_copy(update={"role": role, "session_id": session})


@pytest.mark.parametrize(
    ("question", "answer", "names"),
    [
        # The question names the key, the answer the thing.
        (
            said(0, "user", "Is there an update on order #90118?", ["order:90118"]),
            said(1, "assistant", "I've sent a new one out for the oak bookcase.", []),
            {"order:90118": {("oak", "bookcase")}},
        ),
        # The question names the thing, the answer the key.
        (
            said(0, "user", "Any news on my stand mixer?", []),
            said(1, "assistant", "Order K-2211 was delivered on Thursday.", ["order:K-2211"]),
            {"order:K-2211": {("stand", "mixer")}},
        ),
        # The phrase ends at the first word that cannot be part of a name.
        (
            said(0, "user", "Where is order #5501 now?", ["order:5501"]),
            said(1, "assistant", "Sadly the office chair got stuck in Leeds.", []),
            {"order:5501": {("office", "chair")}},
        ),
        # "the parcel" could be any order's: it names none.
        (
            said(0, "user", "Is there an update on order #90118?", ["order:90118"]),
            said(1, "assistant", "The parcel is at the depot.", []),
            {},
        ),
        # Not a question, the same speaker, or another session: no answer.
        (
            said(0, "user", "Order #90118 is late.", ["order:90118"]),
            said(1, "assistant", "Sorry about the oak bookcase.", []),
            {},
        ),
        (
            said(0, "user", "Is there an update on order #90118?", ["order:90118"]),
            said(1, "user", "It's the oak bookcase.", []),
            {},
        ),
        (
            said(0, "user", "Is there an update on order #90118?", ["order:90118"]),
            said(1, "assistant", "Sorry about the oak bookcase.", [], session="s2"),
            {},
        ),
        # Both sides name a key: nothing to tie.
        (
            said(0, "user", "Is order #90118 the oak bookcase?", ["order:90118"]),
            said(1, "assistant", "No, order #777 is the oak bookcase.", ["order:777"]),
            {},
        ),
    ],
)
def test_an_answer_ties_the_thing_to_the_key_its_question_named(
    question: StoredTurn, answer: StoredTurn, names: dict[str, set[tuple[str, ...]]]
) -> None:
    assert names_of([question, answer]) == names
    # The same when the answer arrives in a later batch than its question.
    assert names_of([answer], before=question) == names


def test_an_answer_that_is_small_talk_or_an_attribute_names_nothing() -> None:
    question = said(0, "user", "Is there an update on order #90118?", ["order:90118"])
    answer = said(1, "assistant", "I've updated your delivery address.", [])
    assert names_of([question, answer], plain=[True, False]) == {}
    assert names_of([question, answer], plain=[True, True]) == {
        "order:90118": {("delivery", "address")}
    }


def test_an_answer_never_moves_a_name_another_key_has() -> None:
    known = {"order:777": frozenset({("oak", "bookcase")})}
    question = said(0, "user", "Is there an update on order #90118?", ["order:90118"])
    answer = said(1, "assistant", "I've sent a new one out for the oak bookcase.", [])
    assert names_of([question, answer], known) == known


def test_the_sellers_own_things_name_no_order() -> None:
    question = said(0, "user", "Any progress on order #3120?", ["order:3120"])
    answer = said(1, "assistant", "Let me look it up in our records first.", [])
    assert names_of([question, answer]) == {}


# --- a key nobody named, a name no key holds -------------------------------------------------


@dataclass(frozen=True)
class Chat:
    """The parts of a turn index ``untied_statements`` reads, built from turns in order."""

    docs: list[StoredTurn]
    standing: set[int] = field(default_factory=set)  # rows stating a standing attribute

    @property
    def salient(self) -> npt.NDArray[np.bool_]:
        return np.ones(len(self.docs), dtype=bool)

    @property
    def attribute(self) -> npt.NDArray[np.int8]:
        return np.array([0 if r in self.standing else -1 for r in range(len(self.docs))], np.int8)

    @property
    def by_entity(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for row, t in enumerate(self.docs):
            for key in t.entities:
                out.setdefault(key, []).append(row)
        return out

    @property
    def names(self) -> Names:
        return names_of(self.docs)


# One customer, two orders: Z-4411 is only ever called by its number, the teak wardrobe only
# by its thing; the bread maker is tied to Q-7 in one turn.
CHAT = Chat(
    [
        said(0, "user", "I paid for order Z-4411 this morning.", ["order:Z-4411"], "s1"),
        said(1, "user", "Your bread maker (order Q-7) came early.", ["order:Q-7"], "s1"),
        said(2, "assistant", "Order Z-4411 is waiting at the Leeds hub.", ["order:Z-4411"], "s2"),
        said(3, "user", "The teak wardrobe still has not come.", [], "s3"),
        said(4, "user", "My bread maker is broken now.", [], "s3"),
        said(5, "assistant", "The teak wardrobe left the hub at noon.", [], "s4"),
        said(6, "user", "Order Q-7 is going back.", ["order:Q-7"], "s4"),
    ]
)


def test_asked_by_a_number_nobody_named_the_newest_word_on_an_unclaimed_thing_comes() -> None:
    got = untied_statements(["order:Z-4411"], tokens_of("where is order Z-4411?"), CHAT)
    # The teak wardrobe's newest statement, not its older one; never the bread maker's:
    # Q-7 holds that name.
    assert got == Untied(newer=[5], asked=[0, 2])


def test_asked_by_an_unclaimed_thing_the_newest_word_on_a_nameless_number_comes() -> None:
    later = Chat([*CHAT.docs, said(7, "agent", "Order Z-4411 was signed for.", ["order:Z-4411"])])
    got = untied_statements([], tokens_of("did my teak wardrobe arrive?"), later)
    assert got == Untied(newer=[7], asked=[3, 5])
    # Nothing about Z-4411 after the wardrobe's newest statement: nothing newer to show.
    assert untied_statements([], tokens_of("did my teak wardrobe arrive?"), CHAT).newer == []


def test_a_named_order_or_a_user_with_no_orders_brings_nothing_in() -> None:
    assert untied_statements(["order:Q-7"], tokens_of("order Q-7?"), CHAT).newer == []
    talk = Chat([said(0, "user", "The garden party was lovely.", [])])
    assert untied_statements([], tokens_of("how was the garden party?"), talk).newer == []
    # A question naming neither a nameless number nor an unclaimed thing.
    assert untied_statements([], tokens_of("any news on the bread maker?"), CHAT).newer == []


def test_a_standing_attribute_is_no_statement_about_a_thing() -> None:
    chat = Chat(
        [*CHAT.docs[:5], said(5, "user", "Please leave the parcel with the porter.", [])],
        standing={5},
    )
    assert untied_statements(["order:Z-4411"], tokens_of("order Z-4411?"), chat).newer == [3]
