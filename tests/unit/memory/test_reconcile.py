"""``memory.reconcile``: a memory is shown with the newest conversation about its keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
import pytest

from memstream.memory.reconcile import (
    MAX_LATEST,
    newer_conversation,
    newer_like_sources,
)
from memstream.memory.text import extract_entities, is_small_talk
from memstream.memory.turns import says_something
from memstream.schemas import StoredTurn

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Turns:
    docs: list[StoredTurn]

    @property
    def ts(self) -> npt.NDArray[np.float64]:
        return np.array([t.ts.timestamp() for t in self.docs])

    @property
    def salient(self) -> npt.NDArray[np.bool_]:
        return np.array([says_something(t) for t in self.docs], dtype=bool)

    @property
    def by_entity(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, t in enumerate(self.docs):
            for key in t.entities:
                out.setdefault(key, []).append(i)
        return out


def turns(*specs: tuple[float, str, str]) -> Turns:
    """(days after T0, session, text) per turn, in time order."""
    return Turns(
        [
            StoredTurn(
                event_id=f"e{i}",
                session_id=session,
                role="user",
                text=text,
                ts=T0 + timedelta(days=days),
                entities=extract_entities(text),
            )
            for i, (days, session, text) in enumerate(specs)
        ]
    )


STREAM = turns(
    (0, "s1", "My order C-73120 arrived with a cracked leg."),
    (0.01, "s1", "Thanks!"),
    (5, "s2", "Any news on order C-73120?"),
    (5.01, "s2", "The replacement leg was delivered this morning."),
    (5.02, "s2", "Thanks, bye!"),
    (6, "s3", "Also, can I change my password?"),
)


def test_the_newest_session_naming_a_key_leads_the_memory() -> None:
    rows = newer_conversation(["order:C-73120"], T0 + timedelta(days=1), STREAM)
    # s2 named the order last; its unnamed turns are left to newer_like_sources.
    assert rows == [2]


def test_a_memory_as_new_as_the_stream_gets_nothing() -> None:
    assert newer_conversation(["order:C-73120"], T0 + timedelta(days=5.5), STREAM) == []
    assert newer_conversation(["order:X-1"], T0, STREAM) == []
    assert newer_conversation([], T0, STREAM) == []


def test_at_most_max_latest_lines() -> None:
    long = turns(*[(i * 0.001, "s1", f"Order C-73120 update number {i} noted") for i in range(20)])
    rows = newer_conversation(["order:C-73120"], T0 - timedelta(days=1), long)
    assert rows == list(range(19, 19 - MAX_LATEST, -1))


@pytest.mark.parametrize(
    "text",
    ["Hello!", "Thanks, bye!", "Have a lovely day!", "You too, goodbye.", "ok", "谢谢", ";)"],
)
def test_greetings_thanks_and_sign_offs_are_small_talk(text: str) -> None:
    assert is_small_talk(text)


@pytest.mark.parametrize(
    "text", ["hiking in the mountains", "Paris.", "order 55123", "it broke", "我对乳胶过敏"]
)
def test_one_content_word_or_an_entity_is_not_small_talk(text: str) -> None:
    assert not is_small_talk(text)


def test_a_newer_turn_close_in_meaning_to_a_source_leads_whatever_its_words() -> None:
    stream = turns(
        (0, "s1", "Ship it to 27 Birch Lane please."),
        (3, "s2", "Can I also get the blue model?"),
        (9, "s3", "We moved: the new address is 8 Quarry Road."),
        (10, "s4", "Thanks!"),
    )
    vectors = np.array(
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.8, 0.0, 0.6], [0.9, 0.1, 0.0]], dtype=np.float32
    )
    since = T0 + timedelta(days=1)
    # cosines to the source: 0.0 (another subject), 0.8 (the same thing, newer), small talk
    assert newer_like_sources_rows(stream, vectors, since) == [2]
    assert newer_like_sources_rows(stream, vectors, T0 + timedelta(days=9.5)) == []


def newer_like_sources_rows(
    stream: Turns, vectors: npt.NDArray[np.float32], since: datetime
) -> list[int]:
    return newer_like_sources([0], since, stream, vectors, min_cosine=0.6)
