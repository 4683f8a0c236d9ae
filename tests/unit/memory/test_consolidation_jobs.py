"""``memory.consolidation_jobs``: a batch of triggers -> one queue per user in log order, one
job per trigger, so that how the log was cut into batches cannot change what is done."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstream.memory.consolidation import reinforced
from memstream.memory.consolidation_jobs import Job, job_of, new_evidence, pays_for_llm, user_queues
from memstream.schemas import ConsolidatedMemory, RecurrenceTrigger

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
KEY = "entity:order:A-10293"


def trigger(tid: str, user: str, key: str, turns: list[str], minute: int) -> RecurrenceTrigger:
    return RecurrenceTrigger(
        trigger_id=tid,
        tenant_id="acme",
        user_id=user,
        key=key,
        reason="entity",
        score=3.0,
        turn_ids=turns,
        importance=0.5,
        ts=T0 + timedelta(minutes=minute),
    )


LOG = [
    trigger("t1", "u1", KEY, ["e0", "e1"], 1),
    trigger("t2", "u2", "topic:c0", ["f0"], 2),
    trigger("t3", "u1", "topic:c1", ["e1"], 3),
    trigger("t4", "u1", KEY, ["e0", "e1", "e2"], 4),
    trigger("t5", "u2", "topic:c0", ["f0", "f1"], 5),
]


def test_each_trigger_is_one_job_in_its_users_queue_in_log_order() -> None:
    queues = user_queues(LOG)
    assert [[j.trigger_id for j in q] for q in queues] == [["t1", "t3", "t4"], ["t2", "t5"]]
    assert queues[0][2] == Job(
        "acme", "u1", KEY, "entity", "t4", ("e0", "e1", "e2"), 3.0, 0.5, LOG[3].ts
    )


def test_any_cut_into_batches_gives_each_user_the_same_sequence_of_jobs() -> None:
    whole = user_queues(LOG)
    per_user = {q[0].user_id: q for q in whole}
    for cut in range(1, len(LOG)):
        joined: dict[str, list[Job]] = {}
        for batch in (LOG[:cut], LOG[cut:]):
            for queue in user_queues(batch):
                joined.setdefault(queue[0].user_id, []).extend(queue)
        assert joined == per_user


def test_a_redelivered_trigger_keeps_its_place_for_its_job_to_skip() -> None:
    queues = user_queues([LOG[0], LOG[0], LOG[3]])
    assert [j.trigger_id for j in queues[0]] == ["t1", "t1", "t4"]


def test_repeated_turn_ids_are_listed_once() -> None:
    assert job_of(trigger("t9", "u1", KEY, ["e0", "e1", "e0"], 9)).turn_ids == ("e0", "e1")


MEMORY = ConsolidatedMemory(
    title="Order A-10293",
    memory_id="m1",
    tenant_id="acme",
    user_id="u1",
    key=KEY,
    strength=1.0,
    created_at=T0,
    updated_at=T0 + timedelta(minutes=1),  # its newest turn's time
    source_event_ids=["e0", "e1"],
)


def test_new_evidence_is_what_the_memory_was_not_built_from() -> None:
    job = job_of(LOG[3])
    assert new_evidence(job, None) == ("e0", "e1", "e2")
    assert new_evidence(job, MEMORY) == ("e2",)
    assert new_evidence(job_of(LOG[0]), MEMORY) == ()


def test_an_llm_call_pays_for_a_new_memory_or_new_turns_after_the_interval() -> None:
    soon = job_of(LOG[3])  # e2, 3 minutes after the memory's newest turn
    assert pays_for_llm(soon, None, 600.0)
    assert not pays_for_llm(soon, MEMORY, 600.0)
    assert pays_for_llm(soon, MEMORY, 180.0)  # the interval is reached exactly
    assert pays_for_llm(soon, MEMORY, 0.0)
    later = job_of(trigger("t6", "u1", KEY, ["e0", "e1", "e2"], 11))
    assert pays_for_llm(later, MEMORY, 600.0)
    nothing_new = job_of(trigger("t7", "u1", KEY, ["e1"], 60))
    assert not pays_for_llm(nothing_new, MEMORY, 0.0)


def test_a_pin_is_consolidated_at_once_when_it_brings_a_new_turn() -> None:
    pin = job_of(LOG[3].model_copy(update={"reason": "pin"}))
    assert pays_for_llm(pin, MEMORY, 600.0)
    assert not pays_for_llm(job_of(LOG[0].model_copy(update={"reason": "pin"})), MEMORY, 600.0)


def test_a_trigger_without_new_turns_can_only_raise_the_strength() -> None:
    assert reinforced(MEMORY, 0.5) is MEMORY
    assert reinforced(MEMORY, 1.0) is MEMORY
    stronger = reinforced(MEMORY, 2.5)
    assert stronger.strength == 2.5
    assert stronger.model_copy(update={"strength": MEMORY.strength}) == MEMORY  # nothing else
