"""Bodies of the retrieval RPC. The tenant never appears here: it comes from the API key."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from memstream.schemas.common import Identifier, Model, Text, Timestamp, UserId
from memstream.schemas.events import EventMetadata, Role
from memstream.schemas.memories import ConsolidatedMemory

MAX_BATCH_EVENTS = 500


class RetrieveRequest(Model):
    user_id: UserId
    query: Text
    budget_tokens: int = Field(512, ge=32, le=8192)
    top_k: int = Field(8, ge=1, le=50)
    # "Now" for recency ("what is the latest..."): the user's newest event when absent, never
    # the server's clock, so a replayed log ranks as the live stream did.
    now: Timestamp | None = None
    # Read your own writes: wait (at most ``rpc.read_your_writes_max_ms``) until this event
    # of the user's is memorized, so a turn just posted is part of the answer.
    after_event_id: Identifier | None = None


class RetrievedItem(Model):
    kind: Literal["memory", "turn"]
    id: str
    text: str
    score: float
    strength: float
    ts: datetime
    source_event_ids: list[str]
    # True: ``text`` is the turn cut to its sentences that bear on the query ("…" where
    # others were left out), as the context shows it when the whole turn did not fit.
    excerpt: bool = False


class RetrieveResponse(Model):
    items: list[RetrievedItem]
    context: str
    context_tokens: int
    took_ms: float
    # Whether ``after_event_id`` was memorized when the answer was read (None: not asked).
    after_event_memorized: bool | None = None


class EventIn(Model):
    """An event as a bot posts it; ``event_id`` defaults to a fresh uuid, ``ts`` to now."""

    user_id: UserId
    session_id: Identifier
    role: Role
    text: Text
    event_id: Identifier | None = None
    ts: Timestamp | None = None
    metadata: EventMetadata = EventMetadata()


class AddEventsRequest(Model):
    events: list[EventIn] = Field(min_length=1, max_length=MAX_BATCH_EVENTS)


class AddEventsResponse(Model):
    accepted: int
    event_ids: list[str]


class MemoryPage(Model):
    """One page of a user's memories; pass ``next_offset`` back as ``offset`` for the next."""

    memories: list[ConsolidatedMemory]
    next_offset: str | None


class ForgetResponse(Model):
    """What a forget removed, counted directly in each store."""

    user_id: str
    redis_keys_deleted: int
    memories_deleted: int
    forgotten_at: datetime


class ErrorBody(Model):
    """Every 4xx answer: a human-readable ``detail`` saying what to fix."""

    detail: str | list[dict[str, object]]
