"""LoCoMo-dev: loading the conversations and questions, turning turns into events, and the
pure metrics the quality benchmark scores with.

The data (CC BY-NC 4.0) stays in ``../shared/bench/locomo-dev/`` and is read at run time;
nothing of it is copied into the repository.

Each conversation is one user of tenant ``demo``; each turn one ``InteractionEvent``:
``event_id = {conversation_id}:{dia_id}``, ``session_id`` = the session number, ``ts`` = the
session's start plus ``turn_index`` seconds (LoCoMo has no per-turn time; this keeps the
order), ``role = "user"`` (both speakers are people), the speaker in ``metadata.speaker``.
The event text is the turn's words plus `` [shares a photo: <caption>]`` when the speaker
shared a photo: a bot would see that photo's caption too, and some questions ask about it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from memstream.memory.text import tokenize
from memstream.schemas import EventMetadata, InteractionEvent

DATA_DIR = "locomo-dev"
CONVERSATIONS: tuple[str, ...] = ("conv-26", "conv-30")
TENANT = "demo"
ADVERSARIAL = 5  # unanswerable questions: scored apart
CATEGORY_NAMES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

# How a turn is written before a baseline indexes it (the format moves figures more than
# the retriever does, so every figure names its format).
Format = Literal["text", "text + caption", "speaker (date): text", "speaker (date): text + caption"]
FORMATS: tuple[Format, ...] = (
    "text",
    "text + caption",
    "speaker (date): text",
    "speaker (date): text + caption",
)


@dataclass(frozen=True)
class Turn:
    conversation_id: str
    session: int
    dia_id: str
    speaker: str
    text: str
    timestamp: datetime  # the session's start, UTC
    session_date_time: str  # "1:56 pm on 8 May, 2023"
    turn_index: int
    image_caption: str | None

    @property
    def event_id(self) -> str:
        return event_id(self.conversation_id, self.dia_id)

    @property
    def date(self) -> str:
        """The session's date as LoCoMo writes it: "8 May, 2023"."""
        return self.session_date_time.rsplit(" on ", 1)[-1]


@dataclass(frozen=True)
class Question:
    question_id: str
    conversation_id: str
    question: str
    category: int
    evidence: tuple[str, ...]  # dia_ids
    answer: str = ""  # the gold answer, as text

    @property
    def adversarial(self) -> bool:
        return self.category == ADVERSARIAL


def event_id(conversation_id: str, dia_id: str) -> str:
    return f"{conversation_id}:{dia_id}"


def dia_id_of(event_id_: str) -> str:
    """``conv-26:D1:3`` -> ``D1:3`` (the conversation id has no colon)."""
    return event_id_.split(":", 1)[1]


def available(shared_bench: Path) -> bool:
    root = shared_bench / DATA_DIR
    return (root / "questions.jsonl").is_file() and all(
        (root / f"{c}.jsonl").is_file() for c in CONVERSATIONS
    )


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_turns(shared_bench: Path, conversation_id: str) -> list[Turn]:
    turns = []
    for d in _jsonl(shared_bench / DATA_DIR / f"{conversation_id}.jsonl"):
        caption = d.get("image_caption")
        turns.append(
            Turn(
                conversation_id=str(d["conversation_id"]),
                session=int(str(d["session"])),
                dia_id=str(d["dia_id"]),
                speaker=str(d["speaker"]),
                text=str(d["text"]),
                timestamp=datetime.fromisoformat(str(d["timestamp"])).replace(tzinfo=UTC),
                session_date_time=str(d["session_date_time"]),
                turn_index=int(str(d["turn_index"])),
                image_caption=str(caption) if caption else None,
            )
        )
    return turns


def load_questions(shared_bench: Path, conversations: Collection[str]) -> list[Question]:
    """Questions of these conversations, in file order; those without evidence are dropped."""
    questions = []
    for d in _jsonl(shared_bench / DATA_DIR / "questions.jsonl"):
        evidence = d.get("evidence") or []
        if d["conversation_id"] not in conversations or not isinstance(evidence, list):
            continue
        if not evidence:
            continue
        questions.append(
            Question(
                question_id=str(d["question_id"]),
                conversation_id=str(d["conversation_id"]),
                question=str(d["question"]),
                category=int(str(d["category"])),
                evidence=tuple(str(e) for e in evidence),
                answer=str(d.get("answer") or ""),
            )
        )
    return questions


def event_text(turn: Turn) -> str:
    """What memstream receives: the words, and the shared photo's caption when there is one."""
    if turn.image_caption:
        return f"{turn.text} [shares a photo: {turn.image_caption}]"
    return turn.text


def format_turn(turn: Turn, fmt: Format) -> str:
    """A turn written in one of ``FORMATS`` for a baseline, e.g. ``Caroline (8 May, 2023): hi``."""
    body = event_text(turn) if fmt.endswith("+ caption") else turn.text
    if fmt.startswith("speaker (date)"):
        return f"{turn.speaker} ({turn.date}): {body}"
    return body


def to_event(turn: Turn, tenant_id: str = TENANT) -> InteractionEvent:
    return InteractionEvent(
        event_id=turn.event_id,
        tenant_id=tenant_id,
        user_id=turn.conversation_id,
        session_id=str(turn.session),
        role="user",
        text=event_text(turn),
        ts=turn.timestamp + timedelta(seconds=turn.turn_index),
        metadata=EventMetadata(speaker=turn.speaker),
    )


def write_events(turns: Iterable[Turn], path: Path) -> int:
    """One event a line, in conversation order; returns how many."""
    lines = [to_event(t).model_dump_json() for t in turns]
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


# --- metrics ---------------------------------------------------------------------------------
#
# A ranking is a sequence of positions; each position holds the dia_ids it retrieves: one for
# a raw turn, all of its sources for a consolidated memory (a memory counts as retrieving every
# turn it was built from, at its rank).

Ranking = Sequence[Collection[str]]


def recall_at_k(ranking: Ranking, evidence: Collection[str], k: int) -> float:
    """Share of the evidence turns retrieved within the first ``k`` positions."""
    if not evidence:
        raise ValueError("a question without evidence cannot be scored")
    found = {d for position in ranking[:k] for d in position}
    return len(set(evidence) & found) / len(set(evidence))


def flatten(ranking: Sequence[Sequence[str]]) -> list[frozenset[str]]:
    """Honest positions: every source turn of a memory takes its own rank slot, in the
    memory's source order; a turn met again later is not counted twice. A baseline's
    ranking (one turn a position) is unchanged."""
    seen: set[str] = set()
    flat: list[frozenset[str]] = []
    for position in ranking:
        for dia in position:
            if dia not in seen:
                seen.add(dia)
                flat.append(frozenset((dia,)))
    return flat


def hit_at_k(ranking: Ranking, evidence: Collection[str], k: int) -> float:
    """1.0 when at least one evidence turn is within the first ``k`` positions."""
    wanted = set(evidence)
    return float(any(wanted & set(position) for position in ranking[:k]))


def reciprocal_rank(ranking: Ranking, evidence: Collection[str]) -> float:
    """1 / the rank (from 1) of the first position holding an evidence turn; 0 if none does."""
    wanted = set(evidence)
    for rank, position in enumerate(ranking, start=1):
        if wanted & set(position):
            return 1.0 / rank
    return 0.0


def evidence_recall(covered: Collection[str], evidence: Collection[str]) -> float:
    """Share of the evidence turns a context covers (``covered``: the dia_ids it holds)."""
    if not evidence:
        raise ValueError("a question without evidence cannot be scored")
    return len(set(evidence) & set(covered)) / len(set(evidence))


_MONTH_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_MONTH_FORM = {m: m[:3] for m in _MONTH_NAMES} | {"sept": "sep"}


def answer_words(text: str) -> frozenset[str]:
    """The content words a gold answer is scored by: ``memory.text.tokenize``'s (lowercase,
    stop words dropped), a month by its three letters ("May", "august" -> "may", "aug")."""
    return frozenset(_MONTH_FORM.get(t, t) for t in tokenize(text))


def _plain_words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[^\W_]+", text.lower()))


def answer_tokens(context: str, answer: str) -> float:
    """Share of the answer's content words that appear in ``context``: what a reader can
    answer from. An answer of stop words only ("no") is scored by its plain words."""
    want = answer_words(answer) or _plain_words(answer)
    if not want:
        return 1.0
    have = answer_words(context) | _plain_words(context)
    return len(want & have) / len(want)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
SHOWN_MIN_CHARS = 20  # a sentence shorter than this proves nothing when found
SHOWN_PREFIX_CHARS = 40  # consolidators clip sentences; their start survives


def _squash(text: str) -> str:
    return " ".join(text.split())


def shown(turn_text: str, context: str) -> bool:
    """Whether a sentence of the turn (at least 20 characters) visibly starts in ``context``:
    a raw turn's text, or a fact a consolidator copied (and maybe clipped) from it."""
    return _shown_in(turn_text, _squash(context))


def _shown_in(turn_text: str, squashed_context: str) -> bool:
    for sentence in _SENTENCE_END.split(turn_text):
        words = _squash(sentence)
        if len(words) >= SHOWN_MIN_CHARS and words[:SHOWN_PREFIX_CHARS] in squashed_context:
            return True
    return False


def context_coverage(
    context: str,
    turn_ids: Iterable[str],
    memory_sources: Iterable[str],
    texts: dict[str, str],
) -> set[str]:
    """The dia_ids a context covers.

    A turn is covered when it is an item of the context (``turn_ids``), when a memory built
    from it is (``memory_sources``: pass none for the strict "shown" reading), or when one of
    its sentences is visibly there (``texts``: dia_id -> the turn's text; see ``shown``).
    """
    covered = set(turn_ids) | set(memory_sources)
    squashed = _squash(context)
    covered.update(d for d, t in texts.items() if d not in covered and _shown_in(t, squashed))
    return covered


def fill_budget(ranked_ids: Sequence[str], costs: dict[str, int], budget_tokens: int) -> list[str]:
    """The ids a baseline puts in a ``budget_tokens`` context, best first.

    The rule of memstream's ``assemble_context``: candidates are tried best first, one that
    does not fit is skipped and later, smaller ones are still tried. ``costs`` holds each
    line's token count; lines are joined by newlines, which the WordPiece tokenizer does not
    count, so a context's tokens are the sum of its lines' (the caller checks the total).
    """
    chosen: list[str] = []
    used = 0
    for dia in ranked_ids:
        cost = costs[dia]
        if cost > 0 and used + cost <= budget_tokens:
            chosen.append(dia)
            used += cost
    return chosen


def mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else float("nan")


# --- scoring a run ---------------------------------------------------------------------------

TOP_K = 20
KS = (5, 10, 20)
Scores = dict[str, float]  # metric -> value, for one question (or a group's mean)


def score_ranking(ranking: Ranking, evidence: Collection[str], top_k: int = TOP_K) -> Scores:
    """R@1..top_k, Hit@5/10/20 and MRR (over the first ``top_k``) of one ranked list."""
    top = ranking[:top_k]
    scores = {f"R@{k}": recall_at_k(top, evidence, k) for k in range(1, top_k + 1)}
    scores.update({f"Hit@{k}": hit_at_k(top, evidence, k) for k in KS})
    scores["MRR"] = reciprocal_rank(top, evidence)
    return scores


def groups(questions: Sequence[Question]) -> dict[str, list[Question]]:
    """ "1-4" (the headline), each category, and "5" (adversarial, scored apart)."""
    found: dict[str, list[Question]] = {"1-4": [q for q in questions if not q.adversarial]}
    for category in sorted({q.category for q in questions}):
        found[str(category)] = [q for q in questions if q.category == category]
    return found


def aggregate(per_question: dict[str, Scores], questions: Sequence[Question]) -> dict[str, Scores]:
    """group -> metric -> mean over the group's questions, with ``n``."""
    result: dict[str, Scores] = {}
    for group, members in groups(questions).items():
        rows = [per_question[q.question_id] for q in members]
        metrics = {m: mean(r[m] for r in rows) for m in rows[0]} if rows else {}
        result[group] = {"n": float(len(members)), **metrics}
    return result
