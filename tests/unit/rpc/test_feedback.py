"""FeedbackSink: retrievals' feedback is published in batches, off the reply's path."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from memstream.rpc.feedback import FeedbackSink
from memstream.schemas import Feedback
from memstream.streaming.broker import EventPublisher


class RecordingPublisher(EventPublisher):
    """The publisher's interface without a broker: what each publish call was given."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[list[tuple[str, bytes]]] = []
        self.fail = fail

    async def publish_many(self, topic: str, items: list[tuple[str, bytes]]) -> None:
        await asyncio.sleep(0)
        if self.fail:
            raise ConnectionError("broker down")
        self.calls.append(list(items))


def _feedback(i: int, user: str = "u1") -> Feedback:
    return Feedback(
        feedback_id=f"f{i}",
        tenant_id="t1",
        user_id=user,
        memory_ids=[],
        turn_ids=[f"e{i}"],
        ts=datetime(2026, 1, 1, tzinfo=UTC),
    )


async def test_feedback_offered_together_goes_out_as_one_batch_in_order() -> None:
    publisher = RecordingPublisher()
    sink = FeedbackSink(publisher, "memstream.feedback", linger_s=0.01)
    for i in range(5):
        assert sink.offer(_feedback(i, user=f"u{i % 2}"))
    await sink.flush()
    assert (sink.sent, sink.dropped) == (5, 0)
    assert len(publisher.calls) == 1
    (batch,) = publisher.calls
    assert [key for key, _ in batch] == ["t1:u0", "t1:u1", "t1:u0", "t1:u1", "t1:u0"]
    assert [Feedback.model_validate_json(v).feedback_id for _, v in batch] == [
        f"f{i}" for i in range(5)
    ]
    await sink.close()


async def test_a_failed_publish_drops_its_batch_and_the_drain_goes_on() -> None:
    publisher = RecordingPublisher(fail=True)
    sink = FeedbackSink(publisher, "memstream.feedback", linger_s=0.0)
    sink.offer(_feedback(1))
    await sink.flush()
    assert (sink.sent, sink.dropped) == (0, 1)
    publisher.fail = False
    sink.offer(_feedback(2))
    await sink.flush()
    assert (sink.sent, sink.dropped) == (1, 1)
    assert [len(c) for c in publisher.calls] == [1]
    await sink.close()
