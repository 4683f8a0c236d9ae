"""The encode stage's handler (``streams.encode.EventEncoder``) over the hash encoder, driven
through one turn of the batched loop: events encoded in order and published keyed by user,
bad input dead-lettered with its reason, a text the encoder chokes on parked alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import numpy as np

from memstream.schemas import EncodedEvent, InteractionEvent
from memstream.stores.text_encoder import FloatArray
from memstream.streams.encode import NAME, EventEncoder, encoded_json
from tests.fakes import HashEncoder
from tests.unit.streams.stage_fakes import (
    ARRIVED,
    Feed,
    RecordingTopic,
    message,
    sample,
    stage,
)

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def event(i: int, text: str, *, user: str = "u1", tenant: str = "acme") -> bytes:
    return (
        InteractionEvent(
            event_id=f"e{i}",
            tenant_id=tenant,
            user_id=user,
            session_id="s1",
            role="user",
            text=text,
            ts=T0 + timedelta(minutes=i),
        )
        .model_dump_json()
        .encode()
    )


class ChokingEncoder(HashEncoder):
    """Fails on any batch holding a text with ``bad`` in it (a model error, not an outage)."""

    def encode(
        self, texts: Sequence[str], *, query: bool = False, cache: bool = False
    ) -> FloatArray:
        if any("bad" in t for t in texts):
            raise ValueError("cannot encode")
        return super().encode(texts, query=query, cache=cache)


def published(topic: RecordingTopic) -> list[tuple[bytes | None, EncodedEvent]]:
    return [(k, EncodedEvent.model_validate_json(v)) for k, v in topic.sent]


async def test_a_batch_is_encoded_in_one_call_and_published_in_order() -> None:
    s, dlq, metrics = stage(NAME, "memstream.events")
    out, encoder = RecordingTopic("memstream.encoded"), HashEncoder()
    handler = EventEncoder(s, encoder, cast(Any, out))
    texts = ["Where is my order A-1?", "I like hiking", "Order A-1 again"]
    batch = [
        message(event(0, texts[0])),
        message(event(1, texts[1], user="u2"), key=b"acme:u2"),
        message(event(2, texts[2], tenant="other"), key=b"other:u1"),
    ]
    await s.handle_batch(InteractionEvent, handler.handle, batch)

    assert encoder.calls == 1  # the whole batch in one encoder call
    sent = published(out)
    assert [e.event.event_id for _, e in sent] == ["e0", "e1", "e2"]
    assert [k for k, _ in sent] == [b"acme:u1", b"acme:u2", b"other:u1"]  # the user's key
    expected = HashEncoder().encode(texts)
    for row, (_, e) in zip(expected, sent, strict=True):
        assert e.model_id == encoder.model_id
        assert np.allclose(e.embedding, row, atol=1e-6)
    assert sent[0][1].event == InteractionEvent.model_validate_json(event(0, texts[0]))
    assert dlq.sent == []
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 3
    assert sample(metrics, "memstream_batch_size_sum", stage=NAME) == 3


def test_the_published_json_reads_back_as_the_model_with_the_same_float32_embedding() -> None:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((64, 384)).astype(np.float32) * np.float32(0.05)
    source = InteractionEvent.model_validate_json(event(7, "Order A-10293, please 💡"))
    for vector in vectors:
        written = encoded_json(source, vector, "minilm")
        read = EncodedEvent.model_validate_json(written)
        model = EncodedEvent(event=source, embedding=vector.tolist(), model_id="minilm")
        assert read.event == model.event
        assert read.model_id == model.model_id
        # What memorize and the archive take: the very float32 values the encoder gave.
        assert np.array_equal(np.asarray(read.embedding, dtype=np.float32), vector)
        assert len(written) < len(model.model_dump_json().encode())


async def test_bad_input_is_dead_lettered_with_its_reason_and_the_rest_published() -> None:
    s, dlq, metrics = stage(NAME, "memstream.events")
    out = RecordingTopic("memstream.encoded")
    handler = EventEncoder(s, HashEncoder(), cast(Any, out))
    wrong_role = json.loads(event(2, "hello"))
    wrong_role["role"] = "robot"
    batch = [
        message(event(0, "first")),
        message(b"{not json"),
        message(json.dumps(wrong_role).encode()),
        message(b""),
        message(None),  # a null record
        message(event(1, "second")),
    ]
    await s.handle_batch(InteractionEvent, handler.handle, batch)

    assert [e.event.event_id for _, e in published(out)] == ["e0", "e1"]
    reasons = [d.reason for d in dlq.letters()]
    assert reasons[0].startswith("invalid message: Invalid JSON")
    assert reasons[1].startswith("invalid message: role: Input should be")
    assert reasons[2:] == ["empty value", "empty value (null record)"]
    assert {(d.stage, d.topic) for d in dlq.letters()} == {(NAME, "memstream.events")}
    assert dlq.letters()[0].original == "{not json"  # the bytes as they came
    assert sample(metrics, "memstream_dlq_total", stage=NAME, reason="validation") == 4
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 2


async def test_a_record_keyed_for_another_user_or_for_none_is_dead_lettered() -> None:
    """The key routes a record to its user's partition and state: one that lies would put a
    turn in another user's order, so it goes to the DLQ with the reason, never through."""
    s, dlq, metrics = stage(NAME, "memstream.events")
    out = RecordingTopic("memstream.encoded")
    handler = EventEncoder(s, HashEncoder(), cast(Any, out))
    body = event(1, "my pin is 4321", user="eu:bob")
    batch = [
        message(event(0, "first", user="eu:bob")),  # keyed acme:eu%3Abob, as producers do
        message(body, key=b"acme:bob"),  # another user
        message(body, key=b"globex:eu%3Abob"),  # another tenant
        message(body, key=None),  # no key
        message(body, key=b"acme:eu:bob:x"),  # no user's key
        message(event(2, "last", user="eu:bob")),
    ]
    await s.handle_batch(InteractionEvent, handler.handle, batch)

    assert [e.event.event_id for _, e in published(out)] == ["e0", "e2"]
    assert out.timestamps == [ARRIVED, ARRIVED]  # the arrival goes on to memorize
    reasons = [d.reason for d in dlq.letters()]
    assert "names another user" in reasons[0]
    assert "names another tenant" in reasons[1]
    assert reasons[2].startswith("record has no key")
    assert reasons[3].startswith("malformed record key 'acme:eu:bob:x'")
    assert sample(metrics, "memstream_dlq_total", stage=NAME, reason="validation") == 4


async def test_a_text_the_encoder_fails_on_is_parked_and_its_batch_mates_go_on() -> None:
    s, dlq, metrics = stage(NAME, "memstream.events")
    out = RecordingTopic("memstream.encoded")
    handler = EventEncoder(s, ChokingEncoder(), cast(Any, out))
    batch = [message(event(0, "fine")), message(event(1, "a bad one")), message(event(2, "ok"))]
    await s.handle_batch(InteractionEvent, handler.handle, batch)

    assert [e.event.event_id for _, e in published(out)] == ["e0", "e2"]  # order kept
    [letter] = dlq.letters()
    assert letter.reason == "encode failed: ValueError('cannot encode')"
    assert InteractionEvent.model_validate_json(letter.original).event_id == "e1"
    assert sample(metrics, "memstream_dlq_total", stage=NAME, reason="poison") == 1
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 2
    # The whole batch was tried under the retry policy (3 attempts) before one by one.
    assert sample(metrics, "memstream_retries_total", stage=NAME, kind="error") == 2


async def test_pipelined_batches_are_encoded_one_call_each_and_published_in_log_order() -> None:
    s, dlq, metrics = stage(NAME, "memstream.events")
    out, encoder = RecordingTopic("memstream.encoded"), HashEncoder()
    handler = EventEncoder(s, encoder, cast(Any, out))
    acked: list[str] = []
    feed = Feed(acked)
    feed.put("a", event(0, "first"), event(1, "second"))
    feed.put("b", b"{not json", event(2, "third"))
    feed.put("c", event(3, "fourth"))
    feed.end()
    await s.run_pipelined(InteractionEvent, handler.encode, handler.publish, feed.batches())

    assert encoder.calls == 3  # whole batches: one encoder call each
    assert [e.event.event_id for _, e in published(out)] == ["e0", "e1", "e2", "e3"]
    assert acked == ["ack a0", "ack a1", "ack b0", "ack b1", "ack c0"]
    assert len(dlq.letters()) == 1
    assert sample(metrics, "memstream_events_total", stage=NAME, outcome="ok") == 4
