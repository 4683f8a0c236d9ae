"""The contracts: pydantic models of every topic's value and every RPC body. No logic, no I/O."""

from schemas.events import Control, EncodedEvent, EventMetadata, Feedback, InteractionEvent
from schemas.memories import (
    ConsolidatedMemory,
    DeadLetter,
    Fact,
    HistoryEntry,
    MemoryContent,
    OpenAction,
    RecurrenceTrigger,
    StoredTurn,
    TimelineEntry,
)
from schemas.rpc import (
    AddEventsRequest,
    AddEventsResponse,
    EventIn,
    RetrievedItem,
    RetrieveRequest,
    RetrieveResponse,
)
from schemas.topics import TOPICS, Topic

__all__ = [
    "TOPICS",
    "AddEventsRequest",
    "AddEventsResponse",
    "ConsolidatedMemory",
    "Control",
    "DeadLetter",
    "EncodedEvent",
    "EventIn",
    "EventMetadata",
    "Fact",
    "Feedback",
    "HistoryEntry",
    "InteractionEvent",
    "MemoryContent",
    "OpenAction",
    "RecurrenceTrigger",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrievedItem",
    "StoredTurn",
    "TimelineEntry",
    "Topic",
]
