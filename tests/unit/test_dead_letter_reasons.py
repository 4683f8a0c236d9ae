"""Dead-letter reasons read as a person would write them, and a cut original says it was cut."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from memstream.metrics import Metrics
from memstream.schemas import DeadLetter, InteractionEvent
from memstream.streaming.stage import MAX_ORIGINAL_CHARS, DeadLetters, cut, describe_invalid


def reason_for(value: bytes) -> str:
    with pytest.raises(ValidationError) as caught:
        InteractionEvent.model_validate_json(value)
    return describe_invalid(caught.value, value)


def test_an_empty_value_is_called_empty() -> None:
    assert reason_for(b"") == "empty value"
    assert reason_for(b"  \n") == "empty value (whitespace only)"


def test_whole_value_errors_name_no_field_and_repeat_nothing() -> None:
    assert reason_for(b"[1]") == "invalid message: Input should be an object"
    not_json = reason_for(b"{this is not json")
    assert not_json.startswith("invalid message: Invalid JSON")
    assert "message: message" not in not_json


def test_field_errors_name_the_field() -> None:
    valid = {
        "event_id": "e1",
        "tenant_id": "demo",
        "user_id": "u1",
        "session_id": "s1",
        "role": "robot",
        "text": "hello",
        "ts": "2026-11-02T10:00:00Z",
    }
    assert reason_for(json.dumps(valid).encode()).startswith("invalid message: role: Input")


def test_cut_marks_what_it_cut_and_keeps_the_limit() -> None:
    assert cut("short", 10) == "short"
    long = "x" * 500
    kept = cut(long, 100)
    assert len(kept) == 100
    assert kept.endswith("…[cut: 500 characters in all]")
    assert kept.startswith("xxx")


class FakeTopic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[bytes] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes) -> None:
        self.sent.append(value)


async def test_a_dead_letter_of_an_oversized_message_is_marked_cut() -> None:
    dlq, source = FakeTopic("memstream.dlq"), FakeTopic("memstream.events")
    letters = DeadLetters(
        cast(Any, dlq), Metrics(CollectorRegistry()), stage="encode", source=cast(Any, source)
    )
    huge = b'{"text": "' + b"y" * (2 * MAX_ORIGINAL_CHARS) + b'"'
    assert await letters.decode(InteractionEvent, b"demo:u1", huge) is None
    assert await letters.decode(InteractionEvent, b"demo:u1", b"") is None
    assert await letters.decode(InteractionEvent, b"demo:u1", None) is None  # a tombstone
    big, empty, null = (DeadLetter.model_validate_json(v) for v in dlq.sent)
    assert null.reason == "empty value (null record)"
    assert len(big.original) == MAX_ORIGINAL_CHARS
    assert big.original.endswith(f"…[cut: {len(huge)} characters in all]")
    assert empty.reason == "empty value"
    assert empty.original == ""
    assert empty.topic == "memstream.events"
