"""One retrieval: encode the query, gather short- and long-term candidates, rank, budget.

The science (scoring, de-duplication, context layering) lives in ``memory.ranking``; this
module only fetches candidates from the stores of one tenant's user and times each phase.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from memory.ranking import Candidate, assemble_context, memory_text, rank, turn_text
from memory.text import extract_entities
from memory.vectors import cosine_to_rows
from memstream.metrics import Metrics
from schemas import ConsolidatedMemory, RetrievedItem, RetrieveRequest, RetrieveResponse
from stores.encoder import OnnxEncoder
from stores.longterm import LongTermStore
from stores.redis_state import RedisState

KEY_MATCH_RELEVANCE = 1.0  # an exact order number / email in the query is as good as it gets


class QueryEncoder:
    """Query embeddings with a small LRU cache: bots repeat themselves."""

    def __init__(self, encoder: OnnxEncoder, size: int = 4096) -> None:
        self.encoder = encoder
        self.size = size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    async def encode(self, text: str) -> np.ndarray:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        vector: np.ndarray = (await asyncio.to_thread(self.encoder.encode, [text]))[0]
        self._cache[text] = vector
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return vector


@dataclass
class Retriever:
    queries: QueryEncoder
    state: RedisState
    longterm: LongTermStore
    metrics: Metrics
    short_term_candidates: int

    async def retrieve(self, tenant_id: str, request: RetrieveRequest) -> RetrieveResponse:
        started = time.perf_counter()
        user = request.user_id
        vector = await self.queries.encode(request.query)
        encoded_at = time.perf_counter()
        self.metrics.retrieval_latency.labels("encode").observe(encoded_at - started)

        turns, scored, keyed = await asyncio.gather(
            self.state.recent_turns(tenant_id, user, self.short_term_candidates),
            self.longterm.search(tenant_id, user, vector, request.top_k),
            self.longterm.find_by_keys(
                tenant_id, user, extract_entities(request.query), request.top_k
            ),
        )
        fetched_at = time.perf_counter()
        self.metrics.retrieval_latency.labels("fetch").observe(fetched_at - encoded_at)

        candidates: dict[str, Candidate] = {}
        for m in keyed:
            candidates[m.memory_id] = _memory_candidate(m, KEY_MATCH_RELEVANCE)
        for hit in scored:
            if hit.memory.memory_id not in candidates:
                candidates[hit.memory.memory_id] = _memory_candidate(hit.memory, hit.score)
        if turns:
            sims = cosine_to_rows(vector, np.stack([t.vector for t in turns]))
            for t, sim in zip(turns, sims, strict=True):
                candidates[t.turn.event_id] = Candidate(
                    kind="turn",
                    id=t.turn.event_id,
                    text=turn_text(t.turn),
                    relevance=float(sim),
                    strength=1.0,
                    ts=t.turn.ts,
                    source_event_ids=(t.turn.event_id,),
                )
        ranked = rank(list(candidates.values()), request.top_k)
        context, used = assemble_context(
            ranked, request.budget_tokens, self.queries.encoder.count_tokens
        )
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
            context_tokens=self.queries.encoder.count_tokens(context) if context else 0,
            took_ms=round((done - started) * 1000, 3),
        )


def _memory_candidate(m: ConsolidatedMemory, relevance: float) -> Candidate:
    return Candidate(
        kind="memory",
        id=m.memory_id,
        text=memory_text(m),
        relevance=float(relevance),
        strength=m.strength,
        ts=m.updated_at,
        source_event_ids=tuple(m.source_event_ids),
    )
