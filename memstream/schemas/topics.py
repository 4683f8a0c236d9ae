"""The topic table: every topic memstream reads or writes, its key and its value model."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from memstream.schemas.events import Control, EncodedEvent, Feedback, InteractionEvent
from memstream.schemas.memories import ConsolidatedMemory, DeadLetter, RecurrenceTrigger, Reminder


@dataclass(frozen=True)
class Topic:
    name: str  # without the deployment prefix ("memstream." by default)
    key: str
    value: type[BaseModel]
    partitions: int | None  # None = the deployment's partition count
    purpose: str


USER_KEY = "tenant_id:user_id"

TOPICS: tuple[Topic, ...] = (
    Topic("events", USER_KEY, InteractionEvent, None, "conversation turns from bots"),
    Topic("encoded", USER_KEY, EncodedEvent, None, "events with their embeddings"),
    Topic("triggers", USER_KEY, RecurrenceTrigger, None, "recurrence -> consolidation"),
    Topic("consolidated", USER_KEY, ConsolidatedMemory, None, "audit of written memories"),
    Topic("feedback", USER_KEY, Feedback, None, "memories used by retrievals"),
    Topic("control", USER_KEY, Control, None, "forget user, pin memory"),
    Topic("reminders", USER_KEY, Reminder, None, "open actions that fell due"),
    Topic("dlq", "original key", DeadLetter, 1, "invalid or poison messages, with reason"),
)
