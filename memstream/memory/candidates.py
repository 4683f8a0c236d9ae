"""Retrieval's candidate scoring: the gathered reads of one query in, scored candidates out.

``rpc.retrieval.Retriever`` gathers (the query's vectors, the user's turn index, the
memories the long-term store found by vector and by key, the user's clusters), then calls
``score_candidates``: no I/O, no clock. ``now`` is the request's, else the user's newest
event; the same inputs always give the same candidates, which ``memory.ranking.rank`` then
orders and ``assemble_context`` budgets.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol, TypeVar, overload

import numpy as np
import numpy.typing as npt

from memstream.memory.clustering import Cluster
from memstream.memory.due import parse_due
from memstream.memory.formulaic import formulaic
from memstream.memory.hierarchy import expand_in_clusters, hierarchical_search
from memstream.memory.lexical import LexicalIndex, term_counts, tokens_of
from memstream.memory.names import (
    Names,
    Untied,
    key_names,
    keys_named,
    named_rows,
    untied_statements,
)
from memstream.memory.profile import NO_ATTRIBUTE, lift_attributes
from memstream.memory.promises import closed_line, fulfilment, open_line
from memstream.memory.ranking import (
    Candidate,
    RankingParams,
    asks_for_latest,
    fused_relevance,
    lift_neighbours,
    lift_replies,
    named_speakers,
    recency_factor,
    recency_factors,
    split_turn_text,
    strip_names,
)
from memstream.memory.reconcile import MAX_LATEST, newer_conversation, newer_like_sources
from memstream.memory.render import memory_text
from memstream.memory.text import ends_in_question
from memstream.memory.vectors import cosine_to_rows
from memstream.memory.when import asked_period
from memstream.schemas import ConsolidatedMemory, StoredTurn

T = TypeVar("T")

KEY_MATCH_RELEVANCE = 1.0  # an exact order number / email in the query is as good as it gets
# flat: every turn scored; hierarchical: CLAG's shelf then book (the top clusters' top
# members, plus BM25's best and key matches); expand: flat, then the cluster-mates of the
# best hits lifted (``memory.hierarchy.expand_in_clusters``).
ShortTermMode = Literal["flat", "hierarchical", "expand"]
PROMISE_HORIZON = 512  # later turns read for the one that keeps a promise
FORMULAIC_HORIZON = 512  # newest turns a candidate is compared with for repetition
# An untied statement must say something of what the asked ones said. Under all-MiniLM-L6-v2
# two statements about one order's fate by other names ("order 123 was shipped", "my lamp
# arrived broken") mostly run 0.15-0.45; another errand of the account ("gift card balance")
# near 0.1. Far looser than LIKE_COSINE, which ties the same thing said again.
UNTIED_LIKE_COSINE = 0.15


class TurnRows(Protocol):
    """A user's turns, row for row (``stores.turn_index.UserTurns`` is the one in use)."""

    @property
    def ids(self) -> list[str]: ...
    @property
    def docs(self) -> list[StoredTurn]: ...
    @property
    def ts(self) -> npt.NDArray[np.float64]: ...  # epoch seconds
    @property
    def vectors(self) -> npt.NDArray[np.float32]: ...  # (n, dim), unit rows
    @property
    def lexical(self) -> LexicalIndex: ...  # BM25 postings of the rows' texts
    @property
    def positions(self) -> dict[str, int]: ...  # event id -> row
    @property
    def texts(self) -> list[str]: ...  # ``memory.ranking.turn_text`` of each row
    @property
    def speaker_of(self) -> npt.NDArray[np.object_]: ...
    @property
    def speaker_names(self) -> tuple[str, ...]: ...
    @property
    def by_entity(self) -> dict[str, list[int]]: ...  # normalised key -> rows
    @property
    def salient(self) -> npt.NDArray[np.bool_]: ...  # rows that may take budget
    @property
    def promise(self) -> npt.NDArray[np.bool_]: ...  # rows promising the customer something
    @property
    def done(self) -> npt.NDArray[np.bool_]: ...  # rows saying something happened
    @property
    def line_keys(self) -> npt.NDArray[np.int64]: ...  # each row's words as one number
    @property
    def attribute(self) -> npt.NDArray[np.int8]: ...  # the standing attribute a row states
    @property
    def act(self) -> npt.NDArray[np.int8]: ...  # the act a row describes by meaning (memory.acts)
    @property
    def names(self) -> Names: ...  # key -> the names people give it (``memory.names``)


def score_candidates(
    query: str,
    vector: np.ndarray,
    keys: Sequence[str],
    turns: TurnRows,
    scored: Sequence[tuple[ConsolidatedMemory, float]],
    keyed: Sequence[ConsolidatedMemory],
    clusters: Sequence[Cluster] | None,
    *,
    top_k: int,
    now: datetime | None,
    turn_vector: np.ndarray | None = None,
    params: RankingParams | None = None,
    short_term_candidates: int = 0,
    mode: ShortTermMode = "flat",
    render: Callable[[ConsolidatedMemory], str] = memory_text,
    asked: int = NO_ATTRIBUTE,
) -> list[Candidate]:
    """Memories and the turns that can make the cut, with fused relevance.

    ``scored``: memories found by vector, with their cosine; ``keyed``: found by an exact
    key of the query (``keys``); ``turn_vector``: the query embedded without the speakers
    it names (default ``vector``); ``short_term_candidates``: only the newest this many
    turns (0: all); ``render``: a memory's text (memoised by the caller).

    Dense (cosine, plus a bonus where the query names the turn's speaker) and lexical
    (BM25 over ``speaker (date): text``) scores of every turn and found memory are fused
    into one relevance (``memory.ranking.fused_relevance``); an exact key match (order
    number, email, product id) in the query is relevance 1.0 whatever the embeddings say.
    """
    p = params or RankingParams()
    memory_list, dense_of = _found_memories(scored, keyed)
    rows = _salient_rows(turns, short_term_candidates)
    named = named_speakers(query, turns.speaker_names)
    # A named speaker is matched by the dense side's speaker bonus; left in BM25's query,
    # the name alone made the person's shortest turns ("Wow! What got you into running?")
    # top hits for any question about them (LoCoMo-dev: evidence shown @1024 0.840 ->
    # 0.854 without it, no category lower).
    query_tokens = tokens_of(strip_names(query, named) if named else query)
    # A key is also asked for, and spoken of, by its names ("the oak bookcase").
    keys = [*keys, *keys_named(query_tokens, turns.names)]
    keyed_rows = {r for k in keys for r in turns.by_entity.get(k, ())}
    keyed_rows |= named_rows(key_names(keys, turns.names), turns.lexical, turns.positions)
    if clusters is not None and mode == "hierarchical":
        rows = _shelf_and_book(vector, clusters, turns, rows, query_tokens, keyed_rows, top_k)
    turn_query = vector if turn_vector is None else turn_vector
    turn_dense = _turn_dense(turn_query, turns, rows, named, p.speaker_bonus)
    turn_lexical = turns.lexical.scores(query_tokens, turns.positions, len(turns.ids))[rows]
    memory_ts = [_event_time(m, turns) for m in memory_list]
    # What a memory says is as new as its newest shown line: a source it was fed but does
    # not show (a turn the consolidator read and did not take up) makes it no more current.
    shown = [_shown_events(m) for m in memory_list]
    said_ts = [_event_time(m, turns, s or None) for m, s in zip(memory_list, shown, strict=True)]
    memory_texts = [_closing_kept(m, render(m), turns) for m in memory_list]
    # The newer statements about a keyed memory's subject (an order, an email;
    # ``memory.reconcile``) compete as turns as relevant as the memory: listed newest first,
    # they are read before anything older, the memory included. Not a topic's: on LoCoMo-dev
    # its like-meaning newer turns took places from better ones (R@10 0.777 -> 0.758).
    newer = [_newer_statements(m, ts, turns) for m, ts in zip(memory_list, said_ts, strict=True)]
    # A memory found only by key has no cosine here: the lowest found stands in (its
    # relevance is the key match's anyway).
    floor = min(dense_of.values(), default=0.0)
    memory_dense = [dense_of.get(m.memory_id, floor) for m in memory_list]
    lexical = turns.lexical
    memory_lexical = [lexical.score_text(query_tokens, term_counts(t)) for t in memory_texts]
    relevance = fused_relevance(
        np.concatenate([memory_dense, turn_dense]),
        np.concatenate([memory_lexical, turn_lexical]),
        p.dense_weight,
    )
    latest = asks_for_latest(query)
    now = now or _newest_event(turns, memory_ts)
    # A query that names a day, a month or a year asks about what happened then.
    period = asked_period(query)

    def boost(ts: datetime) -> float:
        factor = 1.0
        if latest and now is not None:
            factor = recency_factor(ts, now, p.recency_half_life_days)
        if period is not None and not period.contains(ts):
            factor *= p.outside_period_share
        return factor

    turn_relevance = _lift_related(
        relevance[len(memory_list) :].copy(), turns, rows, clusters, mode, p
    )
    keyed_ids = {m.memory_id for m in keyed}
    if keyed_rows or any(newer):
        _lift_keyed(
            turn_relevance, turns, rows, keyed_rows, keyed_ids, memory_list, relevance, newer
        )
    # An order called by one name here and by another there, never both in one turn: the
    # newer statements by the other name may be its newest state.
    _lift_untied(turn_relevance, turns, rows, untied_statements(keys, query_tokens, turns))
    # A question about a standing attribute reads its newest statements first.
    turn_relevance = lift_attributes(
        turn_relevance, turns.attribute[rows], turns.ts[rows], asked=asked
    )
    # A memory lists its sources best first for this query: each takes its own place
    # when its sources are read as a ranking of turns.
    relevance_of = _RowValues(turns, rows, turn_relevance)
    rank_of = _RowValues(turns, rows, -turn_relevance)
    out = [
        Candidate(
            kind="memory",
            id=m.memory_id,
            text=text,
            relevance=KEY_MATCH_RELEVANCE
            if m.memory_id in keyed_ids
            else _slot_merit(float(rel), m.source_event_ids, relevance_of, top_k),
            strength=m.strength,
            ts=said,
            source_event_ids=_best_first(m.source_event_ids, rank_of),
            boost=boost(ts),
            strength_span=p.strength_span,
            shows=shows,
        )
        for m, text, rel, ts, said, shows in zip(
            memory_list, memory_texts, relevance, memory_ts, said_ts, shown, strict=False
        )
    ]
    turn_boost = (
        recency_factors(turns.ts[rows], now.timestamp(), p.recency_half_life_days)
        if latest and now is not None
        else np.ones(len(rows))
    )
    if period is not None:
        inside = period.contains_epochs(turns.ts[rows])
        turn_boost = np.where(inside, turn_boost, turn_boost * p.outside_period_share)
    order = _turns_kept(turns, rows, turn_relevance * turn_boost, memory_list, keyed_rows, top_k)
    out.extend(_turn_candidates(turns, rows, order, turn_relevance, boost, p.strength_span))
    return out


def _found_memories(
    scored: Sequence[tuple[ConsolidatedMemory, float]], keyed: Sequence[ConsolidatedMemory]
) -> tuple[list[ConsolidatedMemory], dict[str, float]]:
    """The memories found, each once (those found by key first), and the cosine of each one
    found by vector."""
    memories: dict[str, ConsolidatedMemory] = {m.memory_id: m for m in keyed}
    dense_of: dict[str, float] = {}
    for memory, score in scored:
        memories.setdefault(memory.memory_id, memory)
        dense_of[memory.memory_id] = score
    return list(memories.values()), dense_of


def _salient_rows(turns: TurnRows, newest: int) -> npt.NDArray[np.intp]:
    """Every turn, hot or archived, that says something: small talk never takes budget;
    only the ``newest`` this many of them when given (0: all)."""
    rows = np.flatnonzero(turns.salient).astype(np.intp)
    if newest and len(rows) > newest:
        rows = rows[np.argsort(-turns.ts[rows], kind="stable")[:newest]]
    return rows


def _shelf_and_book(
    vector: np.ndarray,
    clusters: Sequence[Cluster],
    turns: TurnRows,
    rows: np.ndarray,
    query_tokens: Sequence[str],
    keyed_rows: set[int],
    top_k: int,
) -> npt.NDArray[np.intp]:
    """The hierarchical mode's rows, in turn order: CLAG's shelf, then the book; BM25's
    ``top_k`` best and the key matches too."""
    lexical_all = turns.lexical.scores(query_tokens, turns.positions, len(turns.ids))
    shelf = hierarchical_search(vector, clusters, [turns.ids[r] for r in rows], turns.vectors[rows])
    picked = {int(rows[i]) for i in np.argsort(-lexical_all[rows])[:top_k]}
    picked |= {turns.positions[h.event_id] for h in shelf} | keyed_rows
    return np.array(sorted(picked), dtype=np.intp)


def _turn_dense(
    turn_query: np.ndarray,
    turns: TurnRows,
    rows: np.ndarray,
    named: frozenset[str],
    speaker_bonus: float,
) -> npt.NDArray[np.float64]:
    """The dense score of each candidate turn: its cosine with the query, plus
    ``speaker_bonus`` where the query names its speaker."""
    # Rows are distinct, and the only reordering (the newest-first cap) leaves fewer than
    # every turn: as many rows as turns is all of them in order, no gather needed (it cost
    # ~0.1 ms a query for the same 500-row matrix).
    row_vectors = turns.vectors if len(rows) == len(turns.ids) else turns.vectors[rows]
    turn_dense = cosine_to_rows(turn_query, row_vectors).astype(np.float64)
    if named:
        turn_dense += speaker_bonus * np.isin(turns.speaker_of[rows], list(named))
    return turn_dense


def _lift_related(
    turn_relevance: npt.NDArray[np.float64],
    turns: TurnRows,
    rows: np.ndarray,
    clusters: Sequence[Cluster] | None,
    mode: ShortTermMode,
    p: RankingParams,
) -> npt.NDArray[np.float64]:
    """The turns' relevance with the cluster-mates (expand mode), the session neighbours
    of the best hits and the replies to the best questions lifted."""
    if clusters is not None and mode == "expand":
        cluster_of = _clusters_of(clusters, turns)
        turn_relevance = expand_in_clusters(
            turn_relevance,
            [cluster_of.get(int(r)) for r in rows],
            seeds=p.expand_seeds,
            per_seed=p.expand_per_seed,
            share=p.expand_share,
        )
    if p.neighbour_seeds > 0:
        turn_relevance = lift_neighbours(
            turn_relevance,
            _SessionNeighbours(turns, rows, p.neighbour_window),
            seeds=p.neighbour_seeds,
            share=p.neighbour_share,
            seed_min=p.neighbour_seed_min,
            own_quantile=p.neighbour_own_quantile,
        )
    if p.reply_seeds > 0:
        turn_relevance = lift_replies(
            turn_relevance,
            _Replies(turns, rows),
            seeds=p.reply_seeds,
            seed_min=p.reply_seed_min,
            question_share=p.question_share,
        )
    return turn_relevance


def _lift_keyed(
    turn_relevance: npt.NDArray[np.float64],
    turns: TurnRows,
    rows: np.ndarray,
    keyed_rows: set[int],
    keyed_ids: set[str],
    memory_list: list[ConsolidatedMemory],
    relevance: npt.NDArray[np.float64],
    newer: list[list[int]],
) -> None:
    """In place: a turn matching a key of the query is as relevant as can be, and a memory's
    newer statements (``newer``) at least as relevant as the memory (a keyed one: as can be)."""
    at = _index_of_rows(rows, len(turns.ids))
    hits = at[np.fromiter(keyed_rows, dtype=np.intp)]
    turn_relevance[hits[hits >= 0]] = KEY_MATCH_RELEVANCE
    for m, rel, latest_rows in zip(memory_list, relevance, newer, strict=False):
        lifted = at[np.asarray(latest_rows, dtype=np.intp)]
        lifted = lifted[lifted >= 0]
        lift = KEY_MATCH_RELEVANCE if m.memory_id in keyed_ids else float(rel)
        turn_relevance[lifted] = np.maximum(turn_relevance[lifted], lift)


def _lift_untied(
    turn_relevance: npt.NDArray[np.float64], turns: TurnRows, rows: np.ndarray, untied: Untied
) -> None:
    """In place: each statement that may be about the asked order (``untied.newer``) and
    says something like what was said about it (``untied.asked``) ranked right after the
    best of those certain statements, halfway between it and the next best of the others:
    near it in any budget, never above what is certain, visibly below it in the scores a
    client reads. Newer alone is no tie: a gift card after a parcel is another thing."""
    if not untied.newer:
        return
    said = np.asarray(untied.asked, dtype=np.intp)
    newer_rows = np.asarray(untied.newer, dtype=np.intp)
    like = (turns.vectors[newer_rows] @ turns.vectors[said].T).max(axis=1) >= UNTIED_LIKE_COSINE
    at = _index_of_rows(rows, len(turns.ids))
    asked = at[said]
    asked = asked[asked >= 0]
    newer = at[newer_rows[like]]
    newer = newer[newer >= 0]
    if not asked.size or not newer.size:
        return
    best = float(turn_relevance[asked].max())
    others = np.ones(len(turn_relevance), dtype=bool)
    others[asked] = others[newer] = False
    below = turn_relevance[others & (turn_relevance < best)]
    lift = (best + float(below.max(initial=0.0))) / 2
    turn_relevance[newer] = np.maximum(turn_relevance[newer], lift)


def _turns_kept(
    turns: TurnRows,
    rows: np.ndarray,
    merit: np.ndarray,
    memory_list: list[ConsolidatedMemory],
    keyed_rows: set[int],
    top_k: int,
) -> npt.NDArray[np.intp]:
    """Indices into ``rows`` of the turns worth a candidate, best ``merit`` first (newest
    first among equals), formulaic ones left out."""
    # rank() keeps top_k turns and drops only turns a found memory covers: the turns, best
    # first, up to the top_k-th one no memory covers give it the answer all of them would.
    order = np.lexsort((-turns.ts[rows], -merit))
    sources = [e for m in memory_list for e in m.source_event_ids if e in turns.positions]
    coverable = np.zeros(len(turns.ids), dtype=bool)
    coverable[[turns.positions[e] for e in sources]] = True
    uncovered = np.cumsum(~coverable[rows[order]])
    order = order[: int(np.searchsorted(uncovered, top_k)) + 1]
    kept: npt.NDArray[np.intp] = order[~_formulaic(rows[order], turns, keyed_rows)]
    return kept


def _turn_candidates(
    turns: TurnRows,
    rows: np.ndarray,
    order: npt.NDArray[np.intp],
    turn_relevance: npt.NDArray[np.float64],
    boost: Callable[[datetime], float],
    strength_span: float,
) -> list[Candidate]:
    """The turn candidates, in ``order``; a promise's text says whether it was kept."""
    out: list[Candidate] = []
    for i in order:
        turn = turns.docs[int(rows[i])]
        text = turns.texts[int(rows[i])]
        heading, body = split_turn_text(text)
        if turns.promise[int(rows[i])]:
            body = _promise_body(int(rows[i]), turns)
            text = f"{heading} {body}"
        out.append(
            Candidate(
                kind="turn",
                id=turn.event_id,
                text=text,
                relevance=float(turn_relevance[i]),
                strength=1.0,
                ts=turn.ts,
                source_event_ids=(turn.event_id,),
                boost=boost(turn.ts),
                strength_span=strength_span,
                heading=heading,
                body=body,
                whole=bool(turns.promise[int(rows[i])]),
            )
        )
    return out


def _index_of_rows(rows: np.ndarray, size: int) -> npt.NDArray[np.intp]:
    """Row of the turn index -> its index into ``rows``, -1 where it is not a candidate."""
    at = np.full(size, -1, dtype=np.intp)
    at[rows] = np.arange(len(rows), dtype=np.intp)
    return at


class _PerCandidate(Sequence[T]):
    """A value for each of ``rows`` (the candidate turns, in time order), computed on
    demand (``of``): the ranking asks about a handful of seeds, and a user may have 10k
    turns. ``at`` maps a turn's row to its index among ``rows`` (-1: not a candidate)."""

    def __init__(self, turns: TurnRows, rows: np.ndarray) -> None:
        self.turns, self.rows = turns, rows
        self.at = _index_of_rows(rows, len(turns.ids))

    @abstractmethod
    def of(self, i: int) -> T: ...

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self.of(j) for j in range(len(self))[i]]
        return self.of(i)


class _SessionNeighbours(_PerCandidate[list[int]]):
    """The indices into ``rows`` of the turns up to ``window`` before and after each one in
    the same session."""

    def __init__(self, turns: TurnRows, rows: np.ndarray, window: int) -> None:
        super().__init__(turns, rows)
        self.window = window

    def of(self, i: int) -> list[int]:
        r, docs, size = int(self.rows[i]), self.turns.docs, len(self.turns.ids)
        session = docs[r].session_id
        around = [r + d for d in range(-self.window, self.window + 1) if d and 0 <= r + d < size]
        return [
            int(self.at[n]) for n in around if self.at[n] >= 0 and docs[n].session_id == session
        ]


class _Replies(_PerCandidate[int]):
    """The index into ``rows`` of the turn that answers each one when it ends in a question:
    the next turn of its session, said by another speaker (or role); else -1."""

    def of(self, i: int) -> int:
        r, docs = int(self.rows[i]), self.turns.docs
        if r + 1 >= len(docs) or not ends_in_question(docs[r].text):
            return -1
        speaker = self.turns.speaker_of
        if docs[r + 1].session_id != docs[r].session_id or speaker[r + 1] == speaker[r]:
            return -1
        return int(self.at[r + 1])


class _RowValues(Mapping[str, float]):
    """Event id -> a per-candidate value, for the candidate turns only; no dict of every
    turn is built per query."""

    def __init__(self, turns: TurnRows, rows: np.ndarray, values: np.ndarray) -> None:
        self.turns, self.per_row = turns, values
        self.at = _index_of_rows(rows, len(turns.ids))

    def __getitem__(self, event_id: str) -> float:
        position = self.turns.positions.get(event_id)
        index = -1 if position is None else int(self.at[position])
        if index < 0:
            raise KeyError(event_id)
        return float(self.per_row[index])

    def __iter__(self) -> Iterator[str]:
        return (self.turns.ids[int(r)] for r in np.flatnonzero(self.at >= 0))

    def __len__(self) -> int:
        return int(np.count_nonzero(self.at >= 0))


def _event_time(
    m: ConsolidatedMemory, turns: TurnRows, events: Sequence[str] | None = None
) -> datetime:
    """A memory's event time: its newest source turn's (of ``events`` where given), else what
    it stores (the consolidator's times are its sources' too; this holds while older data
    says otherwise)."""
    ids = m.source_event_ids if events is None else events
    rows = [turns.positions[e] for e in ids if e in turns.positions]
    if not rows:
        return m.updated_at
    return turns.docs[max(rows, key=lambda r: turns.ts[r])].ts


def _slot_merit(
    relevance: float, ids: list[str], relevance_of: Mapping[str, float], k: int
) -> float:
    """A memory's relevance for the ranking: at most that of the weakest turn it brings in
    (its sources best first, as many as it would fill of ``k`` places). Read as a ranking
    of turns, each source takes its own place; this way none of them lands ahead of a
    turn more relevant than itself, so the memory never pushes a better turn out."""
    best = sorted((relevance_of.get(i, 0.0) for i in ids), reverse=True)[:k]
    return min(relevance, best[-1]) if best else relevance


def _best_first(ids: list[str], rank_of: Mapping[str, float]) -> tuple[str, ...]:
    """``ids`` by ``rank_of`` (lower first); unknown ids after, in their own order."""
    order = sorted(range(len(ids)), key=lambda i: (rank_of.get(ids[i], np.inf), i))
    return tuple(ids[i] for i in order)


def _newer_statements(m: ConsolidatedMemory, since: datetime, turns: TurnRows) -> list[int]:
    """Rows newer than a keyed memory that are read before it, newest first: the newest
    conversation about its keys, and turns like its sources (``memory.reconcile``); none
    for a memory without entity keys (a topic)."""
    keys = _entity_keys(m)
    if not keys:
        return []
    keyed = newer_conversation(keys, since, turns)
    sources = [turns.positions[e] for e in m.source_event_ids if e in turns.positions]
    like = newer_like_sources(sources, since, turns, turns.vectors)
    return sorted({*keyed, *like}, key=lambda r: (-turns.ts[r], -r))[:MAX_LATEST]


def _formulaic(
    candidates: npt.NDArray[np.intp], turns: TurnRows, keyed: set[int]
) -> npt.NDArray[np.bool_]:
    """Which candidate rows are formulaic (``memory.formulaic``), compared with the user's
    newest ``FORMULAIC_HORIZON`` turns; never a turn naming an entity, pinned or promising."""
    against = np.arange(max(len(turns.docs) - FORMULAIC_HORIZON, 0), len(turns.docs))
    exempt = np.array(
        [
            r in keyed or bool(turns.docs[r].entities) or turns.docs[r].pinned or turns.promise[r]
            for r in candidates.tolist()
        ],
        dtype=bool,
    )
    out = np.zeros(len(candidates), dtype=bool)
    out[~exempt] = formulaic(
        candidates[~exempt], against, turns.line_keys, _Field(turns.docs, "session_id")
    )
    return out


def _promise_body(row: int, turns: TurnRows) -> str:
    """A promise's line: ``- Open: …`` until a later turn says it happened, then
    ``- Closed (day): …``."""
    turn = turns.docs[row]
    kept = _kept_by(row, turns)
    if kept is None:
        return open_line(turn.text, turn.role, parse_due(turn.text, turn.ts))
    return closed_line(turn.text, turn.role, turns.docs[kept].ts)


def _kept_by(row: int, turns: TurnRows) -> int | None:
    """The row of the later turn (of the next ``PROMISE_HORIZON``) that keeps the promise at
    ``row`` best (``memory.promises.fulfilment``), or None."""
    end = min(row + 1 + PROMISE_HORIZON, len(turns.docs))
    later = (np.flatnonzero(turns.done[row + 1 : end]) + row + 1).tolist()  # only "done" keeps
    return fulfilment(
        row,
        later,
        turns.vectors,
        turns.done,
        _Field(turns.docs, "text"),
        promised=turns.promise,
        meant=turns.act,
    )


def _closing_kept(m: ConsolidatedMemory, text: str, turns: TurnRows) -> str:
    """A rendered memory with each open action a later turn kept shown as closed: the
    memory was consolidated before the turn that kept it."""
    kept: dict[str, datetime] = {}
    for action in m.open_actions:
        row = turns.positions.get(action.event_id or "")
        by = _kept_by(row, turns) if row is not None else None
        if by is not None:
            kept[f"- Open: {' '.join(action.text.split())}"] = turns.docs[by].ts
    if not kept:
        return text
    return "\n".join(
        next(
            (
                f"- Closed ({ts:%Y-%m-%d}):{line[len('- Open:') :]}"
                for o, ts in kept.items()
                if line.startswith(o)
            ),
            line,
        )
        for line in text.split("\n")
    )


class _Field(Sequence[str]):
    """Row -> one text field of the turn (``text``: its own words, not its rendered line;
    ``session_id``), without a list of every turn built per query."""

    def __init__(self, docs: Sequence[StoredTurn], name: Literal["text", "session_id"]) -> None:
        self.docs, self.name = docs, name

    def __len__(self) -> int:
        return len(self.docs)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [str(getattr(t, self.name)) for t in self.docs[i]]
        return str(getattr(self.docs[i], self.name))


def _entity_keys(m: ConsolidatedMemory) -> list[str]:
    """The entity keys a memory is about (``order:C-73120``), as turns index them."""
    own = m.key.removeprefix("entity:") if m.key.startswith("entity:") else None
    return list(dict.fromkeys([*([own] if own else []), *(k for k in m.keys if ":" in k)]))


def _shown_events(m: ConsolidatedMemory) -> tuple[str, ...]:
    """The events whose words the memory's text shows: its facts', timeline's and open
    actions' sources (a memory shows none of its other sources)."""
    found = [e for f in m.facts for e in f.source_event_ids]
    found += [x.event_id for x in m.timeline if x.event_id]
    found += [a.event_id for a in m.open_actions if a.event_id]
    return tuple(dict.fromkeys(found))


def _newest_event(turns: TurnRows, memory_ts: list[datetime]) -> datetime | None:
    """The "now" of recency: the user's newest event, never the wall clock."""
    if len(turns.ts):
        return turns.docs[int(np.argmax(turns.ts))].ts
    return max(memory_ts, default=None)


def _clusters_of(clusters: Sequence[Cluster], turns: TurnRows) -> dict[int, str]:
    """Row of the turn index -> the cluster holding that turn."""
    return {
        turns.positions[e]: c.cluster_id
        for c in clusters
        for e in c.member_ids
        if e in turns.positions
    }
