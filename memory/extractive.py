"""The offline extractive consolidator: one memory from the raw turns of a key, by rule.

It splits turns into sentences, keeps the salient statements, ranks them by centrality
(token-set cosine with the *other* turns, averaged) plus entity coverage, and reads status,
timeline, open actions and attributes off fixed English and Chinese phrase lists. It is
deterministic: the same turns always give the same memory. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memory.due import parse_due
from memory.phrases import COMMITMENT, STATE, clip, norm, unique
from memory.text import extract_entities, is_salient, tokenize
from schemas import Fact, MemoryContent, OpenAction, StoredTurn, TimelineEntry

MAX_FACTS = 6
MAX_TITLE_CHARS = 80
MAX_ITEM_CHARS = 160

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])\s*|\n+")
_QUESTION = re.compile(r"[?？]\s*$|吗[。！]?\s*$")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_CJK_FILLER = frozenset("的了吗呢吧啊是我你您他她们在有和就也都很这那个会")
_PREFERENCE = re.compile(
    r"\b(?:i|we)\s+(?:prefer|would rather|'d rather|like|love|always want|do not want|don't want)"
    r"\s+(.*)|我(?:更)?(?:喜欢|希望|偏好|不要)(.*)"
)
_PREFERENCE_TOPICS = {
    word: topic
    for topic, words in (
        ("contact", "email phone call calls sms text message 邮件 电话 短信"),
        ("delivery", "delivery shipping courier 快递"),
        ("language", "language english chinese 中文 英文"),
    )
    for word in words.split()
}
_DELIVERY = re.compile(r"\b(?:deliver\w*|arriv\w*)\b|送达|到货|送到")
_ADDRESS = re.compile(r"\bmy (?:new )?address\b|\bship (?:it )?to\b|地址")


@dataclass(frozen=True)
class _Sentence:
    text: str
    turn: StoredTurn
    tokens: frozenset[str]
    entities: frozenset[str]
    state: bool  # names a state (shipped, 已发货...) other than inside a promise
    commitment: bool  # a promise ("I will", "by Friday", "我会跟进")
    question: bool
    salient: bool  # a statement worth keeping as a fact


def consolidate_extractive(key: str, turns: Sequence[StoredTurn], now: datetime) -> MemoryContent:
    """One memory from the turns of ``key``, by rule: no model, no randomness.

    Title: the key's label and the most frequent words of the most central turn. Facts: at
    most 6 salient statements by score, near-duplicates folded (their event ids kept), only
    the newest per attribute. Status: the newest state-bearing statement. Timeline: one entry
    per turn that carries a state or an entity. Open actions: promises, with ``due`` parsed
    relative to their turn. ``now`` only dates the summary when there are no turns.
    """
    ordered = sorted(turns, key=lambda t: (t.ts, t.event_id))
    label = _key_label(key)
    if not ordered:
        return MemoryContent(
            title=clip(label or key, MAX_TITLE_CHARS),
            keys=_key_entities(key),
            summary=f"No turns recorded for {key} as of {now:%Y-%m-%d}.",
        )
    by_turn = {t.event_id: _sentences(t) for t in ordered}
    sentences = [s for t in ordered for s in by_turn[t.event_id]]
    turn_tokens = {t.event_id: frozenset(tokenize(t.text)) for t in ordered}
    entities = sorted(
        {e for t in ordered for e in t.entities} | {e for s in sentences for e in s.entities}
    )
    scores = {id(s): _score(s, turn_tokens, entities) for s in sentences}
    ranked = sorted(
        (s for s in sentences if s.salient),
        key=lambda s: (-scores[id(s)], s.turn.ts, s.turn.event_id, s.text),
    )
    facts = _facts(ranked)
    states = [s for s in sentences if s.state and not s.question]
    status = clip(states[-1].text, MAX_ITEM_CHARS) if states else ""
    timeline = []
    for t in ordered:
        own = [s for s in by_turn[t.event_id] if not s.question]
        if s := next((s for s in own if s.state), None) or next(
            (s for s in own if s.entities), None
        ):
            timeline.append(
                TimelineEntry(ts=t.ts, text=clip(s.text, MAX_ITEM_CHARS), event_id=t.event_id)
            )
    actions: dict[str, OpenAction] = {}
    for s in sentences:
        if s.commitment and not s.question:
            text = clip(s.text, MAX_ITEM_CHARS)
            due = parse_due(s.text, s.turn.ts)
            actions.setdefault(norm(text), OpenAction(text=text, due=due, event_id=s.turn.event_id))
    df: dict[str, int] = {}
    for tokens in turn_tokens.values():
        for w in tokens:
            df[w] = df.get(w, 0) + 1
    # words of the entities and the label say nothing new in a title or a key
    known = {w for e in entities for w in tokenize(e.partition(":")[2])} | set(tokenize(label))
    central = max(
        ordered, key=lambda t: (_centrality(turn_tokens[t.event_id], t, turn_tokens), t.ts)
    )
    title = _title(label, central, by_turn[central.event_id], df, known)
    terms = [w for w, n in df.items() if n >= 2 and w not in known and _is_term(w)]
    terms = sorted(terms, key=lambda w: (-df[w], w))[:3]
    sessions = len({t.session_id for t in ordered})
    first, last = ordered[0].ts, ordered[-1].ts
    latest = status or (facts[0].text if facts else clip(ordered[-1].text, MAX_ITEM_CHARS))
    summary = (
        f"{label or title}: {_count(len(ordered), 'turn')} over {_count(sessions, 'session')}, "
        f"{first:%Y-%m-%d} to {last:%Y-%m-%d}. Latest: {latest}"
    )
    return MemoryContent(
        title=title,
        facts=facts,
        status=status,
        timeline=timeline,
        open_actions=list(actions.values()),
        keys=unique([*_key_entities(key), *entities, *terms]),
        summary=summary,
    )


def _sentences(turn: StoredTurn) -> list[_Sentence]:
    out = []
    for raw in _SENTENCE_END.split(turn.text):
        text = " ".join(raw.split())
        if not text:
            continue
        lower = text.lower()
        state, promise = STATE.search(lower), COMMITMENT.search(lower)
        # "we will call about the delayed parcel" is a promise, not a state.
        is_state = state is not None and (promise is None or state.start() < promise.start())
        question = bool(_QUESTION.search(text))
        out.append(
            _Sentence(
                text=text,
                turn=turn,
                tokens=frozenset(tokenize(text)),
                entities=frozenset(extract_entities(text)),
                state=is_state,
                commitment=promise is not None,
                question=question,
                salient=not question and (is_state or promise is not None or is_salient(text)),
            )
        )
    return out


def _cosine(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0


def _centrality(
    tokens: frozenset[str], turn: StoredTurn, turn_tokens: dict[str, frozenset[str]]
) -> float:
    """Mean token-set cosine of ``tokens`` with every *other* turn (0 for a lone turn)."""
    others = [v for k, v in turn_tokens.items() if k != turn.event_id]
    return sum(_cosine(tokens, o) for o in others) / len(others) if others else 0.0


def _score(s: _Sentence, turn_tokens: dict[str, frozenset[str]], entities: list[str]) -> float:
    """Centrality + 0.5 x share of the conversation's entities named + 0.2 per state / promise."""
    coverage = len(s.entities) / len(entities) if entities else 0.0
    return (
        _centrality(s.tokens, s.turn, turn_tokens)
        + 0.5 * coverage
        + 0.2 * s.state
        + 0.2 * s.commitment
    )


def _attribute(s: _Sentence) -> str | None:
    """The state slot a fact fills, so that a newer value can supersede it."""
    lower = s.text.lower()
    if s.state:
        return "status"
    if s.commitment:  # a promise is an open action, not a state
        return None
    if _DELIVERY.search(lower) and parse_due(s.text, s.turn.ts) is not None:
        return "delivery_date"
    if m := _PREFERENCE.search(lower):
        rest = m.group(1) if m.group(1) is not None else m.group(2)
        words = tokenize(rest)
        topic = next((_PREFERENCE_TOPICS[w] for w in words if w in _PREFERENCE_TOPICS), None)
        topic = topic or next((v for k, v in _PREFERENCE_TOPICS.items() if k in rest), None)
        return f"preference:{topic or (words[0][:24] if words else 'general')}"
    if _ADDRESS.search(lower):
        return "address"
    return None


def _facts(ranked: list[_Sentence]) -> list[Fact]:
    """Top sentences, near-duplicates folded together, only the newest value per attribute."""
    groups: list[tuple[_Sentence, str | None, list[str]]] = []
    for s in ranked:
        twin = next((g for g in groups if _similar(g[0], s)), None)
        if twin is None:
            groups.append((s, _attribute(s), [s.turn.event_id]))
        elif s.turn.event_id not in twin[2]:
            twin[2].append(s.turn.event_id)
    newest: dict[str, _Sentence] = {}
    for s, attribute, _ in groups:
        if attribute is not None and (
            attribute not in newest or s.turn.ts > newest[attribute].turn.ts
        ):
            newest[attribute] = s
    keep = {id(s) for s in list(newest.values())[:MAX_FACTS]}
    for s, attribute, _ in groups:
        if len(keep) < MAX_FACTS and attribute is None:
            keep.add(id(s))
    return [
        Fact(
            text=clip(s.text, MAX_ITEM_CHARS),
            attribute=attribute,
            source_event_ids=ids,
            ts=s.turn.ts,
        )
        for s, attribute, ids in groups
        if id(s) in keep
    ]


def _similar(a: _Sentence, b: _Sentence) -> bool:
    union = a.tokens | b.tokens
    return norm(a.text) == norm(b.text) or (
        bool(union) and len(a.tokens & b.tokens) / len(union) >= 0.7
    )


def _key_entities(key: str) -> list[str]:
    """``entity:order:A-10293`` -> ``["order:A-10293"]``; other keys name no entity."""
    return [key.split(":", 1)[1]] if key.startswith("entity:") and key.count(":") >= 2 else []


def _key_label(key: str) -> str:
    """``entity:order:A-10293`` -> ``Order A-10293``; other keys have no label."""
    entity = _key_entities(key)
    if not entity:
        return ""
    kind, _, value = entity[0].partition(":")
    return f"{kind.replace('_', ' ').capitalize()} {value}"


def _title(
    label: str, central: StoredTurn, sentences: list[_Sentence], df: dict[str, int], known: set[str]
) -> str:
    """Label + up to 2 words of the central turn most shared with the others, in its order."""
    words = unique(
        w for w in tokenize(central.text) if w not in known and _is_term(w) and not _CJK.search(w)
    )
    best = sorted(words, key=lambda w: (-df.get(w, 0), words.index(w)))[:2]
    phrase = " ".join(w for w in words if w in best)
    if not phrase:
        phrase = next((s.text for s in sentences if s.salient), central.text)
    if not label:
        return clip(phrase[:1].upper() + phrase[1:], MAX_TITLE_CHARS)
    return clip(f"{label}: {phrase}", MAX_TITLE_CHARS)


def _is_term(word: str) -> bool:
    """A word worth a key or a title: no digits, 4+ letters, or CJK with no particle in it."""
    if any(c.isdigit() for c in word):
        return False
    if _CJK.search(word):
        return len(word) == 2 and not set(word) & _CJK_FILLER
    return len(word) >= 4


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
