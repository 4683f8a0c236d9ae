"""The README's example, end to end through the pure path: the bundled sample stream's
turns through RecMem detection (entity triggers), the extractive consolidator and the merge,
exactly as the workers chain them, with event time as the only clock.

cust-ana's order A-10293 (delayed, promised a follow-up, shipped, out for delivery, "my
order A-10293 finally arrived") must end delivered, with nothing open, dated by the
conversation.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from memstream.memory.consolidation import consolidate_extractive, merge_memory
from memstream.memory.phrases import is_commitment
from memstream.memory.recurrence import KeyState, RecurrenceParams, TurnSignal, detect
from memstream.memory.render import memory_text
from memstream.memory.text import extract_entities, is_remember_request, is_salient
from memstream.schemas import ConsolidatedMemory, StoredTurn

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sample_stream.jsonl"
EVENTS = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
FILLER_TITLES = ("tomorrow", "remember", "please", "important", "october", "thanks")


def replay(user: str) -> tuple[dict[str, ConsolidatedMemory], dict[str, StoredTurn]]:
    """Every memory of ``user`` after the whole stream, and the user's turns by id."""
    turns: dict[str, StoredTurn] = {}
    keys: dict[str, KeyState] = {}
    memories: dict[str, ConsolidatedMemory] = {}
    for e in (e for e in EVENTS if e["user_id"] == user):
        ts = datetime.fromisoformat(e["ts"].replace("Z", "+00:00"))
        entities = tuple(extract_entities(e["text"]))
        turn = StoredTurn(
            event_id=e["event_id"],
            session_id=e["session_id"],
            role=e["role"],
            text=e["text"],
            ts=ts,
            entities=list(entities),
        )
        turns[turn.event_id] = turn
        signal = TurnSignal(
            turn.event_id,
            turn.session_id,
            ts.timestamp(),
            np.zeros(4, dtype=np.float32),  # no encoder here: entity and pin triggers only
            entities,
            "c0",
            is_salient(e["text"]),
            bool(e["metadata"].get("pin")) or is_remember_request(e["text"]),
        )
        detection = detect(signal, [], keys, ts.timestamp(), RecurrenceParams())
        keys.update(detection.updated_keys)
        for trigger in detection.triggers:
            batch = sorted((turns[i] for i in trigger.turn_ids), key=lambda t: t.ts)
            now = max(t.ts for t in batch)  # the worker's clock: the newest source event
            memories[trigger.key] = merge_memory(
                memories.get(trigger.key),
                consolidate_extractive(trigger.key, batch, now),
                memory_id=trigger.key,
                tenant_id="demo",
                user_id=user,
                key=trigger.key,
                source_event_ids=[t.event_id for t in batch],
                strength=1.0,
                now=now,
            )
    return memories, turns


def test_order_a10293_ends_delivered_with_nothing_open() -> None:
    memories, turns = replay("cust-ana")
    m = memories["entity:order:A-10293"]
    assert m.version > 1  # consolidated again as the order came back, in place
    assert m.title == "Order A-10293 — delivery"
    assert m.status.startswith("delivered — ")
    assert "finally arrived" in m.status
    assert m.open_actions == []
    closed = [h.value for h in m.history if h.attribute == "open_action"]
    assert any("follow up with you within 48 hours" in v for v in closed)
    # the superseded states are kept, each with the event time it was said
    earlier = [h for h in m.history if h.attribute == "status"]
    assert any("out for delivery" in h.value for h in earlier)
    assert any("shipped" in h.value for h in earlier)
    # dated by the conversation: every time is a source event's time
    sources = [turns[i] for i in m.source_event_ids]
    first, last = min(t.ts for t in sources), max(t.ts for t in sources)
    assert m.updated_at == last
    assert first <= m.created_at <= last
    for h in m.history:
        assert first <= h.superseded_at <= last
        assert h.stated_at is None or first <= h.stated_at <= h.superseded_at
    lines = memory_text(m).splitlines()
    assert lines[0] == "Order A-10293 — delivery (updated 2026-10-14 16:22)"
    assert lines[1] == "Status (2026-10-14): delivered — My order A-10293 finally arrived."
    assert not any(line.startswith("- Open:") for line in lines)
    # history after the current state, newest first
    dates = [line[len("- Earlier (") :][:10] for line in lines if line.startswith("- Earlier (")]
    assert dates
    assert dates == sorted(dates, reverse=True)
    assert lines.index(next(x for x in lines if x.startswith("- Earlier"))) > 1


@pytest.mark.parametrize("user", sorted({e["user_id"] for e in EVENTS}))
def test_sample_memories_hold_no_small_talk_and_name_their_topic(user: str) -> None:
    memories, _ = replay(user)
    assert memories
    for m in memories.values():
        words = m.title.lower().replace("—", " ").split()
        assert not set(words) & set(FILLER_TITLES), m.title
        if m.key.startswith("entity:"):
            assert " — " in m.title, m.title  # "<entity> — <topic>"
        for f in m.facts:
            assert is_salient(f.text) or f.attribute == "status", f.text
        for a in m.open_actions:
            assert is_commitment(a.text, "assistant"), a.text
        assert not [k for k in m.keys if k.startswith("phone:") and f"order:{k[6:]}" in m.keys]
