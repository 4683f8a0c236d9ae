"""Values of memstream.events, memstream.encoded, memstream.feedback and memstream.control."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from memstream.schemas.common import Identifier, Model, TenantId, Text, Timestamp, UserId
from memstream.schemas.identity import UserKeyed

Role = Literal["user", "assistant", "system"]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class EventMetadata(Model):
    importance: float = Field(0.5, ge=0.0, le=1.0)
    pin: bool = False
    tags: list[Tag] = Field(default_factory=list, max_length=32)
    speaker: Annotated[str, StringConstraints(max_length=128)] | None = None
    channel: Annotated[str, StringConstraints(max_length=64)] | None = None


class InteractionEvent(UserKeyed, Model):
    """One conversation turn, as a bot publishes it. Keyed ``user_key``."""

    event_id: Identifier
    tenant_id: TenantId
    user_id: UserId
    session_id: Identifier
    role: Role
    text: Text
    ts: Timestamp
    metadata: EventMetadata = EventMetadata()


class EncodedEvent(Model):
    """An event with its L2-normalised sentence embedding (float32 values)."""

    event: InteractionEvent
    embedding: list[float] = Field(min_length=1, max_length=4096)
    model_id: str

    @property
    def user_key(self) -> str:
        return self.event.user_key


class Feedback(UserKeyed, Model):
    """Memories and turns that a retrieval handed to an agent (strength boosts).

    ``feedback_id`` names the retrieval, so a redelivered message boosts once; when a
    publisher leaves it out, the consumer derives one from the message's content.
    """

    feedback_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    tenant_id: TenantId
    user_id: UserId
    memory_ids: list[str] = Field(default_factory=list, max_length=256)
    turn_ids: list[str] = Field(default_factory=list, max_length=256)
    ts: Timestamp


class Control(UserKeyed, Model):
    """Operator or API commands every stage obeys."""

    tenant_id: TenantId
    user_id: UserId
    action: Literal["forget_user", "pin_memory"]
    memory_id: str | None = None
    ts: Timestamp
