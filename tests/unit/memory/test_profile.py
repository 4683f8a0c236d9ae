"""``memory.profile``: which turn states a standing attribute, and a question about one
reads its newest statements first."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from memstream.memory.profile import (
    ATTRIBUTES,
    MIN_QUESTION_COSINE,
    NEWEST,
    NO_ATTRIBUTE,
    SEEDS,
    asked_attribute,
    attributes_of,
    lift_attributes,
)
from memstream.memory.text import extract_entities
from memstream.memory.vectors import LabelledRows
from memstream.schemas import StoredTurn

T0 = datetime(2025, 3, 1, tzinfo=UTC)
DELIVERY, CONTACT = ATTRIBUTES.index("delivery"), ATTRIBUTES.index("contact")
# One exemplar each, on the first two axes.
PROTOTYPES = LabelledRows(np.eye(2, 4, dtype=np.float32), ("delivery", "contact"))


def turn(text: str, role: str = "user") -> StoredTurn:
    return StoredTurn(
        event_id=text[:8],
        session_id="s",
        role=role,
        text=text,
        ts=T0,
        entities=extract_entities(text),
    )


def unit(*values: float) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[: len(values)] = values
    out: np.ndarray = v / np.linalg.norm(v)
    return out


@pytest.mark.parametrize(
    ("text", "attribute"),
    [
        ("Reach me at kim.lee@example.org from now on.", "email"),
        ("New mobile: 07700 900123.", "phone"),
        ("We moved to 4 Mill Lane, Leeds LS6 2AB last week.", "address"),
        ("Is my email still kim.lee@example.org?", None),  # asks, states nothing
    ],
)
def test_a_value_with_a_shape_names_its_attribute(text: str, attribute: str | None) -> None:
    found = attributes_of([turn(text)], unit(0, 0, 1)[None, :], PROTOTYPES)
    assert found.tolist() == [ATTRIBUTES.index(attribute) if attribute else NO_ATTRIBUTE]


def test_a_standing_instruction_by_its_meaning_not_a_question_or_a_promise() -> None:
    turns = [
        turn("Pop it behind the garden wall when I'm out."),
        turn("Could you stick to texts, not calls?"),  # a request, not a question
        turn("Where do couriers usually leave it?"),
        turn("We'll ring you on Monday with news.", role="assistant"),  # a one-off promise
        turn("Pop it behind the garden wall when I'm out."),
    ]
    vectors = np.stack([unit(1, 0.2), unit(0.1, 1), unit(1, 0), unit(0, 1), unit(0.3, 0, 1)])
    assert attributes_of(turns, vectors, PROTOTYPES).tolist() == [
        DELIVERY,
        CONTACT,
        NO_ATTRIBUTE,
        NO_ATTRIBUTE,
        NO_ATTRIBUTE,  # too far from every exemplar
    ]
    assert attributes_of(turns, vectors, None).tolist() == [NO_ATTRIBUTE] * 5


def test_a_question_about_an_attribute_lifts_its_newest_statements() -> None:
    relevance = np.array([0.9, 0.2, 0.1, 0.05, 0.3, 0.4])
    attribute = np.array([CONTACT, CONTACT, CONTACT, CONTACT, NO_ATTRIBUTE, DELIVERY], np.int8)
    ts = (T0.timestamp() + 86_400.0 * np.arange(6)).astype(np.float64)
    ts[0] = T0.timestamp() - 86_400.0  # the best hit is the oldest statement
    lifted = lift_attributes(relevance, attribute, ts)
    assert lifted[[1, 2, 3]].tolist() == [0.9] * NEWEST  # the newest three contact turns
    assert lifted[0] == 0.9
    assert lifted[4] == 0.3
    assert lifted[5] == 0.4  # the only delivery turn: as relevant as it was
    assert relevance[1] == 0.2  # a new array, the input untouched


def test_nothing_to_lift_without_attributes() -> None:
    relevance = np.array([0.5, 0.1])
    none = np.full(2, NO_ATTRIBUTE, np.int8)
    np.testing.assert_array_equal(lift_attributes(relevance, none, np.zeros(2)), relevance)
    assert lift_attributes(np.zeros(0), none[:0], np.zeros(0)).size == 0


def test_a_question_is_about_the_attribute_of_its_nearest_question_exemplar() -> None:
    questions = LabelledRows(np.eye(2, 4, dtype=np.float32), ("phone", "contact"))
    assert asked_attribute(unit(1, 0.1), questions) == ATTRIBUTES.index("phone")
    assert asked_attribute(unit(0.2, 1), questions) == CONTACT
    far = unit(1, 0, 2)  # nearest is phone, but not close enough
    assert float(far[0]) < MIN_QUESTION_COSINE
    assert asked_attribute(far, questions) == NO_ATTRIBUTE
    assert asked_attribute(unit(1), None) == NO_ATTRIBUTE


def test_the_attribute_asked_about_lifts_its_statements_though_no_best_turn_states_it() -> None:
    phone = ATTRIBUTES.index("phone")
    n = SEEDS + 5
    relevance = np.linspace(1.0, 0.5, n)
    relevance[-4:] = [0.01, 0.02, 0.03, 0.04]  # the phone statements: never among the seeds
    attribute = np.full(n, NO_ATTRIBUTE, np.int8)
    attribute[-4:] = phone
    ts = T0.timestamp() + 60.0 * np.arange(n, dtype=np.float64)
    np.testing.assert_array_equal(lift_attributes(relevance, attribute, ts), relevance)
    lifted = lift_attributes(relevance, attribute, ts, asked=phone)
    assert lifted[-NEWEST:].tolist() == [1.0] * NEWEST  # the newest three, to the best's
    assert lifted[-4] == 0.01  # the oldest stays
    np.testing.assert_array_equal(lifted[:-4], relevance[:-4])
