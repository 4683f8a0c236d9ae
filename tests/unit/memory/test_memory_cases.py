"""The cases of ``examples/memory_cases.json``, each pinning one rule of a right memory,
through the pure consolidator and the merge (the path every memory takes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from memstream.memory.consolidation import consolidate_extractive, merge_memory
from memstream.memory.render import memory_text
from memstream.schemas import ConsolidatedMemory, StoredTurn

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).resolve().parents[3] / "examples" / "memory_cases.json").read_text()
)


def build(case: dict[str, Any]) -> ConsolidatedMemory:
    turns = [
        StoredTurn(
            event_id=f"e{i}",
            session_id="s1",
            role=role,
            text=text,
            ts=datetime.fromisoformat(ts.replace("Z", "+00:00")),
        )
        for i, (role, ts, text) in enumerate(case["turns"])
    ]
    now = max(t.ts for t in turns)
    return merge_memory(
        None,
        consolidate_extractive(case["key"], turns, now),
        memory_id="m1",
        tenant_id="t1",
        user_id="u1",
        key=case["key"],
        source_event_ids=[t.event_id for t in turns],
        strength=1.0,
        now=now,
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    m, expect = build(case), case["expect"]
    text = memory_text(m)
    history = [h.value for h in m.history if h.attribute != "open_action"]
    checks: dict[str, Callable[[Any], bool]] = {
        "title": lambda v: m.title == v,
        "title_starts": lambda v: m.title.startswith(v),
        "status": lambda v: m.status == v,
        "status_contains": lambda v: v in m.status,
        "status_date": lambda v: f"Status ({v}):" in text,
        "open_actions": lambda v: [a.text for a in m.open_actions] == v,
        "facts": lambda v: [f.text for f in m.facts] == v,
        "fact_contains": lambda v: any(v in f.text for f in m.facts),
        "history_contains": lambda v: any(v in h for h in history),
        "history_stated": lambda v: any(
            h.stated_at is not None and h.stated_at.date().isoformat() == v for h in m.history
        ),
        "keys_include": lambda v: v in m.keys,
        "keys_exclude": lambda v: v not in m.keys,
    }
    failed = [k for k, v in expect.items() if not checks[k](v)]
    assert not failed, (failed, text, m.history)
    # the memory is dated by its conversation, never by the clock of the test run
    newest = max(datetime.fromisoformat(t[1].replace("Z", "+00:00")) for t in case["turns"])
    assert m.updated_at == m.created_at == newest
