"""Values of memstream.triggers, memstream.consolidated and memstream.dlq."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from memstream.schemas.common import Model, TenantId, UserId
from memstream.schemas.identity import UserKeyed

TriggerReason = Literal["semantic", "cluster", "entity", "pin", "eager"]


class RecurrenceTrigger(UserKeyed, Model):
    """A key recurred enough to pay for consolidation. Keyed ``user_key``."""

    trigger_id: str
    tenant_id: TenantId
    user_id: UserId
    key: str  # memory key, e.g. "entity:order:A-10293" or "topic:c7"
    reason: TriggerReason
    score: float = Field(ge=0.0)
    turn_ids: list[str] = Field(min_length=1)
    importance: float = Field(0.5, ge=0.0, le=1.0)
    ts: datetime


class Fact(Model):
    text: str
    attribute: str | None = None  # facts sharing an attribute supersede each other
    source_event_ids: list[str] = Field(default_factory=list)
    ts: datetime | None = None


class TimelineEntry(Model):
    ts: datetime
    text: str
    event_id: str | None = None


class OpenAction(Model):
    text: str
    due: datetime | None = None
    event_id: str | None = None


class HistoryEntry(Model):
    """A superseded value, kept with the event time it stopped being current (when the value
    that replaced it was stated) and, where known, the event time it was stated."""

    attribute: str
    value: str
    superseded_at: datetime
    stated_at: datetime | None = None


class MemoryContent(Model):
    """What a consolidator (LLM or extractive) writes: also the LLM's JSON-schema answer."""

    title: str
    facts: list[Fact] = Field(default_factory=list)
    status: str = ""
    timeline: list[TimelineEntry] = Field(default_factory=list)
    open_actions: list[OpenAction] = Field(default_factory=list)
    keys: list[str] = Field(default_factory=list)
    summary: str = ""


class ConsolidatedMemory(MemoryContent):
    """One structured long-term memory; its id: uuid5 of ``identity.scoped(tenant, user, key)``."""

    memory_id: str
    tenant_id: TenantId
    user_id: UserId
    key: str
    strength: float = 1.0
    created_at: datetime
    updated_at: datetime
    source_event_ids: list[str] = Field(default_factory=list)
    links: list[str] = Field(default_factory=list)  # related memories of the same user
    history: list[HistoryEntry] = Field(default_factory=list)
    version: int = 1
    # Strength bookkeeping (memory/strength.py): decay applied up to this time (None =
    # since created_at), and the newest feedback ids already counted, so a redelivered
    # feedback message or a repeated decay run changes nothing.
    decayed_to: datetime | None = None
    feedback_ids: list[str] = Field(default_factory=list)


class Reminder(UserKeyed, Model):
    """An open action of a memory that fell due; emitted once to ``memstream.reminders``."""

    reminder_id: str  # deterministic: memory id + action, so a consumer can dedup too
    tenant_id: TenantId
    user_id: UserId
    memory_id: str
    key: str
    title: str
    action: OpenAction
    due: datetime
    ts: datetime  # when it was emitted


class StoredTurn(Model):
    """A short-term turn as kept in Redis (its embedding is stored beside it as float16)."""

    event_id: str
    session_id: str
    role: str
    text: str
    ts: datetime
    speaker: str | None = None
    cluster_id: str | None = None
    entities: list[str] = Field(default_factory=list)
    importance: float = 0.5
    pinned: bool = False


class DeadLetter(Model):
    """Why a message could not be processed, with its original bytes (decoded leniently)."""

    stage: str
    reason: str
    topic: str
    key: str | None = None
    original: str
    ts: datetime
