"""Which consolidations a batch of recurrence triggers asks for, and in what order.

Deterministic by construction: the memories a log gives must not depend on how its
triggers were cut into batches (batch sizes, partitions, processes, timing). So no trigger
is folded into another; each user's triggers form one queue in log order (the order the
topic delivers them: one partition per user), run one at a time, and users run side by
side. A job's outcome then depends only on its trigger and on the state the user's
earlier jobs left, which is itself a function of the log.

What folding used to save (a key's triggers that met in one batch cost one LLM call) is
kept by a rule of the log instead of the batch (``pays_for_llm``): a key's memory is
consolidated again only for new turns at least ``min_interval_s`` of event time after the
newest turn it holds. A trigger inside that interval waits: its turns stay in short-term
memory (retrieved as turns) and come with the key's next trigger, whose evidence holds the
key's newest turns. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memstream.schemas import ConsolidatedMemory, RecurrenceTrigger
from memstream.schemas.memories import TriggerReason


@dataclass(frozen=True)
class Job:
    """One trigger's consolidation of one (tenant, user, key)."""

    tenant_id: str
    user_id: str
    key: str
    reason: TriggerReason
    trigger_id: str
    turn_ids: tuple[str, ...]
    score: float
    importance: float
    ts: datetime  # the trigger's event time


def job_of(trigger: RecurrenceTrigger) -> Job:
    return Job(
        trigger.tenant_id,
        trigger.user_id,
        trigger.key,
        trigger.reason,
        trigger.trigger_id,
        tuple(dict.fromkeys(trigger.turn_ids)),
        trigger.score,
        trigger.importance,
        trigger.ts,
    )


def user_queues(triggers: Sequence[RecurrenceTrigger]) -> list[list[Job]]:
    """One queue per (tenant, user), users in first-seen order, each queue the user's
    triggers in the order given (log order). A redelivered trigger stays in its place: its
    job finds the trigger done and is skipped, so every message is accounted for."""
    queues: dict[tuple[str, str], list[Job]] = {}
    for trigger in triggers:
        queues.setdefault((trigger.tenant_id, trigger.user_id), []).append(job_of(trigger))
    return list(queues.values())


def new_evidence(job: Job, existing: ConsolidatedMemory | None) -> tuple[str, ...]:
    """The job's turns the key's memory was not built from yet, in the job's order."""
    if existing is None:
        return job.turn_ids
    held = set(existing.source_event_ids)
    return tuple(i for i in job.turn_ids if i not in held)


def pays_for_llm(job: Job, existing: ConsolidatedMemory | None, min_interval_s: float) -> bool:
    """Whether ``job`` is worth a consolidation (an LLM call): the key has no memory yet, or
    it is pinned, or it brings new turns at least ``min_interval_s`` (event time) after the
    newest turn the memory holds (``updated_at``). A trigger bringing no new turn never is."""
    if existing is None or job.reason == "pin":
        return existing is None or bool(new_evidence(job, existing))
    if not new_evidence(job, existing):
        return False
    return (job.ts - existing.updated_at).total_seconds() >= min_interval_s
