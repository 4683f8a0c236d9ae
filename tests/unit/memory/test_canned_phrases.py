"""``memory.memorize.canned_phrases``: the bot's canned lines are the user's own state -- an
assistant or system sentence this user heard before -- never tenant-wide counts (issue 14)."""

from __future__ import annotations

from datetime import UTC, datetime

from memstream.memory.memorize import canned_phrases, scripted_phrases
from memstream.memory.text import phrase_keys
from memstream.schemas import InteractionEvent

LINE = "Your parcel 123 is on its way. Anything else I can check for you today?"


def event(role: str, text: str = LINE) -> InteractionEvent:
    return InteractionEvent(
        event_id="e1",
        tenant_id="acme",
        user_id="u1",
        session_id="s1",
        role=role,
        text=text,
        ts=datetime(2024, 5, 1, tzinfo=UTC),
    )


def test_only_the_bots_sentences_are_recorded_as_heard() -> None:
    assert scripted_phrases(event("assistant")) == tuple(phrase_keys(LINE))
    assert scripted_phrases(event("system")) == tuple(phrase_keys(LINE))
    assert scripted_phrases(event("user")) == ()


def test_a_bot_sentence_heard_before_is_canned_whatever_its_numbers() -> None:
    heard = set(phrase_keys("Your parcel 9 is on its way."))
    assert canned_phrases(event("assistant"), heard) == frozenset(heard)
    assert canned_phrases(event("assistant"), set()) == frozenset()
    # The user saying it is never canned: a user repeating themselves is a recurrence.
    assert canned_phrases(event("user"), heard) == frozenset()
