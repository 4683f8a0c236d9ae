"""Folding fresh content (extractive or LLM) into the stored memory of the same key.

Nothing is silently deleted: a superseded attribute value, an old status and a closed open
action all move to ``history`` with the time they stopped being current. Merging content
that adds nothing returns the stored memory itself, so replays and duplicate triggers cost
no version bump. Pure: ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from memory.phrases import DONE, PROMISE_WORDS, norm, unique
from memory.text import tokenize
from schemas import (
    ConsolidatedMemory,
    Fact,
    HistoryEntry,
    MemoryContent,
    OpenAction,
    TimelineEntry,
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
    if fresh.status and norm(fresh.status) != norm(base.status):
        fresh_ts, base_ts = _status_ts(fresh), _status_ts(base)
        if base_ts is not None and fresh_ts is not None and fresh_ts < base_ts:
            _record(history, "status", fresh.status, now, unless_known=True)
        else:
            if base.status:
                _record(history, "status", base.status, now)
            status = fresh.status
    timeline = {(e.ts, e.event_id or ""): e for e in [*fresh.timeline, *base.timeline]}
    closed = {norm(h.value) for h in history if h.attribute == "open_action"}
    actions: dict[str, OpenAction] = {}
    for a in [*base.open_actions, *fresh.open_actions]:
        if norm(a.text) not in closed:
            actions.setdefault(norm(a.text), a)
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
        keys=unique([*base.keys, *fresh.keys]),
        summary=fresh.summary or base.summary,
        memory_id=memory_id,
        tenant_id=tenant_id,
        user_id=user_id,
        key=key,
        strength=max(base.strength, strength) if existing is not None else strength,
        created_at=base.created_at,
        updated_at=base.updated_at,
        source_event_ids=unique([*base.source_event_ids, *source_event_ids]),
        links=list(base.links),
        history=history,
        version=base.version,
        decayed_to=base.decayed_to,
        feedback_ids=list(base.feedback_ids),
    )
    if existing is not None and merged == existing:
        return existing
    return merged.model_copy(update={"updated_at": now, "version": base.version + 1})


def _merge_facts(
    base: list[Fact], fresh: list[Fact], history: list[HistoryEntry], now: datetime
) -> list[Fact]:
    facts = list(base)
    for f in fresh:
        wanted = norm(f.text)
        twin = next((i for i, g in enumerate(facts) if norm(g.text) == wanted), None)
        if twin is not None:
            g = facts[twin]
            ids = unique([*g.source_event_ids, *f.source_event_ids])
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
    wanted = norm(content.status)
    return next(
        (f.ts for f in content.facts if f.attribute == "status" and norm(f.text) == wanted), None
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
    wanted = norm(value)
    for h in history:
        if (
            h.attribute == attribute
            and norm(h.value) == wanted
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
    words = set(tokenize(action.text)) - PROMISE_WORDS
    for text, ts, ids in evidence:
        if action.event_id and action.event_id in ids:
            continue
        if since is not None and ts is not None and ts < since:
            continue
        if DONE.search(text.lower()) and words & set(tokenize(text)):
            return True
    return False
