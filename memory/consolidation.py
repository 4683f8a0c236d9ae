"""Consolidation rules: the offline extractive consolidator and the merge into a stored memory.

``consolidate_extractive`` turns the raw turns of one key into a ``MemoryContent`` with no
model at all: it splits turns into sentences, keeps the salient statements, ranks them by
centrality (token-set cosine with the *other* turns, averaged) plus entity coverage, and
reads status, timeline, open actions and attributes off fixed English and Chinese phrase
lists. It is deterministic: the same turns always give the same memory.

``merge_memory`` folds fresh content (extractive or LLM) into the stored memory of the same
key. Nothing is silently deleted: a superseded attribute value, an old status and a closed
open action all move to ``history``. Merging content that adds nothing returns the stored
memory itself, so replays and duplicate triggers cost no version bump.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from memory.text import extract_entities, is_salient, tokenize
from schemas import (
    ConsolidatedMemory,
    Fact,
    HistoryEntry,
    MemoryContent,
    OpenAction,
    StoredTurn,
    TimelineEntry,
)

MAX_FACTS = 6
MAX_TITLE_CHARS = 80
MAX_ITEM_CHARS = 160

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])\s*|\n+")
_QUESTION = re.compile(r"[?？]\s*$|吗[。！]?\s*$")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
_CJK_FILLER = frozenset("的了吗呢吧啊是我你您他她们在有和就也都很这那个会")
_STATE = re.compile(
    r"\b(?:shipped|dispatched|delivered|refunded|refund (?:has been |was )?issued|cancell?ed|"
    r"delayed|resolved|pending|escalated|returned|on hold|out for delivery|closed|completed|"
    r"replaced)\b|已发货|已送达|已签收|已退款|退款成功|已取消|延迟|延误|已解决|处理中|待处理|"
    r"已升级|已退货|已关闭|已完成"
)
_COMMITMENT = re.compile(
    r"\b(?:i|we)(?:\s+will|'ll|’ll|\s+shall|\s+am going to|\s+are going to)\b|"
    r"\bwill (?:call|get back|contact|email|send|follow)\b|\bfollow[- ]?up\b|"
    r"\bget back to you\b|\bcall you back\b|"
    r"\bwithin \w+ (?:minutes?|hours?|days?|business days?)\b|"
    r"\bby (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|tomorrow|"
    r"end of (?:the )?day|eod)\b|"
    r"我会|我们会|我们将|将会|跟进|回电|回复您|联系您|给您回"
)
_DONE = re.compile(
    r"\b(?:done|resolved|completed|fixed|closed|called (?:you )?back|sent)\b|"
    r"已完成|已解决|已处理|已回电|已发送"
)
# Words of a promise that say nothing about *what* was promised (for matching it to "done").
_PROMISE_WORDS = frozenset(
    tokenize("call back follow up within hours days today tomorrow 我会 跟进")
)
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

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
                 "six": 6, "seven": 7, "ten": 10, "twelve": 12, "twenty-four": 24}  # fmt: skip
_ZH_DIGITS = {c: n for n, c in enumerate("零一二三四五六七八九")} | {"两": 2}
_ZH_WEEKDAYS = {c: n for n, c in enumerate("一二三四五六日")} | {"天": 6}
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2}))?\b")
_RELATIVE = re.compile(
    r"\b(?:within|in|next)\s+(\d+|[a-z]+(?:-[a-z]+)?)\s+"
    r"(minute|hour|business day|working day|day|week)s?\b"
)
_ZH_RELATIVE = re.compile(
    r"(\d+|[零一二两三四五六七八九十]+)\s*个?\s*(小时|工作日|天|日|周|星期)(?:之|以)?内"
)
_ZH_UNITS = {"小时": "hour", "工作日": "business day", "周": "week", "星期": "week"}
_EN_WEEKDAY = re.compile(r"\b(?:by|on|before|until|next)\s+(" + "|".join(_WEEKDAYS) + r")\b")
_ZH_WEEKDAY = re.compile(r"(?:周|星期|礼拜)([一二三四五六日天])")
_TOMORROW = re.compile(r"\btomorrow\b|明天")
_TODAY = re.compile(r"\b(?:today|tonight|end of (?:the )?day|eod)\b|今天|今晚")


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
            title=_clip(label or key, MAX_TITLE_CHARS),
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
    status = _clip(states[-1].text, MAX_ITEM_CHARS) if states else ""
    timeline = []
    for t in ordered:
        own = [s for s in by_turn[t.event_id] if not s.question]
        if s := next((s for s in own if s.state), None) or next(
            (s for s in own if s.entities), None
        ):
            timeline.append(
                TimelineEntry(ts=t.ts, text=_clip(s.text, MAX_ITEM_CHARS), event_id=t.event_id)
            )
    actions: dict[str, OpenAction] = {}
    for s in sentences:
        if s.commitment and not s.question:
            text = _clip(s.text, MAX_ITEM_CHARS)
            due = parse_due(s.text, s.turn.ts)
            actions.setdefault(
                _norm(text), OpenAction(text=text, due=due, event_id=s.turn.event_id)
            )
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
    latest = status or (facts[0].text if facts else _clip(ordered[-1].text, MAX_ITEM_CHARS))
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
        keys=_unique([*_key_entities(key), *entities, *terms]),
        summary=summary,
    )


def merge_memory(
    existing: ConsolidatedMemory | None,
    fresh: MemoryContent,
    *,
    memory_id: str,
    tenant_id: str,
    user_id: str,
    key: str,
    source_event_ids: Sequence[str],
    strength: float,
    now: datetime,
) -> ConsolidatedMemory:
    """Fold ``fresh`` into ``existing`` (same id, version + 1), or start version 1.

    Facts are de-duplicated by normalised text; a fact with an ``attribute`` supersedes the
    stored fact of that attribute when it is not older, and the loser goes to ``history``.
    A changed status moves the old one to history (attribute ``"status"``); an open action
    that a later done/resolved fact or timeline entry answers moves there as
    ``"open_action"``. Timeline entries are unique by (ts, event_id) and sorted; keys and
    source ids are unions in first-seen order. If nothing changes, ``existing`` is returned
    as it is (same version and ``updated_at``).
    """
    base = (
        existing
        if existing is not None
        else ConsolidatedMemory(
            title=fresh.title,
            memory_id=memory_id,
            tenant_id=tenant_id,
            user_id=user_id,
            key=key,
            strength=strength,
            created_at=now,
            updated_at=now,
            version=0,
        )
    )
    history = list(base.history)
    facts = _merge_facts(base.facts, fresh.facts, history, now)
    status = base.status
    if fresh.status and _norm(fresh.status) != _norm(base.status):
        fresh_ts, base_ts = _status_ts(fresh), _status_ts(base)
        if base_ts is not None and fresh_ts is not None and fresh_ts < base_ts:
            _record(history, "status", fresh.status, now, unless_known=True)
        else:
            if base.status:
                _record(history, "status", base.status, now)
            status = fresh.status
    timeline = {(e.ts, e.event_id or ""): e for e in [*fresh.timeline, *base.timeline]}
    closed = {_norm(h.value) for h in history if h.attribute == "open_action"}
    actions: dict[str, OpenAction] = {}
    for a in [*base.open_actions, *fresh.open_actions]:
        if _norm(a.text) not in closed:
            actions.setdefault(_norm(a.text), a)
    evidence = [(f.text, f.ts, f.source_event_ids) for f in facts] + [
        (e.text, e.ts, [e.event_id] if e.event_id else []) for e in timeline.values()
    ]
    open_actions = []
    for a in actions.values():
        if _answered(a, evidence, timeline.values()):
            _record(history, "open_action", a.text, now)
        else:
            open_actions.append(a)
    merged = ConsolidatedMemory(
        title=fresh.title or base.title,
        facts=facts,
        status=status,
        timeline=[timeline[k] for k in sorted(timeline)],
        open_actions=open_actions,
        keys=_unique([*base.keys, *fresh.keys]),
        summary=fresh.summary or base.summary,
        memory_id=memory_id,
        tenant_id=tenant_id,
        user_id=user_id,
        key=key,
        strength=max(base.strength, strength) if existing is not None else strength,
        created_at=base.created_at,
        updated_at=base.updated_at,
        source_event_ids=_unique([*base.source_event_ids, *source_event_ids]),
        links=list(base.links),
        history=history,
        version=base.version,
    )
    if existing is not None and merged == existing:
        return existing
    return merged.model_copy(update={"updated_at": now, "version": base.version + 1})


def parse_due(text: str, ts: datetime) -> datetime | None:
    """The due time a sentence states, relative to the turn's ``ts``; None when it states none.

    Understands an ISO date (with optional HH:MM), "within/in N minutes|hours|days|business
    days|weeks" and "N小时内 / N天内 / N个工作日内", "by Friday" / "周五", "tomorrow" / "明天",
    "today / end of day" / "今天". A day without a time means the end of that day.
    """
    lower = text.lower()
    end_of_day = ts.replace(hour=23, minute=59, second=59, microsecond=0)
    if m := _ISO_DATE.search(lower):
        try:
            day = date.fromisoformat(m.group(1))
            at = end_of_day
            if m.group(2):
                at = ts.replace(
                    hour=int(m.group(2)), minute=int(m.group(3)), second=0, microsecond=0
                )
            return at.replace(year=day.year, month=day.month, day=day.day)
        except ValueError:
            return None
    if m := _RELATIVE.search(lower):
        n = int(m.group(1)) if m.group(1).isdigit() else _NUMBER_WORDS.get(m.group(1))
        if n is not None:
            return _add(ts, n, m.group(2))
    if m := _ZH_RELATIVE.search(text):
        n = _zh_int(m.group(1))
        if n is not None:
            return _add(ts, n, _ZH_UNITS.get(m.group(2), "day"))
    weekday = None
    if m := _EN_WEEKDAY.search(lower):
        weekday = _WEEKDAYS.index(m.group(1))
    elif m := _ZH_WEEKDAY.search(text):
        weekday = _ZH_WEEKDAYS[m.group(1)]
    if weekday is not None:
        return end_of_day + timedelta(days=(weekday - ts.weekday()) % 7 or 7)
    if _TOMORROW.search(lower):
        return end_of_day + timedelta(days=1)
    if _TODAY.search(lower):
        return end_of_day
    return None


# -- extraction helpers ---------------------------------------------------------------------


def _sentences(turn: StoredTurn) -> list[_Sentence]:
    out = []
    for raw in _SENTENCE_END.split(turn.text):
        text = " ".join(raw.split())
        if not text:
            continue
        lower = text.lower()
        state, promise = _STATE.search(lower), _COMMITMENT.search(lower)
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
            text=_clip(s.text, MAX_ITEM_CHARS),
            attribute=attribute,
            source_event_ids=ids,
            ts=s.turn.ts,
        )
        for s, attribute, ids in groups
        if id(s) in keep
    ]


def _similar(a: _Sentence, b: _Sentence) -> bool:
    union = a.tokens | b.tokens
    return _norm(a.text) == _norm(b.text) or (
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
    words = _unique(
        w for w in tokenize(central.text) if w not in known and _is_term(w) and not _CJK.search(w)
    )
    best = sorted(words, key=lambda w: (-df.get(w, 0), words.index(w)))[:2]
    phrase = " ".join(w for w in words if w in best)
    if not phrase:
        phrase = next((s.text for s in sentences if s.salient), central.text)
    if not label:
        return _clip(phrase[:1].upper() + phrase[1:], MAX_TITLE_CHARS)
    return _clip(f"{label}: {phrase}", MAX_TITLE_CHARS)


def _is_term(word: str) -> bool:
    """A word worth a key or a title: no digits, 4+ letters, or CJK with no particle in it."""
    if any(c.isdigit() for c in word):
        return False
    if _CJK.search(word):
        return len(word) == 2 and not set(word) & _CJK_FILLER
    return len(word) >= 4


# -- merge helpers ---------------------------------------------------------------------------


def _merge_facts(
    base: list[Fact], fresh: list[Fact], history: list[HistoryEntry], now: datetime
) -> list[Fact]:
    facts = list(base)
    for f in fresh:
        norm = _norm(f.text)
        twin = next((i for i, g in enumerate(facts) if _norm(g.text) == norm), None)
        if twin is not None:
            g = facts[twin]
            ids = _unique([*g.source_event_ids, *f.source_event_ids])
            if ids != g.source_event_ids:
                facts[twin] = g.model_copy(update={"source_event_ids": ids})
            continue
        same = next(
            (i for i, g in enumerate(facts) if f.attribute and g.attribute == f.attribute), None
        )
        if same is None:
            facts.append(f)
            continue
        old = facts[same]
        assert f.attribute is not None
        if f.ts is not None and old.ts is not None and f.ts < old.ts:
            _record(history, f.attribute, f.text, now, unless_known=True)
        else:
            _record(history, f.attribute, old.text, now)
            facts[same] = f
    return facts


def _status_ts(content: MemoryContent) -> datetime | None:
    norm = _norm(content.status)
    return next(
        (f.ts for f in content.facts if f.attribute == "status" and _norm(f.text) == norm), None
    )


def _record(
    history: list[HistoryEntry],
    attribute: str,
    value: str,
    now: datetime,
    *,
    unless_known: bool = False,
) -> None:
    """Append a history entry; skip exact repeats (and any known value if ``unless_known``)."""
    norm = _norm(value)
    for h in history:
        if (
            h.attribute == attribute
            and _norm(h.value) == norm
            and (unless_known or h.superseded_at == now)
        ):
            return
    history.append(HistoryEntry(attribute=attribute, value=value, superseded_at=now))


def _answered(
    action: OpenAction,
    evidence: list[tuple[str, datetime | None, list[str]]],
    timeline: Iterable[TimelineEntry],
) -> bool:
    """A later done/resolved/completed statement sharing a content word with the action."""
    since = next(
        (e.ts for e in timeline if action.event_id and e.event_id == action.event_id), None
    )
    words = set(tokenize(action.text)) - _PROMISE_WORDS
    for text, ts, ids in evidence:
        if action.event_id and action.event_id in ids:
            continue
        if since is not None and ts is not None and ts < since:
            continue
        if _DONE.search(text.lower()) and words & set(tokenize(text)):
            return True
    return False


# -- small utilities -------------------------------------------------------------------------


def _add(ts: datetime, n: int, unit: str) -> datetime:
    if unit in ("business day", "working day"):
        day = ts
        while n > 0:
            day += timedelta(days=1)
            n -= day.weekday() < 5
        return day
    return ts + {
        "minute": timedelta(minutes=n),
        "hour": timedelta(hours=n),
        "week": timedelta(weeks=n),
    }.get(unit, timedelta(days=n))


def _zh_int(text: str) -> int | None:
    if text.isdigit():
        return int(text)
    if "十" in text:
        tens, _, ones = text.partition("十")
        return _ZH_DIGITS.get(tens, 1) * 10 + _ZH_DIGITS.get(ones, 0) if len(tens) <= 1 else None
    return _ZH_DIGITS.get(text) if len(text) == 1 else None


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
