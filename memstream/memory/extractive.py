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
- the title names the entity and the topic ("Order A-10293 — delivery");
- a topic (a cluster's key, ``topic:<id>``) gets a digest instead of top sentences: the
  facts its speakers stated, one line per session first, each line ``speaker: sentence``
  with its day, titled by who speaks and the words the lines share. Advice, compliments and
  small talk are left out by their grammar, not by their words: a digest line names
  something exact or speaks in the first person more than it addresses the listener (see
  ``_states_a_fact``).

It is deterministic: the same turns always give the same memory. Pure.

Its cost is bounded and linear, whatever the turns say (a turn may hold 8,000 characters of
short promises). It reads the newest ``MAX_TURNS`` turns, ``MAX_READ_CHARS`` characters and
``MAX_SENTENCES`` sentences in all, shared evenly by the turns (of a turn that says more than
its share, its beginning and its end), checks the newest ``MAX_PROMISES`` distinct promises,
and indexes what it compares -- a prefix-filter index for near-duplicate facts, a word index
for what may resolve a promise -- instead of comparing every pair. Comparisons are counted
against a work budget (``WORK_BUDGET`` units of about a microsecond): when it runs out, what
was built so far is the memory. ``extract_memory`` says whether a bound cut the reading
(``Extraction.cut``). Conversations stay far below every bound, and for them the memory is
exactly the one reading and comparing everything gives.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from memstream.memory.due import parse_due
from memstream.memory.phrases import (
    COMMITMENT,
    PROMISE_WORDS,
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
from memstream.memory.text import extract_entities, is_salient, tokenize
from memstream.schemas import Fact, MemoryContent, OpenAction, StoredTurn, TimelineEntry

MAX_FACTS = 6
TOPIC_PREFIX = "topic:"
MAX_TITLE_CHARS = 80
MAX_ITEM_CHARS = 160
MAX_PAST_VALUES = 3  # superseded values per attribute handed to the merge as history

# Bounds on what one consolidation reads and compares. A consolidation gets the newest
# ``consolidation.max_turns`` (40) turns of at most 8,000 characters; ordinary chat turns hold
# 1-10 sentences, a pasted e-mail some 50-80. The bounds sit above both, so only input no
# conversation produces (thousands of short sentences) is cut, and the cost stays linear.
MAX_TURNS = 64  # newest turns read
MAX_TURN_SENTENCES = 64  # sentences read per turn
MAX_SENTENCES = 1024  # sentences read per consolidation, shared evenly by the turns
MAX_READ_CHARS = 64_000  # characters read per consolidation, shared evenly by the turns
MAX_KEYS = 32  # the key's own entity, then the others named, then shared terms
MAX_PROMISES = 32  # distinct promises checked for resolution, the newest
MAX_OPEN_ACTIONS = 12  # open actions per memory, the newest
# Comparisons (a sentence against a turn, a group or a later sentence) per consolidation;
# a 40-turn conversation of ordinary turns spends under 20,000.
WORK_BUDGET = 160_000

Cut = Literal["input", "budget"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])\s*|\n+")
# An attachment or stage direction in brackets ("[shares a photo: ...]") is not speech.
_BRACKETED = re.compile(r"\[[^\[\]]*\]")
_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|we'd|we'll|us|our|ours)\b|我",
    re.IGNORECASE,
)
_SECOND_PERSON = re.compile(
    r"\b(?:you|you're|you've|you'd|you'll|your|yours|yourself|ya|u)\b|你|您", re.IGNORECASE
)
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
    said: str  # ``text`` without attachment notes in brackets, whitespace collapsed
    turn: StoredTurn
    tokens: frozenset[str]
    entities: frozenset[str]
    state: State | None  # asserted, for this key, and not inside a promise
    commitment: bool  # a promise ("I will", "我会跟进")
    question: bool
    salient: bool  # a statement worth keeping as a fact


# Near-duplicate sentences folded into one: the first, its attribute, every event id.
_Group = tuple[_Sentence, str | None, list[str]]


@dataclass
class _Budget:
    """Work units: ``spend`` says whether the work may go on; ``out`` once it may not."""

    units: int
    spent: int = 0
    out: bool = False

    def spend(self, units: int = 1) -> bool:
        self.spent += units
        self.out = self.out or self.spent > self.units
        return not self.out


@dataclass(frozen=True)
class Extraction:
    """``consolidate_extractive``'s memory and how it was read: ``cut`` is None when every
    sentence was read and compared, ``"input"`` when a bound (``MAX_TURNS``,
    ``MAX_READ_CHARS``, ``MAX_TURN_SENTENCES``, ``MAX_SENTENCES``, ``MAX_PROMISES``,
    ``MAX_OPEN_ACTIONS``, ``MAX_KEYS``) left something out, ``"budget"`` when the work
    budget ran out; ``work`` is the units spent."""

    content: MemoryContent
    cut: Cut | None = None
    work: int = 0


def consolidate_extractive(key: str, turns: Sequence[StoredTurn], now: datetime) -> MemoryContent:
    """One memory from the turns of ``key``: ``extract_memory``'s content."""
    return extract_memory(key, turns, now).content


def extract_memory(
    key: str, turns: Sequence[StoredTurn], now: datetime, *, budget: int = WORK_BUDGET
) -> Extraction:
    """One memory from the turns of ``key``, by rule: no model, no randomness.

    Title: the key's label and its topic. Facts: at most 6 salient statements by score,
    near-duplicates folded (their event ids kept), the newest value per attribute (older
    values follow as history for the merge). Status: the state of the latest turn that
    states one. Timeline: one entry per turn that carries a state or an entity. Open
    actions: promises no later turn resolved, ``due`` parsed relative to their turn.
    ``now`` only dates the summary when there are no turns. ``budget``: work units (see
    ``WORK_BUDGET``); the memory is cut, not late, when they run out.
    """
    ordered = sorted(turns, key=lambda t: (t.ts, t.event_id))
    label = _key_label(key)
    if not ordered:
        content = MemoryContent(
            title=clip(label or key, MAX_TITLE_CHARS),
            keys=_key_entities(key),
            summary=f"No turns recorded for {key} as of {now:%Y-%m-%d}.",
        )
        return Extraction(content)
    # three quarters for ranking and folding facts, a quarter kept for the promises
    work, promise_work = _Budget(budget * 3 // 4), _Budget(budget - budget * 3 // 4)
    sessions = len({t.session_id for t in ordered})
    first, last, total = ordered[0].ts, ordered[-1].ts, len(ordered)
    cut_input = total > MAX_TURNS
    ordered = ordered[-MAX_TURNS:]
    room = _shares([len(t.text) for t in ordered], MAX_READ_CHARS, MAX_READ_CHARS)
    said_by = [_split(_ends(t.text, n)) for t, n in zip(ordered, room, strict=True)]
    shares = _shares([len(said) for said in said_by], MAX_SENTENCES, MAX_TURN_SENTENCES)
    read = [_read(said, n) for said, n in zip(said_by, shares, strict=True)]
    # what was read of each turn: all of it, or its beginning and end when it says too much
    whole = [
        n >= len(t.text) and len(r) == len(said)
        for t, n, said, r in zip(ordered, room, said_by, read, strict=True)
    ]
    texts = [t.text if w else " ".join(r) for t, w, r in zip(ordered, whole, read, strict=True)]
    cut_input = cut_input or not all(whole)
    own = _key_entities(key)
    entities = sorted(
        {e for t in ordered for e in t.entities} | {e for x in texts for e in extract_entities(x)}
    )
    # words of the entities and the label say nothing new in a title, a key or a match
    known = {w for e in entities for w in tokenize(e.partition(":")[2])} | set(tokenize(label))
    by_turn = {t.event_id: _sentences(t, r, own, known) for t, r in zip(ordered, read, strict=True)}
    sentences = [s for t in ordered for s in by_turn[t.event_id]]
    turn_tokens = {t.event_id: frozenset(tokenize(x)) for t, x in zip(ordered, texts, strict=True)}
    work.spend(len(sentences) * max(len(ordered) - 1, 0))  # centrality: one cosine per turn
    scores = {id(s): _score(s, turn_tokens, entities) for s in sentences}
    ranked = sorted(
        (s for s in sentences if s.salient),
        key=lambda s: (-scores[id(s)], s.turn.ts, s.turn.event_id, s.text),
    )
    states = [s for s in sentences if s.state is not None]
    status_facts = _status_facts(states)
    status = status_facts[-1].text if status_facts else ""
    facts, who = _key_facts(key, ranked, states, status_facts, work)
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
    actions, more = _open_actions(sentences, states, known, promise_work)
    cut_input = cut_input or more
    # title and key words come from what was said, not from greetings around it
    df: dict[str, int] = {}
    for t in ordered:
        for w in {w for s in by_turn[t.event_id] if s.salient or s.commitment for w in s.tokens}:
            df[w] = df.get(w, 0) + 1
    said = " ".join(s.text for s in sentences if s.salient or s.commitment)
    title = _quoting(who, _title(label, states, facts, df, known, action_family(said)))
    terms = [w for w, n in df.items() if n >= 2 and w not in known and _is_term(w)]
    terms = sorted(terms, key=lambda w: (-df[w], w))[:3]
    current = [f for f in facts if f.attribute != "status"]
    latest = status or (current[0].text if current else clip(ordered[-1].text, MAX_ITEM_CHARS))
    summary = (
        f"{label or title}: {_count(total, 'turn')} over {_count(sessions, 'session')}, "
        f"{first:%Y-%m-%d} to {last:%Y-%m-%d}. Latest: {latest}"
    )
    keys = unique([*own, *entities, *terms])
    cut_input = cut_input or len(keys) > MAX_KEYS
    content = MemoryContent(
        title=title,
        facts=facts,
        status=status,
        timeline=timeline,
        open_actions=actions,
        keys=keys[:MAX_KEYS],
        summary=summary,
    )
    cut: Cut | None = "budget" if work.out or promise_work.out else "input" if cut_input else None
    return Extraction(content, cut, work.spent + promise_work.spent)


def _split(text: str) -> list[str]:
    """The sentences of a turn, whitespace collapsed."""
    return [s for s in (" ".join(raw.split()) for raw in _SENTENCE_END.split(text)) if s]


def _ends(text: str, n: int) -> str:
    """At most ``n`` characters of ``text``: all of it, or its beginning and its end."""
    if len(text) <= n:
        return text
    return f"{text[: n - n // 2]}\n{text[len(text) - n // 2 :]}"


def _shares(counts: list[int], room: int, cap: int) -> list[int]:
    """What is read of each turn (sentences, characters): up to ``cap`` each, ``room`` in
    all, shared evenly -- a turn that says less leaves the rest to the others, the newest
    turns get the remainder -- so that a long turn crowds out no other turn."""
    want = [min(n, cap) for n in counts]
    if sum(want) <= room:
        return want
    lo, hi = 0, cap  # the largest level such that min(want, level) all fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if sum(min(w, mid) for w in want) <= room else (lo, mid - 1)
    shares = [min(w, lo) for w in want]
    spare = room - sum(shares)
    for i in reversed(range(len(want))):
        if spare and want[i] > lo:
            shares[i] += 1
            spare -= 1
    return shares


def _read(said: list[str], n: int) -> list[str]:
    """``n`` sentences of a turn that says ``said``: all, or its first and last halves
    (where a long message states its point and how it ends)."""
    return said if len(said) <= n else said[: n - n // 2] + said[len(said) - n // 2 :]


def _sentences(
    turn: StoredTurn, texts: list[str], own: list[str], known: set[str]
) -> list[_Sentence]:
    out: list[_Sentence] = []
    for text in texts:
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
        said = " ".join(_BRACKETED.sub(" ", text).split())  # speech, not attachments
        tokens = frozenset(tokenize(said))
        content = tokens - known - _NARRATION
        fact_worthy = len(content) >= 2 or (bool(_CJK.search(text)) and len(content) >= 1)
        out.append(
            _Sentence(
                text=text,
                said=said,
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
    sentences: list[_Sentence], states: list[_Sentence], known: set[str], work: _Budget
) -> tuple[list[OpenAction], bool]:
    """Promises that no later turn resolved, first statement of each kept (the newest
    ``MAX_OPEN_ACTIONS``), and whether some were left out.

    A promise is resolved when a later sentence, not a question, says it happened
    (``resolves``) or a later state ends its story (``moot``). Indexed, not pairwise: only a
    sentence sharing a content word with the promise can resolve it, so only those are
    asked, newest first, each distinct text once per distinct promise; a promise is resolved
    when its newest resolver is later than it. Only the newest ``MAX_PROMISES`` distinct
    promises are checked; one the budget stopped before is left out, not guessed open.
    """
    promises = [s for s in sentences if s.commitment]
    texts = unique(s.text for s in reversed(promises))
    left_out = len(texts) > MAX_PROMISES
    words = {text: set(tokenize(text)) - PROMISE_WORDS - known for text in texts[:MAX_PROMISES]}
    resolved_at = _resolutions(sentences, promises, words, known, work)
    kept = _unresolved(promises, states, resolved_at)
    left_out = left_out or len(resolved_at) < len(words) or len(kept) > MAX_OPEN_ACTIONS
    return kept[-MAX_OPEN_ACTIONS:], left_out


def _resolutions(
    sentences: list[_Sentence],
    promises: list[_Sentence],
    words: dict[str, set[str]],
    known: set[str],
    work: _Budget,
) -> dict[str, datetime | None]:
    """Each promise text checked (``words``: its content words, newest promise first) ->
    its newest resolver's time, None when nothing resolves it; the texts the budget stopped
    before are absent."""
    wanted = set().union(*words.values())
    index: dict[str, list[int]] = {}  # content word -> positions of sentences saying it
    for j, o in enumerate(sentences):
        if not o.question:
            for w in o.tokens & wanted:
                index.setdefault(w, []).append(j)
    since = {s.text: s.turn.ts for s in reversed(promises)}  # each text's first statement
    resolved_at: dict[str, datetime | None] = {}
    for text, content in words.items():
        resolver = _newest_resolver(text, content, sentences, index, since[text], known, work)
        if work.out:
            break  # this promise and older ones unchecked
        resolved_at[text] = resolver
    return resolved_at


def _newest_resolver(
    text: str,
    content: set[str],
    sentences: list[_Sentence],
    index: dict[str, list[int]],
    since: datetime,
    known: set[str],
    work: _Budget,
) -> datetime | None:
    """The time of the newest sentence after ``since`` sharing a content word with the
    promise ``text`` that says it happened (each distinct text asked once), or None;
    None too when the budget runs out (the caller reads ``work.out``)."""
    asked: set[str] = set()
    for j in sorted(set().union(*(index.get(w, ()) for w in content)), reverse=True):
        o = sentences[j]
        if o.turn.ts <= since:
            break
        if o.text in asked:
            continue
        if not work.spend():
            break
        asked.add(o.text)
        if resolves(text, o.text, ignore=known):
            return o.turn.ts
    return None


def _unresolved(
    promises: list[_Sentence],
    states: list[_Sentence],
    resolved_at: dict[str, datetime | None],
) -> list[OpenAction]:
    """The checked promises no later resolver answered and no later state made moot, first
    statement of each distinct text, oldest first."""
    ended: dict[str | None, datetime | None] = {}  # family -> latest state that ends it
    actions: dict[str, OpenAction] = {}
    for s in promises:
        if s.text not in resolved_at:
            continue
        resolver = resolved_at[s.text]
        if resolver is not None and resolver > s.turn.ts:
            continue
        family = action_family(s.text)
        if family not in ended:
            ends = [o.turn.ts for o in states if o.state is not None and moot(family, o.state)]
            ended[family] = max(ends, default=None)
        if (end := ended[family]) is not None and end > s.turn.ts:
            continue
        text = clip(s.text, MAX_ITEM_CHARS)
        if norm(text) not in actions:
            due = parse_due(s.text, s.turn.ts)
            actions[norm(text)] = OpenAction(text=text, due=due, event_id=s.turn.event_id)
    return list(actions.values())


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


def _key_facts(
    key: str, ranked: list[_Sentence], states: list[_Sentence], status: list[Fact], work: _Budget
) -> tuple[list[Fact], str]:
    """The facts of ``key``, the status facts after them, and who they quote (a topic's
    digest quotes its speakers; an entity's facts quote nobody)."""
    digest = key.startswith(TOPIC_PREFIX)
    facts = _facts(ranked, {id(s) for s in states}, work, digest=digest)
    return [*facts, *status], _quoted_speakers(facts, ranked) if digest else ""


def _facts(
    ranked: list[_Sentence], status_sentences: set[int], work: _Budget, *, digest: bool = False
) -> list[Fact]:
    """Top sentences, near-duplicates folded together; per attribute the newest value,
    preceded by up to ``MAX_PAST_VALUES`` older ones (history for the merge).

    A topic's ``digest`` fills the rest with the facts its speakers stated
    (``_states_a_fact``), the best of each session first -- a topic is what recurs across
    sessions -- each line ``speaker: text``, in the order it was said."""
    # a state is the status (and its history), not a fact besides it
    groups = _fold([s for s in ranked if id(s) not in status_sentences], work)
    by_attribute: dict[str, list[int]] = {}
    for i, (_, attribute, _) in enumerate(groups):
        if attribute is not None:
            by_attribute.setdefault(attribute, []).append(i)
    keep: list[int] = []
    for members in by_attribute.values():
        members.sort(key=lambda i: (groups[i][0].turn.ts, i))
        keep.append(members[-1])
    keep = keep[:MAX_FACTS]
    others = [
        i
        for i, (s, attribute, _) in enumerate(groups)
        if attribute is None and (not digest or _states_a_fact(s))
    ]
    keep += (_across_sessions(others, groups) if digest else others)[: MAX_FACTS - len(keep)]
    past = [
        i
        for members in by_attribute.values()
        if members[-1] in keep
        for i in members[:-1][-MAX_PAST_VALUES:]
    ]

    def fact(i: int) -> Fact:
        s, attribute, ids = groups[i]
        text = _quoted(s) if digest else s.text
        return Fact(text=clip(text, MAX_ITEM_CHARS), attribute=attribute, source_event_ids=ids,
                    ts=s.turn.ts)  # fmt: skip

    def said_at(i: int) -> tuple[datetime, int]:
        return (groups[i][0].turn.ts, i)

    # older values of an attribute first: folding them in order leaves the newest current
    shown = sorted(keep, key=said_at) if digest else sorted(keep)
    return [fact(i) for i in sorted(past, key=said_at)] + [fact(i) for i in shown]


def _across_sessions(ranked: list[int], groups: list[_Group]) -> list[int]:
    """``ranked`` with the best group of each session first, then the rest, in rank order."""
    sessions: set[str] = set()
    firsts = []
    for i in ranked:
        if groups[i][0].turn.session_id not in sessions:
            sessions.add(groups[i][0].turn.session_id)
            firsts.append(i)
    chosen = set(firsts)
    return firsts + [i for i in ranked if i not in chosen]


def _quoted(s: _Sentence) -> str:
    """``speaker: text``, without attachment notes in brackets."""
    return f"{s.turn.speaker}: {s.said}" if s.turn.speaker else s.said


def _quoted_speakers(facts: list[Fact], ranked: list[_Sentence]) -> str:
    """Who a digest's lines quote, the most quoted first (at most two, for the title)."""
    speaker_of = {s.turn.event_id: s.turn.speaker for s in ranked}
    quoted: dict[str, int] = {}
    for f in facts:  # a fact's first source is its line's own turn (``_fold``)
        if who := speaker_of.get(f.source_event_ids[0]) if f.source_event_ids else None:
            quoted[who] = quoted.get(who, 0) + 1
    return " & ".join(sorted(quoted, key=lambda w: (-quoted[w], w))[:2])


def _quoting(who: str, title: str) -> str:
    return clip(f"{who} — {title}", MAX_TITLE_CHARS) if who else title


def _states_a_fact(s: _Sentence) -> bool:
    """A digest line: a sentence that names something exact (an entity, a number), or tells
    of the speaker's own life rather than advising, praising or chatting to the listener --
    it says "I" / "we" more often than "you" (attachments in brackets aside)."""
    if s.entities or any(c.isdigit() for c in s.said):
        return True
    return len(_FIRST_PERSON.findall(s.said)) > len(_SECOND_PERSON.findall(s.said))


def _fold(ranked: list[_Sentence], work: _Budget) -> list[_Group]:
    """Sentences in rank order as groups of near-duplicates: (first sentence, its attribute,
    the event ids of all). A sentence folds into the first group whose first sentence is
    ``_similar``.

    Only candidates are compared: groups with the same ``norm`` and groups sharing a token of
    their ``_prefix`` (the prefix filter of set-similarity joins: two token sets with a
    Jaccard index of 0.7 or more share a token of their prefixes) and of a compatible size,
    so the result is the pairwise one. Stops, with the groups made so far, when ``work``
    runs out.
    """
    groups: list[_Group] = []
    norms: list[str] = []  # of each group's first sentence
    by_norm: dict[str, int] = {}
    by_token: dict[str, list[int]] = {}
    order = _token_order(s.tokens for s in ranked)
    for s in ranked:
        key = norm(s.text)
        prefix = _prefix(s.tokens, order)
        candidates = set().union(*(by_token.get(w, ()) for w in prefix))
        if key in by_norm:
            candidates.add(by_norm[key])
        twin = None
        low, high = 7 * len(s.tokens), 10 * len(s.tokens)  # J >= 0.7 needs 0.7|A| <= |B| <= |A|/0.7
        for g in sorted(candidates):
            size = len(groups[g][0].tokens)
            if not (low <= 10 * size and 7 * size <= high) and norms[g] != key:
                continue
            if not work.spend():
                break
            if _similar(groups[g][0], norms[g], s, key):
                twin = groups[g]
                break
        if work.out:
            break
        if twin is None:
            by_norm.setdefault(key, len(groups))
            for w in prefix:
                by_token.setdefault(w, []).append(len(groups))
            groups.append((s, _attribute(s), [s.turn.event_id]))
            norms.append(key)
        elif s.turn.event_id not in twin[2]:
            twin[2].append(s.turn.event_id)
    return groups


def _similar(a: _Sentence, a_norm: str, b: _Sentence, b_norm: str) -> bool:
    """The same sentence up to case and punctuation, or a token-set Jaccard index >= 0.7."""
    union = a.tokens | b.tokens
    return a_norm == b_norm or (bool(union) and len(a.tokens & b.tokens) / len(union) >= 0.7)


def _token_order(token_sets: Iterable[frozenset[str]]) -> dict[str, int]:
    """A global order of the tokens, rarest first (short candidate lists in the index)."""
    df: dict[str, int] = {}
    for tokens in token_sets:
        for w in tokens:
            df[w] = df.get(w, 0) + 1
    return {w: i for i, w in enumerate(sorted(df, key=lambda w: (df[w], w)))}


def _prefix(tokens: frozenset[str], order: dict[str, int]) -> list[str]:
    """The tokens two sets with a Jaccard index >= 0.7 cannot both leave out.

    If J(A, B) >= 0.7 then |A & B| >= 0.7 |A| and >= 0.7 |B|, so the first shared token in
    ``order`` is among the first |A| - ceil(0.7 |A|) + 1 of A, and likewise of B.
    """
    need = (7 * len(tokens) + 9) // 10  # ceil(0.7 |A|) in integers: J >= 0.7 is 10|A&B| >= 7|A|B|
    return sorted(tokens, key=order.__getitem__)[: len(tokens) - need + 1]


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
