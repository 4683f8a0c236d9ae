"""Folding fresh content (extractive or LLM) into the stored memory of the same key.

Nothing stated is silently lost: a superseded attribute value, an old status and a closed
open action all move to ``history``, with the event time they stopped being current (the
time of the statement that replaced or resolved them) and the time they were stated. A
plain fact the fresh consolidation re-read (its source turns are among this merge's) and
did not keep is dropped: the fresh content is the newer reading of those same turns, and a
stale "still hasn't shipped" must not outlive the delivery. Merging content that adds
nothing returns the stored memory itself, so replays and duplicate triggers cost no
version bump. Pure: ``now`` (the newest source event's time) is an argument.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from memstream.memory.extractive import MAX_OPEN_ACTIONS
from memstream.memory.phrases import action_family, find_state, moot, norm, resolves, unique
from memstream.memory.text import tokenize
from memstream.schemas import (
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

    Facts are de-duplicated by normalised text; fresh facts are folded in order, and a fact
    with an ``attribute`` supersedes the stored fact of that attribute when it is not older,
    the loser going to ``history``. A changed status moves the old one to history
    (attribute ``"status"``). An open action moves there as ``"open_action"`` when a later
    fact or timeline entry resolves it, when the story it belongs to has ended (a terminal
    status such as delivered, stated after it), or when the fresh consolidation re-read its
    turn and no longer lists it. Timeline entries are unique by (ts, event_id) and sorted;
    keys and source ids are unions in first-seen order. If nothing changes, ``existing``
    is returned as it is (same version and ``updated_at``).
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
    covered = set(source_event_ids)
    history = list(base.history)
    facts = _merge_facts(base.facts, fresh.facts, history, now, covered)
    status = base.status
    fresh_ts, base_ts = _status_ts(fresh), _status_ts(base)
    if fresh.status and norm(fresh.status) != norm(base.status):
        if _older(fresh.status, fresh_ts, base_ts, "status", history):
            _record(history, "status", fresh.status, base_ts or now, fresh_ts, unless_known=True)
        else:
            if base.status:
                _record(history, "status", base.status, fresh_ts or now, base_ts)
            status = fresh.status
    status_ts = _status_ts(fresh) if status == fresh.status else base_ts
    timeline = {(e.ts, e.event_id or ""): e for e in [*fresh.timeline, *base.timeline]}
    closed = {norm(h.value) for h in history if h.attribute == "open_action"}
    listed = {norm(a.text) for a in fresh.open_actions}
    actions: dict[str, OpenAction] = {}
    for a in [*base.open_actions, *fresh.open_actions]:
        if norm(a.text) not in closed:
            actions.setdefault(norm(a.text), a)
    evidence = [(f.text, f.ts) for f in facts] + [(e.text, e.ts) for e in timeline.values()]
    times = _event_times(facts, timeline.values())
    ignore = set(tokenize(key.replace(":", " ")))
    terminal = find_state(status) if status else None
    stored = {norm(a.text) for a in base.open_actions}
    open_actions = []
    for a in actions.values():
        since = times.get(a.event_id or "")
        # unknown, but no later than the stored memory's (event) time when it holds it
        bound = since or (existing.updated_at if existing and norm(a.text) in stored else None)
        if a.event_id in covered and norm(a.text) not in listed:
            _record(history, "open_action", a.text, now, since)  # the fresh reading closed it
        elif (done := _answer(a, since, evidence, ignore)) is not None:
            _record(history, "open_action", a.text, done, since)
        elif (
            terminal is not None
            and status_ts is not None
            and _before(bound, a.due, status_ts)
            and moot(action_family(a.text), terminal)
        ):
            _record(history, "open_action", a.text, status_ts, since)
        else:
            open_actions.append(a)
    # Consolidations add actions up: the memory keeps the newest, as one reading does.
    open_actions = open_actions[-MAX_OPEN_ACTIONS:]
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


def reinforced(existing: ConsolidatedMemory, strength: float) -> ConsolidatedMemory:
    """``existing`` with the strength a trigger that brought no new turn lends it: the
    merge's own rule (the higher of the two), nothing else touched (no version bump: what
    the memory says has not changed). ``existing`` itself when it is already as strong."""
    if strength <= existing.strength:
        return existing
    return existing.model_copy(update={"strength": strength})


def _merge_facts(
    base: list[Fact],
    fresh: list[Fact],
    history: list[HistoryEntry],
    now: datetime,
    covered: Collection[str],
) -> list[Fact]:
    wanted_fresh = {norm(f.text) for f in fresh}
    # A plain fact whose turns the fresh content re-read, and did not keep, is stale.
    facts = [
        f
        for f in base
        if f.attribute is not None
        or norm(f.text) in wanted_fresh
        or not f.source_event_ids
        or not set(f.source_event_ids) <= set(covered)
    ]
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
        if _older(f.text, f.ts, old.ts, f.attribute, history):
            _record(history, f.attribute, f.text, old.ts or now, f.ts, unless_known=True)
        else:
            _record(history, f.attribute, old.text, f.ts or now, old.ts)
            facts[same] = f
    return facts


def _older(
    value: str,
    ts: datetime | None,
    current_ts: datetime | None,
    attribute: str,
    history: Sequence[HistoryEntry],
) -> bool:
    """Whether ``value`` (stated at ``ts``) is older than the current value: earlier, or
    stated at the same time and already superseded once (so equal times cannot flip-flop)."""
    if ts is None or current_ts is None:
        return False
    if ts == current_ts:
        wanted = norm(value)
        return any(h.attribute == attribute and norm(h.value) == wanted for h in history)
    return ts < current_ts


def _status_ts(content: MemoryContent) -> datetime | None:
    wanted = norm(content.status)
    return next(
        (f.ts for f in content.facts if f.attribute == "status" and norm(f.text) == wanted), None
    )


def _record(
    history: list[HistoryEntry],
    attribute: str,
    value: str,
    superseded_at: datetime,
    stated_at: datetime | None = None,
    *,
    unless_known: bool = False,
) -> None:
    """Append a history entry; skip exact repeats (and any known value if ``unless_known``)."""
    wanted = norm(value)
    for h in history:
        if (
            h.attribute == attribute
            and norm(h.value) == wanted
            and (
                unless_known
                or h.superseded_at == superseded_at
                or (stated_at is not None and h.stated_at == stated_at)
            )
        ):
            return
    history.append(
        HistoryEntry(
            attribute=attribute, value=value, superseded_at=superseded_at, stated_at=stated_at
        )
    )


def _event_times(facts: Sequence[Fact], timeline: Collection[TimelineEntry]) -> dict[str, datetime]:
    """Event id -> event time, from what the memory itself records."""
    times = {e.event_id: e.ts for e in timeline if e.event_id}
    for f in facts:
        if f.ts is not None:
            for event_id in f.source_event_ids:
                times.setdefault(event_id, f.ts)
    return times


def _answer(
    action: OpenAction,
    since: datetime | None,
    evidence: list[tuple[str, datetime | None]],
    ignore: Collection[str],
) -> datetime | None:
    """The time of the first later statement that resolves the action (None if none does)."""
    found = [
        ts
        for text, ts in evidence
        if ts is not None
        and (since is None or ts > since)
        and norm(text) != norm(action.text)
        and resolves(action.text, text, ignore)
    ]
    return min(found) if found else None


def _before(since: datetime | None, due: datetime | None, ts: datetime) -> bool:
    """Whether a promise (stated at ``since``, due at ``due``) predates ``ts``."""
    if since is not None:
        return since < ts
    return due is not None and due < ts
