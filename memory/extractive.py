"""The offline extractive consolidator: one memory from the raw turns of a key, by rule.

It splits turns into sentences, drops small talk and agent boilerplate, keeps the salient
statements, ranks them by centrality (token-set cosine with the *other* turns, averaged)
plus entity coverage, and reads status, timeline, open actions and attributes off the
phrase rules of ``memory.phrases``:

- the status is the state the latest turn (by event time) asserts about this key; earlier
  states and earlier values of an attribute are emitted too, oldest first, so that the
  merge keeps them as history with their times;
- a promise is an open action until a later turn resolves it (names what was promised and
  says it happened) or the story it belongs to ends (a delivery promise once the order is
  delivered);
- the title names the entity and the topic ("Order A-10293 — delivery").

It is deterministic: the same turns always give the same memory. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memory.due import parse_due
from memory.phrases import (
    COMMITMENT,
    State,
    action_family,
    clip,
    find_state,
    is_commitment,
    moot,
    norm,
    resolves,
    unique,
)
from memory.text import extract_entities, is_salient, tokenize
from schemas import Fact, MemoryContent, OpenAction, StoredTurn, TimelineEntry

MAX_FACTS = 6
MAX_TITLE_CHARS = 80
MAX_ITEM_CHARS = 160
MAX_PAST_VALUES = 3  # superseded values per attribute handed to the merge as history

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])\s*|\n+")
_QUESTION = re.compile(r"[?？]\s*$|吗[。！]?\s*$")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_CJK_FILLER = frozenset("的了吗呢吧啊是我你您他她们在有和就也都很这那个会")
_PREFERENCE = re.compile(
    r"\b(?:i|we)\s+(?:prefer|would rather|'d rather|like|love|always want|do not want|don't want)"
    r"\s+(.*)|我(?:更)?(?:喜欢|希望|偏好|不要)(.*)"
    r"|\b(?:please\s+)?(?:contact|reach|email|call)\s+me\s+(?:by|via|on|at)\s+(.*)"
    r"|\bplease\s+(?:don't|do not|never)\s+(call|text|sms|phone)(.*)"
    r"|\b(?:it|the parcel|parcels?|packages?)\s+can\s+(?:go|be left)\s+(?:to|with)\s+(.*)"
    r"|\bleave\s+(?:it|the parcel|parcels?|packages?)\s+with\s+(.*)"
)
_PREFERENCE_TOPICS = {
    word: topic
    for topic, words in (
        ("contact", "email phone call calls sms text message 邮件 电话 短信"),
        ("delivery", "delivery shipping courier neighbour neighbor parcel door 快递"),
        ("language", "language english chinese 中文 英文"),
    )
    for word in words.split()
}
_DELIVERY = re.compile(r"\b(?:deliver\w*|arriv\w*)\b|送达|到货|送到")
_ADDRESS = re.compile(
    r"\bmy (?:new )?address\b|\bship (?:it )?to\b|\b(?:i|we)(?:'ve| have)? moved to\b|地址"
    r"|\b\w*(?:strasse|straße|street|road|avenue|weg|gasse|platz|allee|lane|drive)\s+\d+\b"
    r"|\b\d+\s+\w+\s+(?:street|road|avenue|lane|drive)\b"
)
# Openers that carry nothing for a reader of the memory ("Just to let you know, ...").
_LEAD_IN = re.compile(
    r"^(?:just to let you know|just so you know|good news|great news|fyi|ok(?:ay)?|yes|yeah"
    r"|so|well|also|and|but|hi|hello|hey|sorry|thanks|thank you|understood|of course|done)"
    r"\s*[,:!.—-]+\s*",
    re.IGNORECASE,
)
# Words that say how a turn is told, not what it is about: without anything else they make
# no fact ("I'm writing about my order A-10293 again", "Let me look up order A-10293...").
_NARRATION = frozenset(
    tokenize(
        "let look check checking writing write again just know asking ask wondering question "
        "see looking help tell told update news hi hello thanks thank sorry ok okay"
    )
)
# Never a title's topic: time words, requests, politeness.
_TITLE_FILLER = frozenset(
    tokenize(
        "today tomorrow yesterday tonight morning evening afternoon week weekend month year "
        "january february march april june july august september october november december "
        "monday tuesday wednesday thursday friday saturday sunday remember please important "
        "thanks thank sorry hello again still also really actually just know need want "
        "would could said says told tell asked like fine great good nice okay ok yes sure "
        "able make sure first last next time times hours days minutes soon later one two "
        "three customer support agent team number thing things latest confirmation"
    )
)
_ATTRIBUTE_TOPICS = {
    "address": "address",
    "delivery_date": "delivery date",
    "preference:contact": "contact preference",
    "preference:delivery": "delivery preference",
    "preference:language": "language preference",
}


@dataclass(frozen=True)
class _Sentence:
    text: str
    turn: StoredTurn
    tokens: frozenset[str]
    entities: frozenset[str]
    state: State | None  # asserted, for this key, and not inside a promise
    commitment: bool  # a promise ("I will", "我会跟进")
    question: bool
    salient: bool  # a statement worth keeping as a fact


def consolidate_extractive(key: str, turns: Sequence[StoredTurn], now: datetime) -> MemoryContent:
    """One memory from the turns of ``key``, by rule: no model, no randomness.

    Title: the key's label and its topic. Facts: at most 6 salient statements by score,
    near-duplicates folded (their event ids kept), the newest value per attribute (older
    values follow as history for the merge). Status: the state of the latest turn that
    states one. Timeline: one entry per turn that carries a state or an entity. Open
    actions: promises no later turn resolved, ``due`` parsed relative to their turn.
    ``now`` only dates the summary when there are no turns.
    """
    ordered = sorted(turns, key=lambda t: (t.ts, t.event_id))
    label = _key_label(key)
    if not ordered:
        return MemoryContent(
            title=clip(label or key, MAX_TITLE_CHARS),
            keys=_key_entities(key),
            summary=f"No turns recorded for {key} as of {now:%Y-%m-%d}.",
        )
    own = _key_entities(key)
    entities = sorted({e for t in ordered for e in t.entities} | set(_all_entities(ordered)))
    # words of the entities and the label say nothing new in a title, a key or a match
    known = {w for e in entities for w in tokenize(e.partition(":")[2])} | set(tokenize(label))
    by_turn = {t.event_id: _sentences(t, own, known) for t in ordered}
    sentences = [s for t in ordered for s in by_turn[t.event_id]]
    turn_tokens = {t.event_id: frozenset(tokenize(t.text)) for t in ordered}
    scores = {id(s): _score(s, turn_tokens, entities) for s in sentences}
    ranked = sorted(
        (s for s in sentences if s.salient),
        key=lambda s: (-scores[id(s)], s.turn.ts, s.turn.event_id, s.text),
    )
    states = [s for s in sentences if s.state is not None]
    status_facts = _status_facts(states)
    status = status_facts[-1].text if status_facts else ""
    facts = [*_facts(ranked, {id(s) for s in states}), *status_facts]
    timeline = []
    for t in ordered:
        mine = [s for s in by_turn[t.event_id] if not s.question]
        if s := (
            next((s for s in mine if s.state), None)
            or next((s for s in mine if s.entities and s.salient), None)
            or next((s for s in mine if s.entities), None)
        ):
            timeline.append(
                TimelineEntry(ts=t.ts, text=clip(s.text, MAX_ITEM_CHARS), event_id=t.event_id)
            )
    actions = _open_actions(sentences, states, known)
    # title and key words come from what was said, not from greetings around it
    df: dict[str, int] = {}
    for t in ordered:
        for w in {w for s in by_turn[t.event_id] if s.salient or s.commitment for w in s.tokens}:
            df[w] = df.get(w, 0) + 1
    said = " ".join(s.text for s in sentences if s.salient or s.commitment)
    title = _title(label, states, facts, df, known, action_family(said))
    terms = [w for w, n in df.items() if n >= 2 and w not in known and _is_term(w)]
    terms = sorted(terms, key=lambda w: (-df[w], w))[:3]
    sessions = len({t.session_id for t in ordered})
    first, last = ordered[0].ts, ordered[-1].ts
    current = [f for f in facts if f.attribute != "status"]
    latest = status or (current[0].text if current else clip(ordered[-1].text, MAX_ITEM_CHARS))
    summary = (
        f"{label or title}: {_count(len(ordered), 'turn')} over {_count(sessions, 'session')}, "
        f"{first:%Y-%m-%d} to {last:%Y-%m-%d}. Latest: {latest}"
    )
    return MemoryContent(
        title=title,
        facts=facts,
        status=status,
        timeline=timeline,
        open_actions=actions,
        keys=unique([*own, *entities, *terms]),
        summary=summary,
    )


def _all_entities(turns: Sequence[StoredTurn]) -> list[str]:
    return [e for t in turns for e in extract_entities(t.text)]


def _sentences(turn: StoredTurn, own: list[str], known: set[str]) -> list[_Sentence]:
    out = []
    for raw in _SENTENCE_END.split(turn.text):
        text = " ".join(raw.split())
        if not text:
            continue
        lower = text.lower()
        entities = frozenset(extract_entities(text))
        question = bool(_QUESTION.search(text))
        promise = COMMITMENT.search(lower)
        commitment = not question and is_commitment(text, turn.role)
        state = None if question else find_state(text)
        # "we will call about the delayed parcel" is a promise, not a state; a state of
        # another order ("the replacement ships as order A-10588") is not this key's state.
        if state is not None and (
            (promise is not None and promise.start() < state.start) or _about_other(entities, own)
        ):
            state = None
        tokens = frozenset(tokenize(text))
        content = tokens - known - _NARRATION
        fact_worthy = len(content) >= 2 or (bool(_CJK.search(text)) and len(content) >= 1)
        out.append(
            _Sentence(
                text=text,
                turn=turn,
                tokens=tokens,
                entities=entities,
                state=state,
                commitment=commitment,
                question=question,
                salient=not question
                and not commitment
                and (state is not None or (is_salient(text) and fact_worthy)),
            )
        )
    return out


def _about_other(entities: frozenset[str], own: list[str]) -> bool:
    """The sentence names an entity of the key's kind, but not the key's own."""
    if not own or own[0] in entities:
        return False
    kind = own[0].partition(":")[0] + ":"
    return any(e.startswith(kind) for e in entities)


def _display(text: str) -> str:
    """The sentence as a memory shows it: openers dropped, first letter upper-case."""
    before = None
    while before != text:
        before, text = text, _LEAD_IN.sub("", text, count=1)
    return text[:1].upper() + text[1:] if text else before


def _status_text(s: _Sentence) -> str:
    """``delivered — My order finally arrived.``: the label first unless the text says it."""
    assert s.state is not None
    text = _display(s.text)
    if s.state.label in text.lower() or _CJK.search(text):
        return clip(text, MAX_ITEM_CHARS)
    return clip(f"{s.state.label} — {text}", MAX_ITEM_CHARS)


def _status_facts(states: list[_Sentence]) -> list[Fact]:
    """One status fact per change of state, oldest first; the last one is the status.

    A state repeated in later turns is dated by its latest statement; only the newest
    ``MAX_PAST_VALUES`` earlier states are kept (the merge files them as history).
    """
    # One state per turn, the one it ends on, shown by the turn's first sentence saying it
    # ("My order finally arrived. My neighbour took it in." -> the first).
    per_turn: dict[str, _Sentence] = {}
    for s in reversed(states):
        assert s.state is not None
        last = per_turn.get(s.turn.event_id)
        if last is None or (last.state is not None and last.state.label == s.state.label):
            per_turn[s.turn.event_id] = s
    runs: list[_Sentence] = []
    for s in states:
        if per_turn[s.turn.event_id] is not s:
            continue
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.state is not None
            and s.state is not None
            and (last.state.label == s.state.label)
        ):
            runs[-1] = s  # a state said again is dated by its latest statement
        else:
            runs.append(s)
    return [
        Fact(
            text=_status_text(s),
            attribute="status",
            source_event_ids=[s.turn.event_id],
            ts=s.turn.ts,
        )
        for s in runs[-(MAX_PAST_VALUES + 1) :]
    ]


def _open_actions(
    sentences: list[_Sentence], states: list[_Sentence], known: set[str]
) -> list[OpenAction]:
    """Promises that no later turn resolved, first statement of each kept."""
    actions: dict[str, OpenAction] = {}
    for i, s in enumerate(sentences):
        if not s.commitment:
            continue
        text = clip(s.text, MAX_ITEM_CHARS)
        later = [o for o in sentences[i + 1 :] if o.turn.ts > s.turn.ts and not o.question]
        if _resolved(s.text, s.turn.ts, later, states, known):
            continue
        due = parse_due(s.text, s.turn.ts)
        actions.setdefault(norm(text), OpenAction(text=text, due=due, event_id=s.turn.event_id))
    return list(actions.values())


def _resolved(
    action: str,
    since: datetime,
    later: list[_Sentence],
    states: list[_Sentence],
    known: set[str],
) -> bool:
    """A later turn says it happened, or the story the promise belongs to has ended."""
    if any(resolves(action, o.text, ignore=known) for o in later):
        return True
    family = action_family(action)
    return any(o.state is not None and o.turn.ts > since and moot(family, o.state) for o in states)


def _cosine(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0


def _centrality(
    tokens: frozenset[str], turn: StoredTurn, turn_tokens: dict[str, frozenset[str]]
) -> float:
    """Mean token-set cosine of ``tokens`` with every *other* turn (0 for a lone turn)."""
    others = [v for k, v in turn_tokens.items() if k != turn.event_id]
    return sum(_cosine(tokens, o) for o in others) / len(others) if others else 0.0


def _score(s: _Sentence, turn_tokens: dict[str, frozenset[str]], entities: list[str]) -> float:
    """Centrality + 0.5 x share of the conversation's entities named + 0.2 for a state."""
    coverage = len(s.entities) / len(entities) if entities else 0.0
    return _centrality(s.tokens, s.turn, turn_tokens) + 0.5 * coverage + 0.2 * (s.state is not None)


def _attribute(s: _Sentence) -> str | None:
    """The slot a fact fills, so that a newer value can supersede it."""
    lower = s.text.lower()
    if m := _PREFERENCE.search(lower):
        rest = next((g for g in m.groups() if g is not None), "")
        words = tokenize(rest)
        topic = next((_PREFERENCE_TOPICS[w] for w in words if w in _PREFERENCE_TOPICS), None)
        topic = topic or next((v for k, v in _PREFERENCE_TOPICS.items() if k in rest), None)
        return f"preference:{topic or (words[0][:24] if words else 'general')}"
    if _ADDRESS.search(lower):
        return "address"
    if _DELIVERY.search(lower) and parse_due(s.text, s.turn.ts) is not None:
        return "delivery_date"
    return None


def _facts(ranked: list[_Sentence], status_sentences: set[int]) -> list[Fact]:
    """Top sentences, near-duplicates folded together; per attribute the newest value,
    preceded by up to ``MAX_PAST_VALUES`` older ones (history for the merge)."""
    groups: list[tuple[_Sentence, str | None, list[str]]] = []
    for s in ranked:
        if id(s) in status_sentences:
            continue  # a state is the status (and its history), not a fact besides it
        twin = next((g for g in groups if _similar(g[0], s)), None)
        if twin is None:
            groups.append((s, _attribute(s), [s.turn.event_id]))
        elif s.turn.event_id not in twin[2]:
            twin[2].append(s.turn.event_id)
    by_attribute: dict[str, list[int]] = {}
    for i, (_, attribute, _) in enumerate(groups):
        if attribute is not None:
            by_attribute.setdefault(attribute, []).append(i)
    keep: list[int] = []
    for members in by_attribute.values():
        members.sort(key=lambda i: (groups[i][0].turn.ts, i))
        keep.append(members[-1])
    keep = keep[:MAX_FACTS]
    for i, (_, attribute, _) in enumerate(groups):
        if len(keep) < MAX_FACTS and attribute is None:
            keep.append(i)
    past = [
        i
        for members in by_attribute.values()
        if members[-1] in keep
        for i in members[:-1][-MAX_PAST_VALUES:]
    ]

    def fact(i: int) -> Fact:
        s, attribute, ids = groups[i]
        return Fact(text=clip(s.text, MAX_ITEM_CHARS), attribute=attribute, source_event_ids=ids,
                    ts=s.turn.ts)  # fmt: skip

    # older values of an attribute first: folding them in order leaves the newest current
    oldest_first = sorted(past, key=lambda i: (groups[i][0].turn.ts, i))
    return [fact(i) for i in oldest_first] + [fact(i) for i in sorted(keep)]


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
    label: str,
    states: list[_Sentence],
    facts: list[Fact],
    df: dict[str, int],
    known: set[str],
    story: str | None,
) -> str:
    """``<entity> — <topic>``: the topic is the story of the latest state (delivery,
    refund...), else what the attributes are about, else the story the turns' words belong
    to (``story``: money words say refund), else the words the turns share most.
    Without an entity the most shared content words name the subject."""
    family = next(
        (s.state.family for s in reversed(states) if s.state and s.state.family != "status"), None
    )
    topic = family
    if topic is None:
        attributes = [f.attribute for f in facts if f.attribute and f.attribute != "status"]
        topic = next((_ATTRIBUTE_TOPICS[a] for a in attributes if a in _ATTRIBUTE_TOPICS), None)
    if topic is None and label and story not in (None, "any"):
        topic = story  # no state said in these turns: what they talk about (refund, delivery)
    words = sorted(
        (w for w in df if w not in known and _is_title_word(w)), key=lambda w: (-df[w], w)
    )
    if label:
        topic = topic or (words[0] if words else None)
        return clip(f"{label} — {topic}" if topic else label, MAX_TITLE_CHARS)
    if (
        topic is not None and family is None
    ):  # about an attribute: "Delivery preference — neighbour"
        head, tail = topic, (words[0] if words else "")
    else:
        head, tail = " ".join(words[:2]), topic or ""
    head = head[:1].upper() + head[1:]
    if head and tail and tail not in head.lower():
        return clip(f"{head} — {tail}", MAX_TITLE_CHARS)
    return clip(head or tail.capitalize() or "Conversation", MAX_TITLE_CHARS)


def _is_title_word(word: str) -> bool:
    """A content word a title may show: no time word, no politeness, no CJK bigram (a
    bigram cut out of a sentence rarely reads as a word)."""
    return (
        _is_term(word)
        and not _CJK.search(word)
        and word not in _TITLE_FILLER
        and word not in _NARRATION
    )


def _is_term(word: str) -> bool:
    """A word worth a key or a title: no digits, 4+ letters, or CJK with no particle in it."""
    if any(c.isdigit() for c in word):
        return False
    if _CJK.search(word):
        return len(word) == 2 and not set(word) & _CJK_FILLER
    return len(word) >= 4


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
