"""The quality benchmark's laboratory: the RPC's retrieval, in process, over a snapshot of
the stores as a real run left them.

``python -m bench.quality --snapshot PATH`` keeps, per conversation, every short-term turn
with its stored vector, the clusters and the consolidated memories it reached. Here the
very ``rpc.retrieval.Retriever.retrieve`` the server runs answers every question over that
state (its reads served from the snapshot instead of Valkey and Qdrant), so a ranking
change is measured in seconds, and the three ways to pick the turns (``MODES``) are
compared on the same state in the real run too. Tuning runs::

    python -m bench.quality_lab PATH [--mode expand] [--param dense_weight=0.4]

The snapshot holds LoCoMo text (CC BY-NC 4.0): keep it outside the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import httpx
import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry

from bench import locomo
from bench.locomo import Question, Scores
from memstream.memory.cluster_state import Cluster
from memstream.memory.lexical import LexicalIndex
from memstream.memory.ranking import RankingParams
from memstream.memory.turns import stored_turn
from memstream.memory.vectors import FloatArray, mean_direction
from memstream.metrics import Metrics
from memstream.rpc.retrieval import QueryEncoder, Retriever, ShortTermMode, exemplars_of
from memstream.schemas import (
    ConsolidatedMemory,
    InteractionEvent,
    RetrievedItem,
    RetrieveRequest,
    RetrieveResponse,
    StoredTurn,
)
from memstream.settings import DEMO_TENANT, Settings
from memstream.stores.encoder import OnnxEncoder
from memstream.stores.longterm import LongTermStore, ScoredMemory
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import TurnWithVector
from memstream.stores.turn_index import UserTurns, index_turn

MODES: tuple[ShortTermMode, ...] = get_args(ShortTermMode)
TOP_K = locomo.TOP_K
# The context calls ask for as many items as the API allows, so the budget, not top_k, is
# what binds -- as for a baseline filling the budget from its whole ranking.
CONTEXT_TOP_K = 50
BUDGETS = (256, 512, 1024)
RANK_BUDGET = 8192  # every top-20 fits: the response lists the whole ranking
POSITION_RULE = " (memory = 1 position)"
CREDITED = " credited"
POSITION_METRICS = ("R@5", "R@10", "R@20", "MRR")
HOLDS_MEMORY = "holds a memory"  # per budget: 1 where the context has a memory item, else 0


@dataclass
class UserState:
    turns: list[TurnWithVector]  # timeline order, oldest first
    clusters: list[Cluster]
    memories: list[ConsolidatedMemory]


Snapshot = dict[str, UserState]  # user (conversation) -> state


async def collect(
    state: RedisState,
    http: httpx.AsyncClient,
    turns: dict[str, list[locomo.Turn]],
    encoder: OnnxEncoder,
) -> Snapshot:
    """Every turn, cluster and memory of the users ``turns`` names (tenant demo).

    Turns are rebuilt from the events as ``memorize`` stores them (its ``StoredTurn``, the
    same encoder's vector of the text, rounded to float16 as stored): most of them have left
    Redis for the archive tier by event time, and the archive lives in the server process.
    """
    events = {
        user: [locomo.to_event(t) for t in conversation] for user, conversation in turns.items()
    }
    return await collect_events(state, http, events, encoder)


async def collect_events(
    state: RedisState,
    http: httpx.AsyncClient,
    by_user: dict[str, list[InteractionEvent]],
    encoder: OnnxEncoder,
) -> Snapshot:
    """``collect`` for any events: each user's, as posted (tenant demo)."""
    snap: Snapshot = {}
    for user, events in by_user.items():
        vectors = encoder.encode([e.text for e in events]).astype(np.float16).astype(np.float32)
        stored = [
            TurnWithVector(
                stored_turn(e),
                v,
            )
            for e, v in zip(events, vectors, strict=True)
        ]
        memories: list[ConsolidatedMemory] = []
        offset: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": 100, **({"offset": offset} if offset else {})}
            page = await http.get(f"/v1/users/{user}/memories", params=params)
            page.raise_for_status()
            body = page.json()
            memories += [ConsolidatedMemory.model_validate(m) for m in body["memories"]]
            offset = body["next_offset"]
            if offset is None:
                break
        snap[user] = UserState(stored, await state.clusters(DEMO_TENANT, user), memories)
    return snap


def save(snap: Snapshot, path: Path) -> None:
    """Models as JSON-mode dicts, so a snapshot outlives a change of their fields."""
    plain = {
        user: {
            "turns": [(t.turn.model_dump(mode="json"), t.vector) for t in st.turns],
            "clusters": st.clusters,
            "memories": [m.model_dump(mode="json") for m in st.memories],
        }
        for user, st in snap.items()
    }
    path.write_bytes(pickle.dumps(plain))


def load(path: Path) -> Snapshot:
    plain: dict[str, dict[str, Any]] = pickle.loads(path.read_bytes())  # our own file
    return {
        user: UserState(
            [TurnWithVector(StoredTurn.model_validate(t), v) for t, v in st["turns"]],
            st["clusters"],
            [_memory(m) for m in st["memories"]],
        )
        for user, st in plain.items()
    }


def _memory(data: dict[str, Any]) -> ConsolidatedMemory:
    known = ConsolidatedMemory.model_fields
    return ConsolidatedMemory.model_validate({k: v for k, v in data.items() if k in known})


# --- the stores, served from a snapshot ---------------------------------------------------


class _Turns:
    def __init__(self, turns: dict[str, UserTurns]) -> None:
        self.turns = turns

    async def get(self, tenant_id: str, user_id: str) -> UserTurns:
        return self.turns[user_id]


class _Clusters:
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    async def clusters(self, tenant_id: str, user_id: str) -> list[Cluster]:
        return self.snap[user_id].clusters


class _LongTerm:
    """``search`` and ``find_by_keys`` as the LongTermStore contract states them, by numpy;
    a memory's vector is what the consolidator stores (``_memory_vector``)."""

    def __init__(
        self,
        snap: Snapshot,
        vectors: dict[str, npt.NDArray[np.float32]],
        memories: bool = True,
    ) -> None:
        self.snap = snap
        self.vectors = vectors
        self.memories = memories  # False: the store holds none (turns only)

    async def search(
        self, tenant_id: str, user_id: str, vector: np.ndarray, limit: int
    ) -> list[ScoredMemory]:
        memories = self.snap[user_id].memories
        if not memories or not self.memories:
            return []
        sims = self.vectors[user_id] @ vector.astype(np.float32)
        order = np.argsort(-sims, kind="stable")[:limit]
        return [ScoredMemory(memories[int(i)], float(sims[int(i)])) for i in order]

    async def find_by_keys(
        self, tenant_id: str, user_id: str, keys: Sequence[str], limit: int
    ) -> list[ConsolidatedMemory]:
        if not self.memories:
            return []
        wanted = set(keys)
        found = [m for m in self.snap[user_id].memories if wanted & set(m.keys)]
        return sorted(found, key=lambda m: m.memory_id)[:limit]


def retriever(
    snap: Snapshot,
    encoder: OnnxEncoder,
    mode: ShortTermMode = "flat",
    params: RankingParams | None = None,
    memories: bool = True,
) -> Retriever:
    """The RPC's ``Retriever`` whose store reads come from ``snap``; ``memories`` False:
    its long-term store holds no consolidated memory (turns only, the same ranking)."""
    turns = {}
    for user, st in snap.items():
        lexical = LexicalIndex()
        for row in st.turns:
            index_turn(lexical, row.turn)
        turns[user] = UserTurns.build(
            b"lab", st.turns, lexical, encoder.dim, exemplars=exemplars_of(encoder)
        )
    longterm = _LongTerm(snap, {}, memories)
    r = Retriever(
        queries=QueryEncoder(encoder),
        state=cast(RedisState, _Clusters(snap)),
        longterm=cast(LongTermStore, longterm),
        metrics=Metrics(CollectorRegistry()),
        short_term_candidates=0,
        params=params or RankingParams(),
        short_term_mode=mode,
        exemplars=exemplars_of(encoder),
    )
    r.turn_index = cast(Any, _Turns(turns))
    longterm.vectors = {user: _memory_vectors(st, encoder.dim) for user, st in snap.items()}
    return r


def _memory_vectors(st: UserState, dim: int) -> FloatArray:
    """What the consolidator stores as each memory's vector (``workers.consolidate``): the
    mean direction of the stored vectors of the turns it was built from, the newest
    ``consolidation.max_turns`` of them (the turns one consolidation reads)."""
    if not st.memories:
        return np.zeros((0, dim), np.float32)
    vectors = {t.turn.event_id: t.vector for t in st.turns}
    newest = Settings().consolidation.max_turns
    return np.stack(
        [
            mean_direction(
                np.stack([vectors[e] for e in m.source_event_ids[-newest:] if e in vectors])
            ).astype(np.float32)
            for m in st.memories
        ]
    )


# --- scoring ------------------------------------------------------------------------------


def _sources(item: RetrievedItem, conversation: str) -> list[str]:
    """The dia_ids an item rests on, in order: a turn its own, a memory its sources."""
    ids = item.source_event_ids or [item.id]
    return [locomo.dia_id_of(e) for e in ids if e.startswith(f"{conversation}:")]


def score_answers(
    q: Question,
    ranked: RetrieveResponse,
    budgeted: dict[int, RetrieveResponse],
    texts: dict[str, str],
) -> Scores:
    """One question's scores from the RPC's answers: ``ranked`` at a budget every top-k
    fits in (the ranking), ``budgeted`` one answer per budget (the contexts)."""
    order = sorted(
        ranked.items, key=lambda i: (-i.score, i.kind != "memory", -i.ts.timestamp(), i.id)
    )
    ranking = [_sources(i, q.conversation_id) for i in order]
    s = locomo.score_ranking(locomo.flatten(ranking), q.evidence)  # the headline rule
    generous = locomo.score_ranking([frozenset(r) for r in ranking], q.evidence)
    s.update({f"{m}{POSITION_RULE}": generous[m] for m in POSITION_METRICS})
    memories = [d for i, d in zip(order, ranking, strict=True) if i.kind == "memory"]
    s["turns in top 10"] = float(len({d for r in ranking[:10] for d in r}))
    s["memories in top 20"] = float(len(memories))
    s["sources per memory"] = locomo.mean(len(d) for d in memories) if memories else 0.0
    for kind in ("memory", "turn"):  # why one kind outranks the other: relevance x strength
        best = max((i for i in order if i.kind == kind), key=lambda i: i.score, default=None)
        s[f"best {kind} score"] = best.score if best else 0.0
        s[f"best {kind} strength"] = best.strength if best else 0.0
    s["took_ms@rank"] = ranked.took_ms
    for budget, got in budgeted.items():
        # A turn cut to its excerpt counts only by what of it is visibly there.
        turns = [
            d
            for i in got.items
            if i.kind == "turn" and not i.excerpt
            for d in _sources(i, q.conversation_id)
        ]
        shown = locomo.context_coverage(got.context, turns, (), texts)
        sources = [d for i in got.items for d in _sources(i, q.conversation_id)]
        s[f"ER@{budget}"] = locomo.evidence_recall(shown, q.evidence)
        s[f"ER@{budget}{CREDITED}"] = locomo.evidence_recall(shown | set(sources), q.evidence)
        s[f"AT@{budget}"] = locomo.answer_tokens(got.context, q.answer)
        s[f"items@{budget}"] = float(len(got.items))
        s[f"memories@{budget}"] = float(sum(i.kind == "memory" for i in got.items))
        s[f"{HOLDS_MEMORY}@{budget}"] = float(any(i.kind == "memory" for i in got.items))
        s[f"tokens@{budget}"] = float(got.context_tokens)
        s[f"took_ms@{budget}"] = got.took_ms
    return s


def answer(
    snap: Snapshot,
    questions: Sequence[Question],
    texts: dict[str, dict[str, str]],
    encoder: OnnxEncoder,
    mode: ShortTermMode = "flat",
    params: RankingParams | None = None,
    memories: bool = True,
) -> dict[str, Scores]:
    """question_id -> scores, every question answered by the RPC's code over ``snap``
    (``memories`` False: with no consolidated memory offered, turns only)."""
    r = retriever(snap, encoder, mode, params, memories)

    async def ask(q: Question) -> Scores:
        async def at(budget: int) -> RetrieveResponse:
            top_k = TOP_K if budget == RANK_BUDGET else CONTEXT_TOP_K
            request = RetrieveRequest(
                user_id=q.conversation_id, query=q.question, top_k=top_k, budget_tokens=budget
            )
            return await r.retrieve(DEMO_TENANT, request)

        ranked = await at(RANK_BUDGET)
        budgeted = {b: await at(b) for b in BUDGETS}
        return score_answers(q, ranked, budgeted, texts[q.conversation_id])

    async def every() -> dict[str, Scores]:
        return {q.question_id: await ask(q) for q in questions}

    return asyncio.run(every())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--shared", type=Path, default=Path("../shared/bench"))
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--param", action="append", default=[], help="RankingParams field=value")
    parser.add_argument("--no-memories", action="store_true", help="turns alone")
    args = parser.parse_args()
    snap = load(args.snapshot)
    turns = {c: locomo.load_turns(args.shared, c) for c in snap}
    questions = locomo.load_questions(args.shared, list(snap))
    texts = {c: {x.dia_id: locomo.event_text(x) for x in v} for c, v in turns.items()}
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    fields = {f.name: f.type for f in dataclasses.fields(RankingParams)}
    changes: dict[str, Any] = {}
    for item in args.param:
        name, value = item.split("=", 1)
        if name not in fields:
            raise SystemExit(f"unknown parameter {name!r}: one of {', '.join(fields)}")
        changes[name] = type(getattr(RankingParams(), name))(value)
    params = RankingParams(**changes)
    metrics: tuple[str, ...] = ("R@10", "ER@256", "ER@512", "ER@1024")
    metrics += ("AT@256", "AT@512", "AT@1024", f"R@10{POSITION_RULE}", f"ER@1024{CREDITED}")
    if not args.no_memories:  # the share of contexts with a memory in them, per budget
        metrics += tuple(f"{HOLDS_MEMORY}@{b}" for b in BUDGETS)
    for mode in args.mode or MODES:
        scores = answer(snap, questions, texts, encoder, mode, params, not args.no_memories)
        summary = locomo.aggregate(scores, questions)
        for group in ("1-4", "1", "2", "3", "4"):
            cells = "  ".join(f"{m} {summary[group][m]:.3f}" for m in metrics)
            print(f"{mode:12s} {group:4s} n={summary[group]['n']:.0f}  {cells}")


if __name__ == "__main__":
    main()
