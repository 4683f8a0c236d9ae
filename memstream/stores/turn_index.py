"""The RPC's in-process index of every turn of a user: vectors, texts, BM25 postings.

Retrieval ranks all of a user's turns, hot or archived, the same way (dense + BM25 fused),
so each RPC process keeps, per user it serves, the union of two sources:

- the archive tier (``TurnArchive.list_turns``): every turn, written through by the
  archive worker; read once per user (a scroll), and again only when turns are known to
  be missing (below);
- the hot tier in Redis (``RedisState.timeline_ids`` / ``turns``): the newest turns, there
  before the archive worker has caught up. A query reads the user's turn version (one small
  round trip, a fresh token on every write by ``memorize``); when it changed, only the turns
  added to the timeline since are read. Turns that leave the timeline (event-time expiry,
  the cap) are kept: they are archived. One that left before this process saw it and that
  the archive worker has not written yet is still in Redis (``TurnReader.leaving``).

Both hold a turn's float16-rounded embedding, so a turn ranks the same from either. Rows
are in (time, event id) order whichever source they came from, so the same turns always
give the same index. Completeness is checked, not assumed: Redis counts every turn ever
written (``tall``); while the index holds fewer, a turn left the hot tier before this
process saw it, and the archive is read again once its count has grown.

A forget deletes the version token with everything else, so the next query re-syncs (to
nothing). The cache is bounded by memory (``max_bytes``, an estimate per user), not by a
user count: one 10k-turn user weighs as much as a hundred small ones.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from memstream.memory.acts import acts_meant
from memstream.memory.chatter import chatter_mask
from memstream.memory.lexical import LexicalIndex, document_tokens, lexical_text
from memstream.memory.names import Names, names_of
from memstream.memory.profile import NO_ATTRIBUTE, attributes_of
from memstream.memory.ranking import turn_text
from memstream.memory.text import read_once
from memstream.memory.turns import (
    Exemplars,
    promises,
    reports_something_done,
    said_as,
    says_something,
)
from memstream.schemas import StoredTurn
from memstream.stores.cpu import off_loop
from memstream.stores.longterm import TurnArchive
from memstream.stores.short_term import TurnReader, TurnWithVector

ARCHIVE_PAGE = 1024
# Bytes per turn beyond its vector and rendered line: the StoredTurn (~1.4 KB), its BM25
# postings and tokens (~2.2 KB) and the row's entries in the lookup tables and marks
# (~1.7 KB). Measured with tracemalloc over LoCoMo-dev's turns (146 characters on
# average): ~7.5 KB a turn held in all. The cache's bound (rpc.turn_cache_mb) is only as
# true as this.
TURN_OVERHEAD_BYTES = 6 * 1024


@dataclass(frozen=True)
class UserTurns:
    """One consistent view of a user's turns, row for row: a snapshot. A sync builds a new
    view (its ``lexical`` grown copy on write, ``LexicalIndex.with_docs``) and never changes
    one handed out, so a retrieval may rank a view whatever was written after it was read."""

    version: bytes | None
    ids: list[str]
    docs: list[StoredTurn]
    ts: npt.NDArray[np.float64]
    vectors: npt.NDArray[np.float32]  # (n, dim), float16-rounded, as stored
    lexical: LexicalIndex
    positions: dict[str, int] = field(default_factory=dict)
    speakers: list[str] = field(default_factory=list)  # speaker, else role
    texts: list[str] = field(default_factory=list)  # ``memory.ranking.turn_text``, rendered once
    speaker_of: npt.NDArray[np.object_] = field(default_factory=lambda: np.array([], object))
    speaker_names: tuple[str, ...] = ()  # distinct speakers
    by_entity: dict[str, list[int]] = field(default_factory=dict)  # normalised key -> rows
    # Rows that say something (``says_something``): small talk never takes a reader's budget.
    salient: npt.NDArray[np.bool_] = field(default_factory=lambda: np.array([], bool))
    # Rows that promise the customer something, and rows that say something was done: read
    # at query time to show a promise open until a later turn keeps it (memory.promises).
    promise: npt.NDArray[np.bool_] = field(default_factory=lambda: np.array([], bool))
    done: npt.NDArray[np.bool_] = field(default_factory=lambda: np.array([], bool))
    names: Names = field(default_factory=dict)  # key -> the names given it (memory.names)
    # The standing attribute a row states (``memory.profile.ATTRIBUTES`` index, -1: none).
    attribute: npt.NDArray[np.int8] = field(default_factory=lambda: np.array([], np.int8))
    # The act a row describes by meaning (``memory.acts.MEANT_ACTS`` index, -1: none).
    act: npt.NDArray[np.int8] = field(default_factory=lambda: np.array([], np.int8))
    # Each row's words as one number: a line repeated word for word is formulaic.
    line_keys: npt.NDArray[np.int64] = field(default_factory=lambda: np.array([], np.int64))
    expected: int = 0  # turns ever written for the user (Redis ``tall``)
    archive_seen: int = -1  # the archive's count when last read (-1: never read)
    nbytes: int = 0  # estimated memory held

    @classmethod
    def build(
        cls,
        version: bytes | None,
        rows: Sequence[TurnWithVector],
        lexical: LexicalIndex,
        dim: int,
        *,
        expected: int = 0,
        archive_seen: int = -1,
        known: UserTurns | None = None,
        exemplars: Exemplars | None = None,
    ) -> UserTurns:
        """The view of ``rows`` (in their order). What a row of ``known`` (the view it
        replaces) already holds -- its rendered line, its marks -- is reused, not read again
        from the text: a rebuild of a 10k-turn user is a merge, not 30k text scans."""
        docs = [r.turn for r in rows]
        held = (
            np.array([known.positions.get(t.event_id, -1) for t in docs], dtype=np.intp)
            if known is not None
            else np.full(len(docs), -1, dtype=np.intp)
        )
        by_entity: dict[str, list[int]] = {}
        for row, turn in enumerate(docs):
            for key in turn.entities:
                by_entity.setdefault(key, []).append(row)
        vectors = (
            np.stack([r.vector for r in rows]).astype(np.float32)
            if rows
            else np.zeros((0, dim), dtype=np.float32)
        )
        rendered = [
            known.texts[h] if known is not None and h >= 0 else turn_text(t)
            for t, h in zip(docs, held.tolist(), strict=True)
        ]
        salient = _salient(docs, vectors, exemplars, held, known.salient if known else None)
        attribute = _attributes(docs, vectors, exemplars, held, known)
        return cls(
            version=version,
            ids=[t.event_id for t in docs],
            docs=docs,
            ts=np.array([t.ts.timestamp() for t in docs], dtype=np.float64),
            vectors=vectors,
            lexical=lexical,
            positions={t.event_id: i for i, t in enumerate(docs)},
            speakers=[t.speaker or t.role for t in docs],
            texts=rendered,
            speaker_of=np.array([t.speaker or t.role for t in docs], dtype=object),
            speaker_names=tuple(sorted({t.speaker or t.role for t in docs})),
            by_entity=by_entity,
            names=names_of(docs, plain=_plain(salient, attribute)),
            salient=salient,
            attribute=attribute,
            act=_acts(vectors, exemplars, held, known),
            promise=_marks(promises, docs, held, known.promise if known else None),
            done=_marks(reports_something_done, docs, held, known.done if known else None),
            line_keys=_marks(
                said_as, docs, held, known.line_keys if known else None, kind=np.int64
            ),
            expected=expected,
            archive_seen=archive_seen,
            nbytes=int(vectors.nbytes)
            + sum(2 * len(t) for t in rendered)
            + TURN_OVERHEAD_BYTES * len(docs),
        )

    def extended(
        self,
        version: bytes | None,
        rows: Sequence[TurnWithVector],
        lexical: LexicalIndex,
        *,
        expected: int,
        archive_seen: int,
        exemplars: Exemplars | None = None,
    ) -> UserTurns:
        """This view with ``rows`` appended (each sorting after every row here) and
        ``lexical`` as its postings: what a sync does as new turns arrive, without
        re-rendering the thousands already held. This view is left as it is."""
        if not rows:
            return replace(
                self,
                version=version,
                lexical=lexical,
                expected=expected,
                archive_seen=archive_seen,
            )
        start = len(self.ids)
        docs = [r.turn for r in rows]
        texts = [turn_text(t) for t in docs]
        speakers = [t.speaker or t.role for t in docs]
        positions = dict(self.positions)
        by_entity = dict(self.by_entity)  # lists are replaced, never appended to: shared
        for row, turn in enumerate(docs, start):
            positions[turn.event_id] = row
            for key in turn.entities:
                by_entity[key] = [*by_entity.get(key, ()), row]
        added = np.stack([r.vector for r in rows])
        vectors = np.concatenate([self.vectors, added])
        salient = _salient(docs, added, exemplars)
        attribute = _attributes(docs, added, exemplars)
        return UserTurns(
            version=version,
            ids=self.ids + [t.event_id for t in docs],
            docs=self.docs + docs,
            ts=np.concatenate([self.ts, [t.ts.timestamp() for t in docs]]),
            vectors=vectors.astype(np.float32, copy=False),
            lexical=lexical,
            positions=positions,
            speakers=self.speakers + speakers,
            texts=self.texts + texts,
            speaker_of=np.concatenate([self.speaker_of, np.array(speakers, dtype=object)]),
            speaker_names=tuple(sorted({*self.speaker_names, *speakers})),
            by_entity=by_entity,
            names=names_of(
                docs,
                self.names,
                before=self.docs[-1] if self.docs else None,
                plain=_plain(salient, attribute),
            ),
            salient=np.concatenate([self.salient, salient]),
            attribute=np.concatenate([self.attribute, attribute]),
            act=np.concatenate([self.act, _acts(added, exemplars)]),
            promise=np.concatenate([self.promise, _marks(promises, docs)]),
            done=np.concatenate([self.done, _marks(reports_something_done, docs)]),
            line_keys=np.concatenate([self.line_keys, _marks(said_as, docs, kind=np.int64)]),
            expected=expected,
            archive_seen=archive_seen,
            nbytes=self.nbytes
            + int(rows[0].vector.nbytes) * len(rows)
            + sum(2 * len(t) for t in texts)
            + TURN_OVERHEAD_BYTES * len(rows),
        )

    def last_key(self) -> tuple[float, str] | None:
        return (float(self.ts[-1]), self.ids[-1]) if self.ids else None

    @property
    def complete(self) -> bool:
        """Whether every turn Redis counted is here."""
        return len(self.ids) >= self.expected

    def rows(self) -> list[TurnWithVector]:
        return [TurnWithVector(t, v) for t, v in zip(self.docs, self.vectors, strict=True)]


_FIRST = (float("-inf"), "")
M = TypeVar("M", bool, int)


def _marks(
    mark: Callable[[StoredTurn], M],
    docs: Sequence[StoredTurn],
    held: npt.NDArray[np.intp] | None = None,
    known: npt.NDArray[Any] | None = None,
    kind: type = bool,
) -> npt.NDArray[Any]:
    """``mark`` of each turn (a ``kind``); where ``held[i] >= 0`` it is ``known[held[i]]``
    already."""

    def read(rows: npt.NDArray[np.intp]) -> npt.NDArray[Any]:
        return np.array([mark(docs[i]) for i in rows.tolist()], dtype=kind)

    if held is None or known is None:
        return read(np.arange(len(docs)))
    return _reuse_held(held, known, read)


def _reuse_held(
    held: npt.NDArray[np.intp],
    known: npt.NDArray[Any],
    read: Callable[[npt.NDArray[np.intp]], npt.NDArray[Any]],
) -> npt.NDArray[Any]:
    """Each row's value: ``known[held[i]]`` for a row the view held already, ``read(rows)``
    (one call) for the others: a rebuild reads only what it has not read before."""
    out: npt.NDArray[Any] = np.zeros(len(held), dtype=known.dtype)
    reuse = held >= 0
    out[reuse] = known[held[reuse]]
    fresh = np.flatnonzero(~reuse)
    if fresh.size:
        out[fresh] = read(fresh)
    return out


def _salient(
    docs: Sequence[StoredTurn],
    vectors: npt.NDArray[Any],
    exemplars: Exemplars | None,
    held: npt.NDArray[np.intp] | None = None,
    known: npt.NDArray[Any] | None = None,
) -> npt.NDArray[np.bool_]:
    """Which turns say something (``says_something``) and are not chatter by meaning
    (``memory.chatter``, where exemplars are given); a held row keeps its mark."""
    out = _marks(says_something, docs, held, known)
    if exemplars is None or not len(docs):
        return out
    fresh = out.copy() if held is None else out & (held < 0)
    rows = np.flatnonzero(fresh)
    if rows.size:
        said = chatter_mask([docs[r].text for r in rows.tolist()], vectors[rows], exemplars.chatter)
        out[rows[np.asarray(said, dtype=bool)]] = False
    return out


def _attributes(
    docs: Sequence[StoredTurn],
    vectors: npt.NDArray[Any],
    exemplars: Exemplars | None,
    held: npt.NDArray[np.intp] | None = None,
    known: UserTurns | None = None,
) -> npt.NDArray[np.int8]:
    """The standing attribute each turn states (``memory.profile``); a held row keeps its."""
    prototypes = exemplars.attributes if exemplars is not None else None

    def read(rows: npt.NDArray[np.intp]) -> npt.NDArray[np.int8]:
        return attributes_of([docs[i] for i in rows.tolist()], vectors[rows], prototypes)

    if held is None or known is None:
        return read(np.arange(len(docs)))
    return _reuse_held(held, known.attribute, read)


def _acts(
    vectors: npt.NDArray[Any],
    exemplars: Exemplars | None,
    held: npt.NDArray[np.intp] | None = None,
    known: UserTurns | None = None,
) -> npt.NDArray[np.int8]:
    """The act each row describes by meaning (``memory.acts``); a held row keeps its."""
    prototypes = exemplars.acts if exemplars is not None else None

    def read(rows: npt.NDArray[np.intp]) -> npt.NDArray[np.int8]:
        return acts_meant(vectors[rows], prototypes)

    if held is None or known is None:
        return read(np.arange(len(vectors)))
    return _reuse_held(held, known.act, read)


def _plain(salient: npt.NDArray[np.bool_], attribute: npt.NDArray[np.int8]) -> list[bool]:
    """Rows that may name a thing by answering a question: content, not a standing attribute."""
    plain: list[bool] = (salient & (attribute == NO_ATTRIBUTE)).tolist()
    return plain


def _order(row: TurnWithVector) -> tuple[float, str]:
    """Rows run by time, then event id (as a Redis timeline does): one order from any source."""
    return (row.turn.ts.timestamp(), row.turn.event_id)


def turn_tokens(turn: StoredTurn) -> tuple[str, ...]:
    """What BM25 indexes of a turn: ``speaker (date): text`` (``memory.lexical``)."""
    return document_tokens(lexical_text(turn.speaker or turn.role, turn.ts, turn.text))


def index_turn(lexical: LexicalIndex, turn: StoredTurn) -> None:
    """Add ``turn`` to an index being built (one no view holds yet)."""
    lexical.add(turn.event_id, turn_tokens(turn))


class TurnIndex:
    """Per-user ``UserTurns`` (hot and archived), LRU within ``max_bytes`` and ``max_users``."""

    def __init__(
        self,
        state: TurnReader,
        *,
        dim: int,
        archive: TurnArchive | None = None,
        max_users: int = 256,
        max_bytes: int = 1 << 30,
        exemplars: Exemplars | None = None,
    ) -> None:
        self.state = state
        self.exemplars = exemplars  # chatter and standing attributes, told by meaning
        self.archive = archive
        self.dim = dim
        self.max_users = max_users
        self.max_bytes = max_bytes
        self._users: OrderedDict[tuple[str, str], UserTurns] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.nbytes = 0
        self.syncs = 0  # how many queries had to read turns (tests, benchmarks)
        self.archive_reads = 0  # how many times a user's archive was read

    async def get(self, tenant_id: str, user_id: str) -> UserTurns:
        key = (tenant_id, user_id)
        version, expected = await self.state.turns_state(tenant_id, user_id)
        cached = self._users.get(key)
        if cached is not None and cached.version == version and cached.complete:
            self._users.move_to_end(key)
            return cached
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one sync per user at a time; the others reuse its result
            cached = self._users.get(key)
            if cached is not None and cached.version == version and cached.complete:
                return cached
            fresh = await self._sync(tenant_id, user_id, version, expected, cached)
            self._store(key, fresh)
            return fresh

    def evict(self, tenant_id: str, user_id: str) -> None:
        gone = self._users.pop((tenant_id, user_id), None)
        if gone is not None:
            self.nbytes -= gone.nbytes

    def _store(self, key: tuple[str, str], fresh: UserTurns) -> None:
        old = self._users.pop(key, None)
        self.nbytes += fresh.nbytes - (old.nbytes if old is not None else 0)
        self._users[key] = fresh
        # The user just asked for stays even when it alone is over the budget.
        while len(self._users) > 1 and (
            self.nbytes > self.max_bytes or len(self._users) > self.max_users
        ):
            gone_key, gone = self._users.popitem(last=False)
            self.nbytes -= gone.nbytes
            self._locks.pop(gone_key, None)

    async def _sync(
        self,
        tenant_id: str,
        user_id: str,
        version: bytes | None,
        expected: int,
        cached: UserTurns | None,
    ) -> UserTurns:
        self.syncs += 1
        if version is None:  # nothing written, or forgotten
            return UserTurns.build(None, [], LexicalIndex(), self.dim)
        old = cached if cached is not None and cached.version is not None else None
        have = old.positions if old is not None else {}
        new: dict[str, TurnWithVector] = {}
        seen = old.archive_seen if old is not None else -1
        if seen < 0:
            seen = await self._read_archive(tenant_id, user_id, have, new)
        last = old.last_key() if old is not None else None
        # New turns are nearly always the newest: read the timeline from the last held one
        # on, and all of it only when that does not account for every turn written.
        if last is not None:
            await self._read_hot(tenant_id, user_id, have, new, since=last[0])
        if last is None or len(have) + len(new) < expected:
            await self._read_hot(tenant_id, user_id, have, new, since=None)
        if len(have) + len(new) < expected:
            [leaving] = await self.state.leaving([(tenant_id, user_id)])
            await self._read_turns(tenant_id, user_id, have, new, leaving)
        if len(have) + len(new) < expected and self.archive is not None:
            # A turn left the hot tier before this process saw it: the archive has it once
            # the archive worker has caught up (its count grew since the last read).
            count = await self.archive.count_turns(tenant_id, user_id)
            if count > seen:
                seen = await self._read_archive(tenant_id, user_id, have, new)
        # A new index (copy on write): the old view may be in a retrieval's hands.
        lexical = (old.lexical if old is not None else LexicalIndex()).with_docs(
            (row.turn.event_id, turn_tokens(row.turn)) for row in new.values()
        )
        rows = sorted(new.values(), key=_order)
        if old is not None and (not rows or _order(rows[0]) > (old.last_key() or _FIRST)):
            return old.extended(
                version,
                rows,
                lexical,
                expected=expected,
                archive_seen=seen,
                exemplars=self.exemplars,
            )
        # A turn older than some held (a late event, the first load): one sorted rebuild,
        # on a CPU thread (a first load reads every text: ~1 s for 10k turns). Nothing it
        # reads changes meanwhile: views are never mutated, and ``lexical`` is only stored.
        merged = sorted([*(old.rows() if old is not None else []), *rows], key=_order)

        def build() -> UserTurns:
            with read_once():
                return UserTurns.build(
                    version,
                    merged,
                    lexical,
                    self.dim,
                    expected=expected,
                    archive_seen=seen,
                    known=old,
                    exemplars=self.exemplars,
                )

        return await off_loop(build)

    async def _read_hot(
        self,
        tenant_id: str,
        user_id: str,
        have: dict[str, int],
        known: dict[str, TurnWithVector],
        *,
        since: float | None,
    ) -> None:
        """Add to ``known`` the hot turns (stamped at or after ``since``) not held yet."""
        ids = (
            await self.state.timeline_ids(tenant_id, user_id)
            if since is None
            else await self.state.timeline_since(tenant_id, user_id, since)
        )
        await self._read_turns(tenant_id, user_id, have, known, ids)

    async def _read_turns(
        self,
        tenant_id: str,
        user_id: str,
        have: dict[str, int],
        known: dict[str, TurnWithVector],
        ids: Sequence[str],
    ) -> None:
        """Add to ``known`` the Redis turns among ``ids`` not held yet."""
        added = [i for i in ids if i not in have and i not in known]
        for row in await self.state.turns(tenant_id, user_id, added):
            # As the archive has it: the cluster a turn was put in is the clusters' to say.
            turn = row.turn.model_copy(update={"cluster_id": None})
            known[turn.event_id] = TurnWithVector(turn, row.vector)

    async def _read_archive(
        self,
        tenant_id: str,
        user_id: str,
        have: dict[str, int],
        known: dict[str, TurnWithVector],
    ) -> int:
        """Add to ``known`` the user's archived turns in neither ``have`` nor ``known``;
        returns how many are archived."""
        if self.archive is None:
            return 0
        self.archive_reads += 1
        total = 0
        offset: str | None = None
        while True:
            page, offset = await self.archive.list_turns(tenant_id, user_id, ARCHIVE_PAGE, offset)
            total += len(page)
            for archived in page:  # the same turn and vector as the hot tier's copy
                if archived.turn.event_id not in have:
                    known.setdefault(
                        archived.turn.event_id, TurnWithVector(archived.turn, archived.vector)
                    )
            if offset is None:
                return total
