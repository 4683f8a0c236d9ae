"""LLM token estimates: memstream's consolidation calls next to an eager baseline's.

With the offline extractive consolidator no model reports tokens, so this module counts
what an LLM backend would be sent and would answer, with the encoder's tokenizer
(WordPiece; a chat model's BPE count differs by a few percent either way):

- memstream, per consolidation seen on ``memstream.consolidated``: prompt = the chat
  messages ``stores.llm.build_messages`` builds (system rules + key + the memory it
  updates + up to ``max_turns`` source turns) + 4 tokens of chat overhead per message;
  completion = the memory's content as JSON (what the JSON-schema answer holds). Calls
  that changed nothing never reach the topic and are costed at the mean of those that did.
- eager, per event (1 call per event by definition): prompt = the same messages for that
  one turn and no existing memory; completion = the content the extractive consolidator
  writes for that one turn. It omits the related memories an eager system also sends,
  so it is a lower bound of the eager cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from tokenizers import Tokenizer

from memory.consolidation import consolidate_extractive
from memstream.settings import Settings
from rpc.publisher import bootstrap_servers
from schemas import ConsolidatedMemory, MemoryContent, StoredTurn
from stores.encoder import DEFAULT_TOKENIZER_PATH
from stores.llm import build_messages

TOKENS_PER_MESSAGE = 4  # role and separators of the chat format


@dataclass(frozen=True)
class Tokens:
    events: int
    memstream_calls: float  # from memstream_llm_calls_total
    observed_calls: int  # consolidations seen on the topic
    prompt_per_call: float
    completion_per_call: float
    memstream_tokens: float  # calls x (prompt + completion) per call
    eager_calls: int
    eager_prompt_per_call: float
    eager_completion_per_call: float
    eager_tokens: float


class _Counter:
    def __init__(self) -> None:
        self.tokenizer = Tokenizer.from_file(str(DEFAULT_TOKENIZER_PATH))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    def text(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def messages(self, messages: list[dict[str, str]]) -> int:
        return sum(self.text(m["content"]) + TOKENS_PER_MESSAGE for m in messages)

    def content(self, content: MemoryContent) -> int:
        return self.text(content.model_dump_json(include=set(MemoryContent.model_fields)))


async def consolidated_messages(broker_url: str, topic: str) -> list[ConsolidatedMemory]:
    """Every memory written to ``topic``, in order within each partition (so per user)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(broker_url),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        await consumer.topics()  # fetch metadata
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        found: list[ConsolidatedMemory] = []
        while any([await consumer.position(tp) < end[tp] for tp in partitions]):
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                found += [ConsolidatedMemory.model_validate_json(r.value) for r in records]
        return found
    finally:
        await consumer.stop()


def _turn(event: dict[str, Any]) -> StoredTurn:
    return StoredTurn(
        event_id=event["event_id"],
        session_id=event["session_id"],
        role=event["role"],
        text=event["text"],
        ts=datetime.fromisoformat(event["ts"]),
        speaker=(event.get("metadata") or {}).get("speaker"),
    )


def _mean(values: Sequence[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def token_costs(
    events: list[dict[str, Any]], memories: list[ConsolidatedMemory], llm_calls: float
) -> Tokens:
    """Tokens for the memories of these events' users, and for consolidating every event."""
    count = _Counter()
    max_turns = Settings().consolidation.max_turns
    turns = {e["event_id"]: _turn(e) for e in events}
    users = {(e["tenant_id"], e["user_id"]) for e in events}
    previous: dict[str, ConsolidatedMemory] = {}
    prompts: list[int] = []
    completions: list[int] = []
    for memory in memories:
        if (memory.tenant_id, memory.user_id) not in users:
            continue
        used = sorted((turns[i] for i in memory.source_event_ids if i in turns), key=lambda t: t.ts)
        messages = build_messages(
            memory.key, used[-max_turns:], previous.get(memory.memory_id), memory.updated_at
        )
        prompts.append(count.messages(messages))
        completions.append(count.content(memory))
        previous[memory.memory_id] = memory
    eager_prompts: list[int] = []
    eager_completions: list[int] = []
    for turn in turns.values():
        key = f"event:{turn.event_id}"
        eager_prompts.append(count.messages(build_messages(key, [turn], None, turn.ts)))
        eager_completions.append(count.content(consolidate_extractive(key, [turn], turn.ts)))
    per_call = _mean(prompts) + _mean(completions)
    return Tokens(
        events=len(events),
        memstream_calls=llm_calls,
        observed_calls=len(prompts),
        prompt_per_call=_mean(prompts),
        completion_per_call=_mean(completions),
        memstream_tokens=llm_calls * per_call,
        eager_calls=len(events),
        eager_prompt_per_call=_mean(eager_prompts),
        eager_completion_per_call=_mean(eager_completions),
        eager_tokens=float(sum(eager_prompts) + sum(eager_completions)),
    )
