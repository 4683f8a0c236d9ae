"""Adversarial cost: what the largest input a client may send costs, beside a typical one.

Two headline rows, each against a reference measured in the same run, in CPU time
(``time.process_time``, one process, one thread):

- ``consolidation CPU ms, 40 turns x 8,000 chars``: the extractive consolidator
  (``memory.extractive.extract_memory``) on the most one consolidation gets -- 40 turns
  (``consolidation.max_turns``) at ``MAX_TEXT_CHARS`` -- the worst of several shapes (one
  short promise repeated, distinct promises, promises and their resolutions, long varied
  sentences, one sentence per turn), against the median of 10 ordinary sample-stream turns
  (``examples/sample_stream.jsonl``, one window per user). Before the bounds of
  ``memory.extractive`` the first shape took over 15 minutes.
- ``worst per-turn CPU ms at the size limit``: the slowest text function that runs on every
  turn (``bench.adversarial_inputs.per_turn_functions``) over ``bench.adversarial_inputs.
  adversarial_texts(8000)``, against the median sample turn's slowest function.

Texts are made unique with trailing spaces before they are timed, so that the memo of
``memory.text.text_memo`` (texts up to 500 characters) does not answer from an earlier
benchmark; inner memos keyed on normalised text may still answer (references optimistic).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.adversarial_inputs import adversarial_texts, per_turn_functions
from bench.core import Context, Result, Row
from memstream.memory.extractive import extract_memory
from memstream.schemas import StoredTurn
from memstream.schemas.common import MAX_TEXT_CHARS

NAME = "adversarial_cost"
TITLE = "## Adversarial cost (largest inputs, CPU)"
SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample_stream.jsonl"
TURNS = 40  # consolidation.max_turns
KEY = "entity:order:A-10293"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
CONSOLIDATION_ROW = "consolidation CPU ms, 40 turns x 8,000 chars"
PER_TURN_ROW = "worst per-turn CPU ms at the size limit"
_WORDS = [
    *("parcel", "refund", "kettle", "courier", "invoice", "lamp", "sheets", "warehouse"),
    *("neighbour", "tracking", "label", "box", "driver", "depot", "photo", "receipt"),
    *("voucher", "charge", "card", "email", "phone", "address", "street", "window"),
    *("door", "garden", "office", "morning", "evening", "weekend"),
]


def _filled(sentence: Callable[[int, int], str]) -> list[str]:
    out = []
    for turn in range(TURNS):
        text, i = "", 0
        while len(text) < MAX_TEXT_CHARS:
            text += sentence(turn, i)
            i += 1
        out.append(text[:MAX_TEXT_CHARS])
    return out


def _varied(turn: int, i: int) -> str:
    n = 8 + (turn * 7 + i * 3) % 17
    return " ".join(_WORDS[(turn * 31 + i * 13 + k * k) % len(_WORDS)] for k in range(n)) + ". "


def adversarial_consolidations() -> dict[str, list[str]]:
    """Shapes of 40 turns x 8,000 characters, by name."""
    return {
        "one promise repeated": _filled(lambda turn, i: "I'll send the invoice tomorrow. "),
        "distinct promises": _filled(lambda t, i: f"I'll send invoice {t * 1000 + i} Friday. "),
        "promises and resolutions": _filled(
            lambda t, i: (
                f"We will email label {_varied(t, i)}"
                if i % 2
                else f"Label {_varied(t, i - 1)[:-2]} was emailed. "
            )
        ),
        "long varied sentences": _filled(_varied),
        "one sentence per turn": _filled(lambda t, i: f"{_WORDS[(t + i) % len(_WORDS)]}{i} "),
    }


def _turns(texts: list[str], start: datetime = T0) -> list[StoredTurn]:
    return [
        StoredTurn(
            event_id=f"e{i:03d}",
            session_id=f"s{i // 4}",
            role="assistant" if i % 2 else "user",
            text=text,
            ts=start + timedelta(minutes=i),
        )
        for i, text in enumerate(texts)
    ]


def sample_turns() -> dict[str, list[StoredTurn]]:
    """The sample stream's turns per user, in stream order."""
    events = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    return {
        user: [
            StoredTurn(
                event_id=e["event_id"],
                session_id=e["session_id"],
                role=e["role"],
                text=e["text"],
                ts=datetime.fromisoformat(e["ts"].replace("Z", "+00:00")),
            )
            for e in events
            if e["user_id"] == user
        ]
        for user in sorted({e["user_id"] for e in events})
    }


def _sample_windows() -> list[list[StoredTurn]]:
    """10 ordinary turns per user of the sample stream."""
    return [turns[:10] for turns in sample_turns().values()]


def _cpu_ms(fn: Callable[[str], object], text: str) -> float:
    started = time.process_time()
    fn(text)
    return (time.process_time() - started) * 1000


def consolidation_costs() -> tuple[dict[str, dict[str, Any]], list[float]]:
    """CPU ms (and how it was cut) per adversarial shape; CPU ms per ordinary window."""
    shapes: dict[str, dict[str, Any]] = {}
    for name, texts in adversarial_consolidations().items():
        turns = _turns(texts)
        started = time.process_time()
        result = extract_memory(KEY, turns, T0)
        ms = (time.process_time() - started) * 1000
        shapes[name] = {"cpu_ms": ms, "cut": result.cut, "work": result.work}
    typical = []
    for window in _sample_windows():
        started = time.process_time()
        extract_memory(KEY, window, window[-1].ts)
        typical.append((time.process_time() - started) * 1000)
    return shapes, typical


def per_turn_costs(quick: bool) -> dict[str, Any]:
    """The slowest per-turn function over the adversarial texts at the size limit, and the
    median sample turn's slowest."""
    functions = per_turn_functions()
    texts = adversarial_texts(MAX_TEXT_CHARS)
    if quick:
        texts = texts[:: max(len(texts) // 40, 1)]
    worst: dict[str, tuple[float, int]] = {}
    for name, fn in functions.items():
        for i, text in enumerate(texts):
            ms = _cpu_ms(fn, text)
            if ms > worst.get(name, (-1.0, 0))[0]:
                worst[name] = (ms, i)
    ordinary = [t.text for w in _sample_windows() for t in w]
    per_turn = []
    for i, text in enumerate(ordinary):
        unique = text + " " * (i + 1)  # not answered by a memo filled earlier
        per_turn.append(max(_cpu_ms(fn, unique) for fn in functions.values()))
    slowest = max(worst, key=lambda name: worst[name][0])
    return {
        "texts": len(texts),
        "functions": len(functions),
        "worst_ms": {name: ms for name, (ms, _) in worst.items()},
        "slowest": slowest,
        "slowest_ms": worst[slowest][0],
        "slowest_text_head": texts[worst[slowest][1]][:80],
        "median_turn_ms": statistics.median(per_turn),
    }


async def run(ctx: Context) -> Result:
    shapes, typical = consolidation_costs()
    worst_shape = max(shapes, key=lambda name: shapes[name]["cpu_ms"])
    median_typical = statistics.median(typical)
    rows = [
        Row(
            CONSOLIDATION_ROW,
            shapes[worst_shape]["cpu_ms"],
            median_typical,
            "10 ordinary sample turns, median of users",
            higher_is_better=False,
        )
    ]
    per_turn = per_turn_costs(ctx.quick)
    rows.append(
        Row(
            PER_TURN_ROW,
            per_turn["slowest_ms"],
            per_turn["median_turn_ms"],
            "median sample turn, its slowest function",
            higher_is_better=False,
        )
    )
    raw = {"consolidation": {"shapes": shapes, "typical_ms": typical}, "per_turn": per_turn}
    return Result(NAME, rows, render(shapes, median_typical, per_turn), raw)


def render(shapes: dict[str, dict[str, Any]], typical_ms: float, per_turn: dict[str, Any]) -> str:
    lines = [
        TITLE,
        "",
        f"Extractive consolidation of {TURNS} turns x {MAX_TEXT_CHARS:,} characters, CPU ms "
        f"(a typical consolidation, 10 ordinary sample turns: {typical_ms:.1f} ms):",
        "",
        "| shape | CPU ms | cut | work units |",
        "| --- | ---: | --- | ---: |",
    ]
    for name, s in shapes.items():
        lines.append(f"| {name} | {s['cpu_ms']:.0f} | {s['cut'] or '—'} | {s['work']:,} |")
    lines.append("")
    lines += [
        f"Per-turn functions at the size limit ({per_turn['functions']} functions over "
        f"{per_turn['texts']:,} adversarial texts): slowest `{per_turn['slowest']}` "
        f"{per_turn['slowest_ms']:.1f} ms; the median sample turn's slowest function "
        f"{per_turn['median_turn_ms']:.3f} ms.",
        "",
        "| function | worst CPU ms |",
        "| --- | ---: |",
        *(
            f"| {name} | {ms:.1f} |"
            for name, ms in sorted(per_turn["worst_ms"].items(), key=lambda kv: -kv[1])
        ),
    ]
    return "\n".join(lines) + "\n"
