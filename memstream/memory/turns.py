"""A turn as memstream keeps it: the same record in the hot tier (Redis) and the archive."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memstream.memory.acts import DESCRIPTIONS
from memstream.memory.chatter import Prototypes
from memstream.memory.formulaic import line_key
from memstream.memory.profile import EXEMPLARS, QUESTIONS
from memstream.memory.promises import is_promise, reports_done
from memstream.memory.text import extract_entities, is_remember_request, is_small_talk
from memstream.memory.vectors import FloatArray, LabelledRows
from memstream.schemas import InteractionEvent, StoredTurn


@dataclass(frozen=True)
class Exemplars:
    """What a turn is compared with by meaning -- chatter (``memory.chatter``), standing
    attributes (``memory.profile``) and the acts a report describes (``memory.acts``) --
    embedded once by the encoder that embeds the turns."""

    chatter: Prototypes
    attributes: LabelledRows  # labels: ``memory.profile.ATTRIBUTES``
    acts: LabelledRows  # labels: the acts of ``memory.acts.DESCRIPTIONS``
    questions: LabelledRows  # questions about each attribute (``memory.profile.QUESTIONS``)

    @classmethod
    def build(cls, encode: Callable[[Sequence[str]], FloatArray]) -> Exemplars:
        return cls(
            Prototypes.build(encode),
            LabelledRows.build(EXEMPLARS, encode),
            LabelledRows.build(DESCRIPTIONS, encode),
            LabelledRows.build(QUESTIONS, encode),
        )


def stored_turn(
    event: InteractionEvent,
    *,
    cluster_id: str | None = None,
    entities: Sequence[str] | None = None,
) -> StoredTurn:
    """``event`` as a stored turn; ``entities`` when the caller has extracted them already.

    Pinned: the event asks for it, or says "remember this". The archive stores no cluster
    (a turn's cluster moves on merges and splits; Redis keeps the current one).
    """
    return StoredTurn(
        event_id=event.event_id,
        session_id=event.session_id,
        role=event.role,
        text=event.text,
        ts=event.ts,
        speaker=event.metadata.speaker,
        cluster_id=cluster_id,
        entities=list(extract_entities(event.text) if entities is None else entities),
        importance=event.metadata.importance,
        pinned=event.metadata.pin or is_remember_request(event.text),
    )


def says_something(turn: StoredTurn) -> bool:
    """Whether a turn may take a reader's budget: greetings, thanks, sign-offs and
    acknowledgements (``memory.text.is_small_talk``) never do, unless the turn was pinned."""
    return turn.pinned or not is_small_talk(turn.text)


def promises(turn: StoredTurn) -> bool:
    """Whether the turn commits the agent to something for the customer (``memory.promises``)."""
    return is_promise(turn.text, turn.role)


def reports_something_done(turn: StoredTurn) -> bool:
    """Whether the turn says something promised happened (``memory.promises.reports_done``)."""
    return reports_done(turn.text)


def said_as(turn: StoredTurn) -> int:
    """The turn's words as one number (``memory.formulaic.line_key``)."""
    return line_key(turn.text)
