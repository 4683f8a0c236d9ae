"""The contracts: pydantic models of every topic's value and every RPC body. No logic, no I/O."""

from memstream.schemas.events import (
    Control,
    EncodedEvent,
    EventMetadata,
    Feedback,
    InteractionEvent,
)
from memstream.schemas.memories import (
    ConsolidatedMemory,
    DeadLetter,
    Fact,
    HistoryEntry,
    MemoryContent,
    OpenAction,
    RecurrenceTrigger,
    Reminder,
    StoredTurn,
    TimelineEntry,
)
from memstream.schemas.rpc import (
    AddEventsRequest,
    AddEventsResponse,
    ErrorBody,
    EventIn,
    ForgetResponse,
    MemoryPage,
    RetrievedItem,
    RetrieveRequest,
    RetrieveResponse,
)
from memstream.schemas.topics import TOPICS, Topic

__all__ = [
    "TOPICS",
    "AddEventsRequest",
    "AddEventsResponse",
    "ConsolidatedMemory",
    "Control",
    "DeadLetter",
    "EncodedEvent",
    "ErrorBody",
    "EventIn",
    "EventMetadata",
    "Fact",
    "Feedback",
    "ForgetResponse",
    "HistoryEntry",
    "InteractionEvent",
    "MemoryContent",
    "MemoryPage",
    "OpenAction",
    "RecurrenceTrigger",
    "Reminder",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrievedItem",
    "StoredTurn",
    "TimelineEntry",
    "Topic",
]
