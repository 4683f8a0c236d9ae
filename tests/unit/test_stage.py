"""The stage runtime's loops (streaming/stage.py): what each does with a message, once for all.

One turn of each loop is driven with fake topics: bad input reaches the DLQ (or is
skipped), a failing handler parks its message as poison and the next one goes on, outcomes
and batch sizes land in the series the dashboards read, and a periodic job survives a bad
run.
"""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.schemas import DeadLetter, Feedback
from memstream.streaming.stage import DECODED_MEMO, Outcome, Received, Stage, periodic, validated
from tests.unit.test_dead_letter_reasons import FakeTopic


def message(value: bytes | None, key: bytes = b"demo:u1") -> Any:
    return SimpleNamespace(key=key, value=value)


def feedback(n: int) -> bytes:
    return json.dumps(
        {
            "tenant_id": "demo",
            "user_id": "u1",
            "memory_ids": [f"m{n}"],
            "feedback_id": f"f{n}",
            "ts": "2026-11-02T10:00:00Z",
        }
    ).encode()


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
def dlq() -> FakeTopic:
    return FakeTopic("memstream.dlq")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def stage(dlq: FakeTopic, metrics: Metrics) -> Stage:
    return Stage("feedback", cast(Any, FakeTopic("memstream.feedback")), cast(Any, dlq), metrics)


def letters(dlq: FakeTopic) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(v) for v in dlq.sent]


async def test_per_message_counts_outcomes_and_parks_poison(
    dlq: FakeTopic, metrics: Metrics
) -> None:
    s = stage(dlq, metrics)
    seen: list[str] = []

    async def handle(item: Received[Feedback]) -> Outcome:
        ident = item.value.feedback_id or ""
        if ident == "f2":
            raise ValueError("bad memory id")
        seen.append(ident)
        return "skipped" if ident == "f3" else "ok"

    for raw in (feedback(1), b"{not json", feedback(2), feedback(3), None):
        await s.handle_message(Feedback, handle, message(raw))

    assert seen == ["f1", "f3"]  # the poison and the invalid ones did not stop the partition
    invalid, poison, null = letters(dlq)
    assert invalid.reason.startswith("invalid message: ")
    assert poison.reason == "feedback failed: ValueError('bad memory id')"
    assert json.loads(poison.original)["feedback_id"] == "f2"  # the message as it came
    assert null.reason == "empty value (null record)"
    assert {invalid.topic, poison.stage} == {"memstream.feedback", "feedback"}
    events = "memstream_events_total"
    assert value(metrics, events, stage="feedback", outcome="ok") == 1
    assert value(metrics, events, stage="feedback", outcome="skipped") == 1
    assert value(metrics, events, stage="feedback", outcome="dlq") == 3
    assert value(metrics, "memstream_dlq_total", stage="feedback", reason="poison") == 1
    assert value(metrics, "memstream_dlq_total", stage="feedback", reason="validation") == 2
    # Latency is a handled message's: one "ok".
    assert value(metrics, "memstream_stage_latency_seconds_count", stage="feedback") == 1


async def test_a_handler_retries_its_own_steps(dlq: FakeTopic, metrics: Metrics) -> None:
    s = stage(dlq, metrics)
    tries: list[int] = []

    async def flaky() -> int:
        tries.append(1)
        if len(tries) < 2:
            raise RuntimeError("once")
        return len(tries)

    async def handle(item: Received[Feedback]) -> Outcome:
        await s.retry(flaky)
        return "ok"

    await s.handle_message(Feedback, handle, message(feedback(1)))
    assert len(tries) == 2
    assert dlq.sent == []
    assert value(metrics, "memstream_retries_total", stage="feedback", kind="error") == 1


async def test_batched_counts_handled_and_taken(dlq: FakeTopic, metrics: Metrics) -> None:
    s = stage(dlq, metrics)

    async def work(item: Received[Feedback]) -> str:
        if item.value.feedback_id == "f2":
            raise ValueError("culprit")
        return item.value.feedback_id or ""

    handled: list[str] = []

    async def handle(batch: list[Received[Feedback]]) -> int:
        done = await s.one_by_one(batch, work, retry=False)
        handled.extend(r for _, r in done)
        return len(done)

    batch = [message(feedback(1)), message(b"[]"), message(feedback(2)), message(feedback(3))]
    await s.handle_batch(Feedback, handle, batch)
    assert handled == ["f1", "f3"]
    assert [d.reason for d in letters(dlq)] == [
        "invalid message: Input should be an object",
        "feedback failed: ValueError('culprit')",
    ]
    assert value(metrics, "memstream_events_total", stage="feedback", outcome="ok") == 2
    assert value(metrics, "memstream_batch_size_sum", stage="feedback") == 4  # taken


async def test_batched_skips_what_another_stage_dead_letters(
    dlq: FakeTopic, metrics: Metrics
) -> None:
    s = stage(dlq, metrics)
    batches: list[int] = []

    async def handle(batch: list[Received[Feedback]]) -> int:
        batches.append(len(batch))
        return len(batch)

    await s.handle_batch(Feedback, handle, [message(b"{"), message(None)], invalid="skip")
    await s.handle_batch(Feedback, handle, [message(feedback(1)), message(b"")], invalid="skip")
    assert batches == [1]  # a batch with nothing valid never reaches the handler
    assert dlq.sent == []
    assert value(metrics, "memstream_events_total", stage="feedback", outcome="skipped") == 3
    assert value(metrics, "memstream_batch_size_count", stage="feedback") == 1


async def test_a_periodic_job_outlives_a_bad_run(metrics: Metrics) -> None:
    registered: list[Any] = []

    class App:
        def timer(self, interval: float, on_leader: bool, name: str | None) -> Any:
            assert (interval, on_leader, name) == (5.0, False, "memstream.decay")
            return registered.append

    outcomes: list[Exception | int] = [RuntimeError("store down"), 3]
    runs = iter(outcomes)

    async def job() -> int:
        outcome = next(runs)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    periodic(cast(Any, App()), metrics, job, stage="decay", every_s=5.0, name="memstream.decay")
    (run,) = registered
    await run()
    await run()
    assert value(metrics, "memstream_events_total", stage="decay", outcome="error") == 1
    assert value(metrics, "memstream_events_total", stage="decay", outcome="ok") == 3
    assert value(metrics, "memstream_stage_latency_seconds_count", stage="decay") == 1


def test_a_record_two_stages_read_is_validated_once() -> None:
    raw = feedback(1)
    first = validated(Feedback, raw)
    assert validated(Feedback, bytes(raw)) is first  # equal bytes: the same frozen model
    assert first == Feedback.model_validate_json(raw)
    for n in range(2, DECODED_MEMO + 3):  # the memo is bounded: the oldest goes first
        validated(Feedback, feedback(n))
    assert validated(Feedback, raw) is not first
    with pytest.raises(ValueError, match="validation error"):  # never memoised
        validated(Feedback, b'{"tenant_id": "demo"}')


async def test_a_batched_stage_reports_each_events_age_when_taken_and_when_done(
    dlq: FakeTopic, metrics: Metrics
) -> None:
    """``memstream_event_age_seconds``: from the record's timestamp (when it reached
    memstream) to the stage taking it, then to the stage having handled it; a record with
    no timestamp is not counted."""
    s = stage(dlq, metrics)

    async def handle(batch: list[Received[Feedback]]) -> int:
        await asyncio.sleep(0.05)
        return len(batch)

    sent = time.time() - 0.3
    stamped = [message(feedback(n)) for n in (1, 2)]
    for m in stamped:
        m.message = SimpleNamespace(timestamp=sent)
    unstamped = message(feedback(3))
    unstamped.message = SimpleNamespace(timestamp=None)
    await s.handle_batch(Feedback, handle, [*stamped, unstamped])

    def age(at: str, part: str) -> float:
        return value(metrics, f"memstream_event_age_seconds_{part}", stage="feedback", at=at)

    assert age("taken", "count") == age("done", "count") == 2
    assert age("taken", "sum") >= 2 * 0.3
    assert age("done", "sum") - age("taken", "sum") >= 2 * 0.05  # the handler's time
    assert value(metrics, "memstream_events_total", stage="feedback", outcome="ok") == 3
