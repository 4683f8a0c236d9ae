"""One retrieval: encode the query, gather short- and long-term candidates, rank, budget.

The science (scoring, de-duplication, context layering) lives in ``memory.ranking``; this
module only fetches candidates from the stores of one tenant's user and times each phase
(``memstream_retrieval_latency_seconds``: encode, fetch, rank, total).

Two things keep it cheap under load:

- ``QueryEncoder`` lets concurrent queries share one encoder call (a micro-batch), so the
  RPC's throughput is the encoder's batched rate, not its one-text-at-a-time rate.
- Short-term turns are not read per query: ``rpc.turn_index.TurnIndex`` keeps each user's
  vectors, texts and BM25 postings in process and re-syncs only what changed, on a version
  token ``memorize`` bumps. A query then costs one tiny Redis read plus numpy.
- ``TokenCounter`` counts the context's tokens line by line, memoised, where that gives
  the tokenizer's exact count: the budget loop re-counts the whole context per item.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, overload

import numpy as np
import numpy.typing as npt

from memory.clustering import Cluster
from memory.hierarchy import expand_in_clusters, hierarchical_search
from memory.lexical import term_counts, tokens_of
from memory.ranking import (
    Candidate,
    RankingParams,
    asks_for_latest,
    assemble_context,
    fused_relevance,
    lift_neighbours,
    named_speakers,
    rank,
    recency_factor,
    recency_factors,
    strip_names,
)
from memory.render import memory_text
from memory.text import extract_entities, lookup_keys
from memory.vectors import cosine_to_rows
from memstream.metrics import Metrics
from rpc.turn_index import TurnIndex, UserTurns
from schemas import (
    ConsolidatedMemory,
    RetrievedItem,
    RetrieveRequest,
    RetrieveResponse,
)
from stores.encoder import OnnxEncoder
from stores.longterm import LongTermStore, ScoredMemory
from stores.redis_state import RedisState

KEY_MATCH_RELEVANCE = 1.0  # an exact order number / email in the query is as good as it gets
# flat: every turn scored; hierarchical: CLAG's shelf then book (the top clusters' top
# members, plus BM25's best and key matches); expand: flat, then the cluster-mates of the
# best hits lifted (``memory.hierarchy.expand_in_clusters``).
ShortTermMode = Literal["flat", "hierarchical", "expand"]


class QueryEncoder:
    """Query embeddings with a small LRU cache (bots repeat themselves) and micro-batching.

    A text that misses the cache joins the pending batch, which is encoded in one call off
    the event loop once it holds ``max_batch`` texts or ``max_wait_s`` after the batch
    started, whichever comes first. One batch is encoded at a time (the encoder already
    uses every core); texts that arrive meanwhile form the next one, so under load batches
    form without any wait. Hence ``max_wait_s`` defaults to 0: measured here at 40
    Poisson queries/s, a 2 ms window raised encode p50 26 -> 32 ms and p99 105 -> 164 ms.
    The same text asked twice at once is encoded once. Vectors do not depend on their
    batch-mates.
    """

    def __init__(
        self,
        encoder: OnnxEncoder,
        size: int = 4096,
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.0,
    ) -> None:
        self.encoder = encoder
        self.size = size
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, asyncio.Future[np.ndarray]] = {}
        self._full: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def encode(self, text: str) -> np.ndarray:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        future = self._pending.get(text)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending[text] = future
            if self._worker is None or self._worker.done():
                self._full = asyncio.Event()  # bound to this loop, lives as long as the worker
                self._worker = asyncio.create_task(self._drain())
            elif len(self._pending) >= self.max_batch and self._full is not None:
                self._full.set()
        # Shielded: a caller that goes away must not cancel its batch-mates' result.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        """Encode pending texts batch by batch; exits when none are left."""
        assert self._full is not None
        while self._pending:
            if len(self._pending) < self.max_batch and self.max_wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self.max_wait_s)
            self._full.clear()
            texts = list(self._pending)[: self.max_batch]
            batch = {text: self._pending.pop(text) for text in texts}
            try:
                vectors = await asyncio.to_thread(self.encoder.encode, texts)
            except Exception as error:
                for future in batch.values():
                    if not future.done():
                        future.set_exception(error)
                continue
            for (text, future), vector in zip(batch.items(), vectors, strict=True):
                self._remember(text, vector)
                if not future.done():
                    future.set_result(vector)

    def _remember(self, text: str, vector: np.ndarray) -> None:
        self._cache[text] = vector
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)


class TokenCounter:
    """The encoder's token count, memoised line by line where that is exact.

    ``assemble_context`` re-counts the whole rendered context after every item it admits:
    ~9 counts of up to ~500 tokens per query, ~8 ms here, more than the rest of a cached
    retrieval. BERT's normaliser works char by char and its pre-tokenizer never makes a
    token across whitespace, so a text's count is the sum of its lines' counts, and the
    lines recur across those calls and across queries. Other tokenizers (a SentencePiece
    model marks word starts, for one) are counted whole.
    """

    def __init__(self, encoder: OnnxEncoder, size: int = 65_536) -> None:
        self._whole = encoder.count_tokens
        self._line = functools.lru_cache(maxsize=size)(encoder.count_tokens)
        self.by_line = encoder.counts_by_line

    def __call__(self, text: str) -> int:
        if not self.by_line:
            return self._whole(text)
        return sum(self._line(line) for line in text.split("\n"))


@dataclass
class Retriever:
    """One tenant-and-user-scoped retrieval; every store read names both (isolation)."""

    queries: QueryEncoder
    state: RedisState
    longterm: LongTermStore
    metrics: Metrics
    short_term_candidates: int  # turns of the user considered (newest first); 0 = all
    params: RankingParams = field(default_factory=RankingParams)
    turn_cache_users: int = 256
    turn_cache_bytes: int = 1 << 30  # the turn index's memory budget (rpc/turn_index.py)
    short_term_mode: ShortTermMode = "flat"

    def __post_init__(self) -> None:
        self.count_tokens = TokenCounter(self.queries.encoder)
        self.turn_index = TurnIndex(
            self.state,
            dim=self.queries.encoder.dim,
            archive=self.longterm,
            max_users=self.turn_cache_users,
            max_bytes=self.turn_cache_bytes,
        )
        self._memory_texts: dict[tuple[str, int, datetime], str] = {}

    async def retrieve(self, tenant_id: str, request: RetrieveRequest) -> RetrieveResponse:
        started = time.perf_counter()
        user = request.user_id
        vector = await self.queries.encode(request.query)
        encoded_at = time.perf_counter()
        self.metrics.retrieval_latency.labels("encode").observe(encoded_at - started)

        keys = lookup_keys(extract_entities(request.query))
        turns, scored, keyed, clusters = await asyncio.gather(
            self.turn_index.get(tenant_id, user),
            self.longterm.search(tenant_id, user, vector, request.top_k),
            self.longterm.find_by_keys(tenant_id, user, keys, request.top_k),
            self._clusters(tenant_id, user),
        )
        turn_vector = vector
        named = named_speakers(request.query, turns.speaker_names)
        if named:
            # Turns are embedded without their speaker, who is matched apart (the speaker
            # bonus, BM25 over ``speaker (date): text``): the name left in the query only
            # pulls the dense side toward turns that mention the person.
            turn_vector = await self.queries.encode(strip_names(request.query, named))
            turns = await self.turn_index.get(tenant_id, user)
        # No await from here to the ranking: ``turns.lexical`` is shared with later syncs.
        candidates = self._candidates(
            request, vector, keys, turns, scored, keyed, clusters, turn_vector
        )
        fetched_at = time.perf_counter()
        self.metrics.retrieval_latency.labels("fetch").observe(fetched_at - encoded_at)

        ranked = rank(candidates, request.top_k, exploration_share=self.params.exploration_share)
        context, used = self._assemble(ranked, request.budget_tokens)
        done = time.perf_counter()
        self.metrics.retrieval_latency.labels("rank").observe(done - fetched_at)
        self.metrics.retrieval_latency.labels("total").observe(done - started)
        return RetrieveResponse(
            items=[
                RetrievedItem(
                    kind=c.kind,
                    id=c.id,
                    text=c.text,
                    score=round(score, 6),
                    strength=c.strength,
                    ts=c.ts,
                    source_event_ids=list(c.source_event_ids),
                )
                for c, score in used
            ],
            context=context,
            context_tokens=self.count_tokens(context) if context else 0,
            took_ms=round((done - started) * 1000, 3),
        )

    def _assemble(
        self, ranked: list[tuple[Candidate, float]], budget: int
    ) -> tuple[str, list[tuple[Candidate, float]]]:
        counter = self.count_tokens
        return assemble_context(ranked, budget, counter, additive_lines=counter.by_line)

    def _memory_text(self, m: ConsolidatedMemory) -> str:
        """``memory_text``, memoised per memory version (rendering costs ~30 us a memory)."""
        key = (m.memory_id, m.version, m.updated_at)
        text = self._memory_texts.get(key)
        if text is None:
            text = memory_text(m)
            self._memory_texts[key] = text
            if len(self._memory_texts) > 16_384:
                self._memory_texts.pop(next(iter(self._memory_texts)))
        return text

    async def _clusters(self, tenant_id: str, user: str) -> list[Cluster] | None:
        if self.short_term_mode == "flat":
            return None
        return await self.state.clusters(tenant_id, user)

    def _candidates(
        self,
        request: RetrieveRequest,
        vector: np.ndarray,
        keys: list[str],
        turns: UserTurns,
        scored: list[ScoredMemory],
        keyed: list[ConsolidatedMemory],
        clusters: list[Cluster] | None,
        turn_vector: np.ndarray | None = None,
    ) -> list[Candidate]:
        """Memories and the turns that can make the cut, with fused relevance.

        Dense (cosine, plus a bonus where the query names the turn's speaker) and lexical
        (BM25 over ``speaker (date): text``) scores of every turn and found memory are fused
        into one relevance (``memory.ranking.fused_relevance``); an exact key match (order
        number, email, product id) in the query is relevance 1.0 whatever the embeddings say.
        """
        p = self.params
        memories: dict[str, ConsolidatedMemory] = {m.memory_id: m for m in keyed}
        dense_of: dict[str, float] = {}
        for hit in scored:
            memories.setdefault(hit.memory.memory_id, hit.memory)
            dense_of[hit.memory.memory_id] = hit.score
        memory_list = list(memories.values())
        rows = np.arange(len(turns.ids), dtype=np.intp)  # every turn, hot or archived
        if self.short_term_candidates and len(rows) > self.short_term_candidates:
            rows = rows[np.argsort(-turns.ts[rows], kind="stable")[: self.short_term_candidates]]
        query_tokens = tokens_of(request.query)
        keyed_rows = {r for k in keys for r in turns.by_entity.get(k, ())}
        if clusters is not None and self.short_term_mode == "hierarchical":
            # The shelf, then the book; BM25's best and key matches too.
            lexical_all = turns.lexical.scores(query_tokens, turns.positions, len(turns.ids))
            shelf = hierarchical_search(
                vector, clusters, [turns.ids[r] for r in rows], turns.vectors[rows]
            )
            picked = {int(rows[i]) for i in np.argsort(-lexical_all[rows])[: request.top_k]}
            picked |= {turns.positions[h.event_id] for h in shelf} | keyed_rows
            rows = np.array(sorted(picked), dtype=np.intp)
        turn_query = vector if turn_vector is None else turn_vector
        turn_dense = cosine_to_rows(turn_query, turns.vectors[rows]).astype(np.float64)
        named = named_speakers(request.query, turns.speaker_names)
        if named:
            turn_dense += p.speaker_bonus * np.isin(turns.speaker_of[rows], list(named))
        turn_lexical = turns.lexical.scores(query_tokens, turns.positions, len(turns.ids))[rows]
        memory_texts = [self._memory_text(m) for m in memory_list]
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
        keyed_ids = {m.memory_id for m in keyed}
        latest = asks_for_latest(request.query)
        memory_ts = [_event_time(m, turns) for m in memory_list]
        now = request.now or _newest_event(turns, memory_ts)

        def boost(ts: datetime) -> float:
            if not latest or now is None:
                return 1.0
            return recency_factor(ts, now, p.recency_half_life_days)

        turn_relevance = relevance[len(memory_list) :].copy()
        if clusters is not None and self.short_term_mode == "expand":
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
            )
        if keyed_rows:
            at = _index_of_rows(rows, len(turns.ids))
            hits = at[np.fromiter(keyed_rows, dtype=np.intp)]
            turn_relevance[hits[hits >= 0]] = KEY_MATCH_RELEVANCE
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
                else _slot_merit(float(rel), m.source_event_ids, relevance_of, request.top_k),
                strength=m.strength,
                ts=ts,
                source_event_ids=_best_first(m.source_event_ids, rank_of),
                boost=boost(ts),
                strength_span=p.strength_span,
                shows=_shown_events(m),
            )
            for m, text, rel, ts in zip(
                memory_list, memory_texts, relevance, memory_ts, strict=False
            )
        ]
        turn_boost = (
            recency_factors(turns.ts[rows], now.timestamp(), p.recency_half_life_days)
            if latest and now is not None
            else 1.0
        )
        # rank() keeps top_k turns and drops only turns a found memory covers: the turns, best
        # first, up to the top_k-th one no memory covers give it the answer all of them would.
        order = np.lexsort((-turns.ts[rows], -(turn_relevance * turn_boost)))
        sources = [e for m in memory_list for e in m.source_event_ids if e in turns.positions]
        coverable = np.zeros(len(turns.ids), dtype=bool)
        coverable[[turns.positions[e] for e in sources]] = True
        uncovered = np.cumsum(~coverable[rows[order]])
        order = order[: int(np.searchsorted(uncovered, request.top_k)) + 1]
        for i in order:
            turn = turns.docs[int(rows[i])]
            out.append(
                Candidate(
                    kind="turn",
                    id=turn.event_id,
                    text=turns.texts[int(rows[i])],
                    relevance=float(turn_relevance[i]),
                    strength=1.0,
                    ts=turn.ts,
                    source_event_ids=(turn.event_id,),
                    boost=boost(turn.ts),
                    strength_span=p.strength_span,
                )
            )
        return out


def _index_of_rows(rows: np.ndarray, size: int) -> npt.NDArray[np.intp]:
    """Row of the turn index -> its index into ``rows``, -1 where it is not a candidate."""
    at = np.full(size, -1, dtype=np.intp)
    at[rows] = np.arange(len(rows), dtype=np.intp)
    return at


class _SessionNeighbours(Sequence[list[int]]):
    """For each of ``rows`` (in time order), the indices into ``rows`` of the turns up to
    ``window`` before and after it in the same session. Computed on demand: the ranking
    asks for a handful of seeds, and a user may have 10k turns."""

    def __init__(self, turns: UserTurns, rows: np.ndarray, window: int) -> None:
        self.turns, self.rows, self.window = turns, rows, window
        self.at = _index_of_rows(rows, len(turns.ids))

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> list[int]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[int]]: ...
    def __getitem__(self, i: int | slice) -> list[int] | list[list[int]]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        r, docs, size = int(self.rows[i]), self.turns.docs, len(self.turns.ids)
        session = docs[r].session_id
        around = [r + d for d in range(-self.window, self.window + 1) if d and 0 <= r + d < size]
        return [
            int(self.at[n]) for n in around if self.at[n] >= 0 and docs[n].session_id == session
        ]


class _RowValues(Mapping[str, float]):
    """Event id -> a per-candidate value, for the candidate turns only; no dict of every
    turn is built per query."""

    def __init__(self, turns: UserTurns, rows: np.ndarray, values: np.ndarray) -> None:
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


def _event_time(m: ConsolidatedMemory, turns: UserTurns) -> datetime:
    """A memory's event time: its newest source turn's, else what it stores (the
    consolidator's times are its sources' too; this holds while older data says otherwise)."""
    rows = [turns.positions[e] for e in m.source_event_ids if e in turns.positions]
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


def _shown_events(m: ConsolidatedMemory) -> tuple[str, ...]:
    """The events whose words the memory's text shows: its facts', timeline's and open
    actions' sources (a memory shows none of its other sources)."""
    found = [e for f in m.facts for e in f.source_event_ids]
    found += [x.event_id for x in m.timeline if x.event_id]
    found += [a.event_id for a in m.open_actions if a.event_id]
    return tuple(dict.fromkeys(found))


def _newest_event(turns: UserTurns, memory_ts: list[datetime]) -> datetime | None:
    """The "now" of recency: the user's newest event, never the wall clock."""
    if len(turns.ts):
        return turns.docs[int(np.argmax(turns.ts))].ts
    return max(memory_ts, default=None)


def _clusters_of(clusters: list[Cluster], turns: UserTurns) -> dict[int, str]:
    """Row of the turn index -> the cluster holding that turn."""
    return {
        turns.positions[e]: c.cluster_id
        for c in clusters
        for e in c.member_ids
        if e in turns.positions
    }
