"""Turn-level baselines for LoCoMo-dev: Okapi BM25, dense cosine and their hybrid, over
several turn formats.

Each baseline ranks every turn of the question's own conversation (memstream keeps one user
per conversation, so the baselines search the same pool). BM25 is Okapi BM25 (k1 = 1.2,
b = 0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5))) over ``memory.text.tokenize`` tokens,
written here with numpy; dense is cosine over all-MiniLM-L6-v2 embeddings from the same
``OnnxEncoder`` memstream runs; hybrid fuses the two rankings of the same format by
reciprocal rank (RRF, score = sum of 1 / (k + rank), k = 60 as in Cormack et al.), the
usual way a search system combines them. Ties keep conversation order (earlier turn first).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from bench.locomo import (
    FORMATS,
    TOP_K,
    Format,
    Question,
    Scores,
    Turn,
    answer_tokens,
    context_coverage,
    evidence_recall,
    fill_budget,
    format_turn,
    score_ranking,
)
from memstream.memory.text import tokenize
from memstream.stores.encoder import OnnxEncoder

Retriever = Literal["BM25", "dense", "hybrid"]
RRF_K = 60
HYBRID_FORMATS: tuple[Format, ...] = ("speaker (date): text", "speaker (date): text + caption")
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Baseline:
    retriever: Retriever
    fmt: Format

    @property
    def name(self) -> str:
        what = {"BM25": "BM25", "dense": "MiniLM cosine", "hybrid": "BM25 + MiniLM (RRF)"}
        return f"{what[self.retriever]} over `{self.fmt}`"


BASELINES: tuple[Baseline, ...] = (
    *(Baseline(r, f) for r in ("BM25", "dense") for f in FORMATS),
    *(Baseline("hybrid", f) for f in HYBRID_FORMATS),
)


class BM25:
    """Okapi BM25 over pre-tokenised documents; ``scores`` of one query against all of them."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75) -> None:
        counts = [Counter(doc) for doc in docs]
        self.vocab: dict[str, int] = {}
        for c in counts:
            for term in c:
                self.vocab.setdefault(term, len(self.vocab))
        tf = np.zeros((len(docs), max(len(self.vocab), 1)), dtype=np.float64)
        for row, c in enumerate(counts):
            for term, n in c.items():
                tf[row, self.vocab[term]] = n
        n_docs = len(docs)
        lengths = tf.sum(axis=1)
        avg_length = float(lengths.mean()) if n_docs and lengths.mean() > 0 else 1.0
        df = (tf > 0).sum(axis=0)
        idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        norm = k1 * (1.0 - b + b * lengths / avg_length)
        # Every (doc, term) weight at once: idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b dl/avgdl)).
        self.weights: FloatArray = idf * tf * (k1 + 1.0) / (tf + norm[:, None])

    def scores(self, query: Sequence[str]) -> FloatArray:
        """Sum over the query's terms (a repeated term counts each time), one score per doc."""
        columns = [self.vocab[t] for t in query if t in self.vocab]
        if not columns:
            return np.zeros(self.weights.shape[0], dtype=np.float64)
        result: FloatArray = self.weights[:, columns].sum(axis=1)
        return result


def _order(scores: FloatArray) -> list[int]:
    """Indices best first; ties keep document order."""
    return [int(i) for i in np.argsort(-scores, kind="stable")]


def rrf(orders: Sequence[Sequence[int]], n: int, k: int = RRF_K) -> FloatArray:
    """Reciprocal rank fusion of full rankings of ``n`` documents: sum of 1 / (k + rank)."""
    fused = np.zeros(n, dtype=np.float64)
    for order in orders:
        fused[np.asarray(order, dtype=np.intp)] += 1.0 / (k + np.arange(1, len(order) + 1))
    return fused


def rank_conversation(
    baseline: Baseline,
    turns: Sequence[Turn],
    questions: Sequence[Question],
    embed: dict[str, npt.NDArray[np.float32]],
) -> dict[str, list[str]]:
    """Every turn of one conversation ranked for each question: question_id -> dia_ids.

    ``embed`` maps each text (turns in this baseline's format, and the questions) to its
    unit embedding; only dense baselines read it.
    """
    texts = [format_turn(t, baseline.fmt) for t in turns]
    ids = [t.dia_id for t in turns]
    index = BM25([tokenize(text) for text in texts]) if baseline.retriever != "dense" else None
    matrix = (
        np.stack([embed[text] for text in texts]).astype(np.float64)
        if baseline.retriever != "BM25"
        else None
    )
    ranked: dict[str, list[str]] = {}
    for q in questions:
        orders = []
        if index is not None:
            orders.append(_order(index.scores(tokenize(q.question))))
        if matrix is not None:
            orders.append(_order(matrix @ embed[q.question].astype(np.float64)))
        order = orders[0] if len(orders) == 1 else _order(rrf(orders, len(ids)))
        ranked[q.question_id] = [ids[i] for i in order]
    return ranked


def rank_all(
    encoder: OnnxEncoder,
    turns: dict[str, list[Turn]],
    questions: Sequence[Question],
    baselines: Sequence[Baseline] = BASELINES,
) -> dict[str, dict[str, list[str]]]:
    """baseline name -> question_id -> the conversation's dia_ids, best first.

    Every distinct text (each turn in each dense format, each question) is encoded once.
    """
    wanted = {q.question for q in questions}
    for b in baselines:
        if b.retriever != "BM25":
            wanted.update(format_turn(t, b.fmt) for conv in turns.values() for t in conv)
    unique = sorted(wanted)
    vectors = encoder.encode(unique) if unique else np.empty((0, encoder.dim), np.float32)
    embed = dict(zip(unique, vectors, strict=True))
    result: dict[str, dict[str, list[str]]] = {}
    for b in baselines:
        ranked: dict[str, list[str]] = {}
        for conv, conv_turns in turns.items():
            asked = [q for q in questions if q.conversation_id == conv]
            ranked.update(rank_conversation(b, conv_turns, asked, embed))
        result[b.name] = ranked
    return result


@dataclass(frozen=True)
class BudgetedContext:
    dia_ids: list[str]  # the turns in the context, best first
    text: str
    tokens: int


def budgeted_context(
    ranked: Sequence[str],
    lines: dict[str, str],
    costs: dict[str, int],
    budget_tokens: int,
    encoder: OnnxEncoder,
    max_turns: int | None = None,
    *,
    verify: bool = False,
) -> BudgetedContext:
    """A baseline's context: its top turns (``lines``: dia_id -> rendered turn) within the
    budget, at most ``max_turns`` candidates if set; ``costs`` are the lines' token counts.

    The context's tokens are the sum of its lines' (newline joins cost nothing to WordPiece);
    ``verify`` counts the joined string with ``encoder.count_tokens`` and raises if that
    ever differs, so the figures rest on the same tokenizer as memstream's budget.
    """
    candidates = ranked if max_turns is None else ranked[:max_turns]
    chosen = fill_budget(candidates, costs, budget_tokens)
    text = "\n".join(lines[d] for d in chosen)
    tokens = sum(costs[d] for d in chosen)
    if verify and text and encoder.count_tokens(text) != tokens:
        raise AssertionError("joined lines do not cost the sum of their tokens")
    return BudgetedContext(chosen, text, tokens)


def score_baselines(
    rankings: dict[str, dict[str, list[str]]],
    turns: dict[str, list[Turn]],
    questions: Sequence[Question],
    encoder: OnnxEncoder,
    budgets: Sequence[int],
) -> dict[str, dict[str, Scores]]:
    """baseline name -> question_id -> scores: the ranking's, and evidence recall of a
    context that fills each budget with the baseline's top turns, written in its format
    (``ER@B``: as many as fit; ``ER@B top20``: from its first 20 only, as memstream)."""
    per: dict[str, dict[str, Scores]] = {}
    for baseline in BASELINES:
        lines = {c: {t.dia_id: format_turn(t, baseline.fmt) for t in v} for c, v in turns.items()}
        costs = {c: {d: encoder.count_tokens(x) for d, x in v.items()} for c, v in lines.items()}
        per[baseline.name] = {}
        for i, q in enumerate(questions):
            ranked = rankings[baseline.name][q.question_id]
            s = score_ranking([frozenset((d,)) for d in ranked], q.evidence)
            for budget in budgets:
                for suffix, cap in (("", None), (" top20", TOP_K)):
                    got = budgeted_context(
                        ranked, lines[q.conversation_id], costs[q.conversation_id], budget,
                        encoder, cap, verify=i < 10,
                    )  # fmt: skip
                    covered = context_coverage(got.text, got.dia_ids, (), {})
                    s[f"ER@{budget}{suffix}"] = evidence_recall(covered, q.evidence)
                    s[f"AT@{budget}{suffix}"] = answer_tokens(got.text, q.answer)
                    s[f"items@{budget}{suffix}"] = float(len(got.dia_ids))
                    s[f"tokens@{budget}{suffix}"] = float(got.tokens)
            per[baseline.name][q.question_id] = s
    return per
