"""Final ranking of retrieval candidates and the layered, token-budgeted context.

The retrieval RPC gathers candidates (long-term memories from Qdrant, every turn of the
user, exact key matches), turns each into a ``Candidate`` and calls ``rank`` then
``assemble_context``. Both are pure and deterministic.

Score = relevance x strength factor x boost. Relevance is whatever the caller measured
(higher is better, in [0, 1]): ``fused_relevance`` turns a dense and a lexical score into one.
Strength is the memory's use-and-decay weight (1.0 for raw turns); it enters through
``strength_factor``, bounded to [1 - span, 1 + span] with span 0.05: a tie-break between
near-equals, never a reason to outrank a more relevant turn. ``boost`` carries recency
when the query asks for the latest, counted from the user's newest event.

Measured on LoCoMo-dev (231 answerable questions) with the honest rules of
``bench/quality.py`` (a memory's every source takes its own rank slot; evidence counts only
when visibly in the context), in process over a real run's stores (``bench/quality_lab.py``):
z-score fusion of MiniLM (the turn's words) and BM25 (``speaker (date): text``) gave
R@10 0.641; a 0.3 bonus for the speaker the question names, the names taken out of the
query the turns' vectors are compared with (``strip_names``: the vectors carry no
speaker), and the session neighbours (two either side) of the five best hits lifted to
0.95 of them (``lift_neighbours``: a reply holds the answer its question only names) took
it to 0.738, evidence shown at 512 / 1024 tokens from 0.624 / 0.746 to 0.756 / 0.845 (with
the shorter turn line of ``turn_text``). The best baseline of the same run, BM25 + MiniLM over
``speaker (date): text`` fused by reciprocal rank, reads 0.597 / 0.625 / 0.741.

Then, on a fresh snapshot (R@10 / shown @512 / @1024, categories 1-4, from 0.742 / 0.756 /
0.840): the named speaker out of BM25's query (the speaker bonus matches them; left in, the
name alone made a person's shortest turns top hits) 0.745 / 0.761 / 0.854; neighbours lifted
only by a seed of relevance >= 0.95 and only when their own relevance reaches the pool's
median (a lifted small-talk reply pushed another session's hit out: open-domain R@10 0.36
with every neighbour lifted, 0.50 so) 0.777 / 0.775 / 0.860, flat within 0.01 for seed
thresholds 0.90-0.97 and quantiles 0.4-0.6; a day's turns under one ``[8 May 2023]`` heading
(23.2 turns in 1024 tokens instead of 21.4) 0.777 / 0.777 / 0.867. No category lost.

A context of 256 tokens holds about six turns, and it was filled with questions that
echo the query ("How did they handle the accident?") while the reply that answers it sat
at rank 30-40. Each of the ten best hits of relevance >= 0.9 that ends in a question now
hands its relevance to the next turn of its session by another speaker, and keeps 0.99 of
its own (``lift_replies``): evidence shown at 256 / 512 / 1024 tokens 0.656 / 0.781 /
0.864 -> 0.706 / 0.791 / 0.869, answer tokens @256 0.666 -> 0.694, R@10 0.779 -> 0.778;
flat within 0.01 for 5-20 seeds and seed thresholds 0.8-0.95. Giving the question the
reply's relevance (share 1.0) cost R@10 0.009; 0.95 cost evidence shown @256 0.03. The
customer-service benchmark's rows were unchanged.

A query that names a day, a month or a year ("in July 2023", "on 1 February, 2023", "in
June") reads what happened then first: the rest keeps 0.9 of its score
(``outside_period_share``; 0.97 measured the same). Ten of LoCoMo-dev's 231 questions name
one: R@10 0.778 -> 0.782, evidence shown @256 0.706 -> 0.715 (temporal 0.905 -> 0.937).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt

from memstream.memory.when import annotate_times
from memstream.schemas import StoredTurn

MEMORIES_HEADER = "## Memories"
TURNS_HEADER = "## Recent turns"
_TIME = "%Y-%m-%d %H:%M"

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RankingParams:
    """The knobs of hybrid ranking; defaults are the measured ones (see the module doc)."""

    dense_weight: float = 0.5  # lexical gets the rest
    speaker_bonus: float = 0.3  # cosine units, for a turn whose speaker the query names
    strength_span: float = 0.05  # strength moves a score by at most this share either way
    exploration_share: float = 0.05  # of top_k, for mid-strength recent memories
    recency_half_life_days: float = 30.0  # when the query asks for the latest
    # When the query names a day, a month or a year ("in July 2023"), what happened at
    # another time keeps this share of its score (memory.when.asked_period).
    outside_period_share: float = 0.9
    # Session neighbours: the turns up to ``neighbour_window`` before and after each of the
    # ``neighbour_seeds`` best hits in its session (lift_neighbours).
    neighbour_seeds: int = 5
    neighbour_window: int = 2
    neighbour_share: float = 0.95
    # Only a seed that stands out lifts (relevance 0.95: its fused z-score ~3), and only
    # neighbours of at least the pool's median relevance: a lifted small-talk reply took
    # the place of another session's hit (measured in the module doc).
    neighbour_seed_min: float = 0.95
    neighbour_own_quantile: float = 0.5
    # Replies: each of the ``reply_seeds`` best hits of relevance >= ``reply_seed_min`` that
    # asks a question hands its relevance to the turn that answers it, and keeps
    # ``question_share`` of its own, so the answer comes first (lift_replies).
    reply_seeds: int = 10
    reply_seed_min: float = 0.9
    question_share: float = 0.99
    # Cluster expansion (rpc.short_term_mode=expand, memory.hierarchy.expand_in_clusters).
    expand_seeds: int = 3
    expand_per_seed: int = 2
    expand_share: float = 0.9
    # A turn longer than this (tokens) shows only its sentences that bear on the question
    # (memory.excerpts); 0: every turn whole.
    excerpt_over_tokens: int = 25


def zscores(values: npt.ArrayLike) -> FloatArray:
    """(x - mean) / std; all zeros when the values do not vary (nothing to tell apart)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x
    std = float(x.std())
    if std < 1e-12:
        return np.zeros_like(x)
    out: FloatArray = (x - float(x.mean())) / std
    return out


def fused_relevance(
    dense: npt.ArrayLike, lexical: npt.ArrayLike, dense_weight: float = 0.5
) -> FloatArray:
    """One relevance in (0, 1) per candidate from its dense and lexical scores.

    Each score is standardised over the candidate pool, mixed by weight, and squashed by the
    logistic function, which keeps the order and makes the result a valid ``relevance``.
    """
    mixed = dense_weight * zscores(dense) + (1.0 - dense_weight) * zscores(lexical)
    out: FloatArray = 1.0 / (1.0 + np.exp(-mixed))
    return out


def lift_neighbours(
    relevance: npt.ArrayLike,
    neighbours: Sequence[Sequence[int]],
    *,
    seeds: int,
    share: float,
    seed_min: float = 0.0,
    own_quantile: float = 0.0,
) -> FloatArray:
    """The ``seeds`` most relevant candidates lift their neighbours (``neighbours[i]``:
    indices of i's, e.g. the turns just before and after it in its session) to at least
    ``share`` of their own relevance: a reply carries the answer its question only names.

    A seed below ``seed_min`` lifts nothing (a weak best hit says little about its
    neighbours), and a neighbour whose own relevance is below the ``own_quantile`` of
    ``relevance`` stays where it is (a reply about something else is not the answer).
    Never lowers a relevance; returns a new array."""
    rel = np.asarray(relevance, dtype=np.float64)
    out = rel.copy()
    if rel.size == 0:
        return out
    floor = linear_quantile(rel, own_quantile) if own_quantile > 0 else -np.inf
    for seed in np.argsort(-rel, kind="stable")[: max(seeds, 0)]:
        if rel[int(seed)] < seed_min:
            break  # seeds come best first: none after this one qualifies either
        lifted = share * float(rel[int(seed)])
        for j in neighbours[int(seed)]:
            if rel[j] >= floor:
                out[j] = max(out[j], lifted)
    return out


def lift_replies(
    relevance: npt.ArrayLike,
    reply_of: Sequence[int],
    *,
    seeds: int,
    seed_min: float,
    question_share: float,
) -> FloatArray:
    """The ``seeds`` most relevant candidates that ask a question lift its answer.

    ``reply_of[i]``: the index of the turn that answers candidate i (the next turn of its
    session, said by someone else) when i asks a question, else -1. A question that matches
    the query names what the query asks about, and its reply holds the answer in other
    words: the reply takes the question's relevance (its own, if higher) and the question
    keeps ``question_share`` of its own, just below it. A seed below ``seed_min`` (seeds
    come best first) lifts nothing. Returns a new array."""
    rel = np.asarray(relevance, dtype=np.float64)
    out = rel.copy()
    for seed in np.argsort(-rel, kind="stable")[: max(seeds, 0)]:
        i = int(seed)
        if rel[i] < seed_min:
            break
        reply = reply_of[i]
        if reply < 0:
            continue
        out[reply] = max(out[reply], float(rel[i]))
        out[i] = min(out[i], question_share * float(rel[i]))
    return out


def linear_quantile(values: FloatArray, q: float) -> float:
    """``float(np.quantile(values, q))`` bit for bit (numpy's default "linear" method) for
    NaN-free ``values`` and ``q`` in [0, 1], from one partition: np.quantile's general
    machinery cost ~0.2 ms on the retrieval's 500 turns, every query."""
    n = values.size
    if n == 0:
        raise ValueError("the quantile of no values")
    virtual = (n - 1) * q  # numpy's virtual index, its interpolation below
    if virtual >= n - 1:
        return float(values.max())
    low = int(np.floor(virtual))
    part = np.partition(values, (low, low + 1))
    below, above = float(part[low]), float(part[low + 1])
    gamma = virtual - low
    diff = above - below
    return above - diff * (1 - gamma) if gamma >= 0.5 else below + diff * gamma


def strength_factor(strength: float, span: float = 0.25) -> float:
    """1 + span * tanh(ln strength): 1 at strength 1, never outside [1 - span, 1 + span].

    Strength grows x1.2 per use without bound; left raw, a memory used often beats every
    turn whatever the question (measured: strength 3-5 memories led every LoCoMo ranking).
    """
    if strength <= 0:
        return 1.0 - span
    return 1.0 + span * math.tanh(math.log(strength))


_LATEST = re.compile(
    r"\b(?:latest|newest|most recent(?:ly)?|recently|current(?:ly)?|right now|these days"
    r"|last time|any update|still)\b|最近|最新|目前|现在",
    re.IGNORECASE,
)


def asks_for_latest(query: str) -> bool:
    """Whether the query asks what is newest ("latest", "currently", "最近"), not "last year"."""
    return _LATEST.search(query) is not None


def recency_factor(ts: datetime, newest: datetime, half_life_days: float) -> float:
    """In [0.5, 1]: halves the distance to 0.5 every half-life before the newest candidate.

    Measured from the newest candidate, not the wall clock: the question is which of the
    user's own memories is latest, however long ago the user last spoke.
    """
    age_days = max(0.0, (newest - ts).total_seconds() / 86_400)
    return 0.5 + 0.5 * math.pow(0.5, age_days / max(half_life_days, 1e-9))


def recency_factors(ts: npt.ArrayLike, newest: float, half_life_days: float) -> FloatArray:
    """``recency_factor`` of many candidates at once; times in epoch seconds."""
    age_days = np.maximum(0.0, (newest - np.asarray(ts, dtype=np.float64)) / 86_400)
    return 0.5 + 0.5 * np.power(0.5, age_days / max(half_life_days, 1e-9))


def named_speakers(query: str, speakers: Sequence[str]) -> frozenset[str]:
    """Which of ``speakers`` the query names as a whole word (case-insensitive)."""
    return _named_speakers(query, tuple(speakers))


# A user may have thousands of speakers: a query is read once into its words, and a
# one-word name (nearly all of them) is a set lookup, so the work per speaker does not grow
# with the query (one regex per speaker made an 8,000-character query with 2,000 speakers
# take 0.4 s). A name with other characters ("Mary Ann", "O'Brien") is still matched by
# its own pattern, but only once all of its words are words of the query.
_WORD_RUN = re.compile(r"\w+")


@dataclass(frozen=True)
class _SpeakerIndex:
    one_word: dict[str, tuple[str, ...]]  # lowercased name -> the speakers spelled so
    other: tuple[tuple[str, str, frozenset[str], re.Pattern[str]], ...]  # name, lower, words


@lru_cache(maxsize=4096)
def _named_speakers(query: str, speakers: tuple[str, ...]) -> frozenset[str]:
    # Memoised: a retrieval asks twice (the RPC, then the scoring), and questions recur.
    lowered = query.lower()
    words = frozenset(_WORD_RUN.findall(lowered))
    index = _speaker_index(speakers)
    named = [name for word in words for name in index.one_word.get(word, ())]
    named.extend(
        name
        for name, lower, name_words, pattern in index.other
        if name_words <= words and lower in lowered and pattern.search(lowered)
    )
    return frozenset(named)


@lru_cache(maxsize=256)
def _speaker_index(speakers: tuple[str, ...]) -> _SpeakerIndex:
    """A user's speaker list, read once: one-word names by their lowercased word, the others
    with their words and whole-word pattern (``(?<!\\w)name(?!\\w)``, on the lowercased query)."""
    one_word: dict[str, tuple[str, ...]] = {}
    other = []
    for name in dict.fromkeys(speakers):
        if not name:
            continue
        lower = name.lower()
        if _WORD_RUN.fullmatch(lower):
            one_word[lower] = (*one_word.get(lower, ()), name)
        else:
            pattern = re.compile(rf"(?<!\w){re.escape(lower)}(?!\w)")
            other.append((name, lower, frozenset(_WORD_RUN.findall(lower)), pattern))
    return _SpeakerIndex(one_word, tuple(other))


def strip_names(query: str, names: AbstractSet[str]) -> str:
    """The query without the whole-word ``names`` (and a possessive 's): what to embed
    against turns whose vectors do not carry their speaker. The query itself if nothing
    would be left.

    Longest names first, as before; a run of one-word names is taken out in one pass over
    the query's words (a name each was a regex each over the whole query)."""
    out = query
    batch: set[str] = set()
    for name in sorted(names, key=len, reverse=True):
        if _WORD_RUN.fullmatch(name):
            batch.add(name.lower())
            continue
        out = _strip_words(out, batch)
        batch = set()
        out = re.sub(rf"(?<!\w){re.escape(name)}(?:'s)?(?!\w)", " ", out, flags=re.IGNORECASE)
    out = " ".join(_strip_words(out, batch).split())
    return out if re.search(r"\w", out) else query


def _strip_words(text: str, words: AbstractSet[str]) -> str:
    """``text`` with each whole word in ``words`` (lowercase), and an "'s" after it, made a
    space: what ``re.sub(r"(?<!\\w)word(?:'s)?(?!\\w)", " ", text, flags=re.I)`` does for each."""
    if not words:
        return text
    pieces: list[str] = []
    last = 0
    for m in _WORD_RUN.finditer(text):
        if m.start() < last or m.group().lower() not in words:
            continue  # not a name, or the "s" of an "'s" just taken out
        end = m.end()
        if text[end : end + 2].lower() == "'s" and not _WORD_RUN.match(text, end + 2):
            end += 2
        pieces += (text[last : m.start()], " ")
        last = end
    return "".join(pieces) + text[last:]


@dataclass(frozen=True)
class Candidate:
    """One thing that may go into the context: a consolidated memory or a raw turn.

    For a turn, ``id`` is its event id; for a memory, ``source_event_ids`` are the turns it
    was consolidated from (a turn a chosen memory already covers is not shown twice).
    """

    kind: Literal["memory", "turn"]
    id: str
    text: str
    relevance: float
    strength: float
    ts: datetime
    source_event_ids: tuple[str, ...] = ()
    boost: float = 1.0  # recency, when the query asks for the latest
    strength_span: float = 0.25
    # A memory's events whose words its text shows (its facts' sources); empty: every source.
    shows: tuple[str, ...] = ()
    # A turn's day (``turn_day``) and its line under it (``turn_line``): the context lists
    # a day's turns under one heading. Empty: ``text`` stands alone.
    heading: str = ""
    body: str = ""
    whole: bool = False  # never cut to an excerpt (a promise's line, its status in front)
    # A turn's line cut to what bears on the question (memory.excerpts): shown instead of
    # ``body`` when the whole turn no longer fits the budget. Empty: none.
    excerpt: str = ""
    cut: bool = False  # ``text`` is the turn's excerpt, not the whole turn

    @property
    def score(self) -> float:
        return self.relevance * strength_factor(self.strength, self.strength_span) * self.boost


def rank(
    candidates: Sequence[Candidate], top_k: int, *, exploration_share: float = 0.0
) -> list[tuple[Candidate, float]]:
    """The best ``top_k`` candidates by score, best first.

    Ties break by kind (memories first), newer first, then id, so the order never depends
    on the input order.

    Exploration: ``int(top_k * exploration_share)`` of the last places go to memories the
    score alone left out -- mid strength (factor within the middle half of its span), at
    least median relevance, newest first -- so a memory that has not been used yet can earn
    its boosts. Deterministic: the same candidates always give the same answer.
    """
    if top_k <= 0:
        return []
    ordered = sorted(
        candidates,
        key=lambda c: (-c.score, c.kind != "memory", -c.ts.timestamp(), c.id),
    )
    explore = min(int(top_k * exploration_share), top_k)
    top = _top(ordered, top_k - explore)
    if explore:
        taken = {c.id for c in top}
        relevances = sorted(c.relevance for c in ordered)
        median = relevances[len(relevances) // 2] if relevances else 0.0
        newcomers = sorted(
            (
                c
                for c in ordered
                if c.kind == "memory"
                and c.id not in taken
                and c.relevance >= median
                and abs(strength_factor(c.strength, c.strength_span) - 1.0) <= c.strength_span / 2
            ),
            key=lambda c: (-c.ts.timestamp(), c.id),
        )
        top = _top([*top, *newcomers[:explore], *ordered], top_k)
    return [(c, c.score) for c in top]


def _top(ordered: Sequence[Candidate], k: int) -> list[Candidate]:
    """The first ``k`` of ``ordered`` with distinct ids.

    A turn a memory was built from keeps its place: the memory shows a few facts, the turn
    its own words; ``assemble_context`` keeps a memory out that would only repeat turns.
    """
    unique: dict[str, Candidate] = {}
    for c in ordered:
        unique.setdefault(c.id, c)
    return list(unique.values())[:k]


def turn_text(t: StoredTurn) -> str:
    """``[3 Nov 2026] customer: text`` — the speaker if known, else role.

    The day, not the minute or the session: 8 tokens of prefix where the old
    ``[2026-11-03 14:05] customer (session s2):`` took 17, and a small budget holds about a
    fifth more turns (measured on LoCoMo-dev; the item's ``ts`` keeps the exact time).
    """
    return f"{turn_day(t)} {turn_line(t)}"


def split_turn_text(text: str) -> tuple[str, str]:
    """A ``turn_text``'s ``(turn_day, turn_line)``, without rendering them again (the day's
    ``strftime`` cost ~6 us a turn, every query)."""
    day, _, line = text.partition("] ")  # the day's bracket closes before any text
    return f"{day}]", line


def turn_day(t: StoredTurn) -> str:
    """``[3 Nov 2026]``: the heading a context lists the day's turns under."""
    return f"[{t.ts.day} {t.ts.strftime('%b %Y')}]"


def turn_line(t: StoredTurn) -> str:
    """``customer: text``: a turn's line under its day's heading, its relative times dated
    from the turn's own time ("yesterday (7 May)", ``memory.when``) so a reader need not count
    back from the heading. Rendered once a turn (``stores.turn_index`` keeps the text)."""
    return f"{t.speaker or t.role}: {annotate_times(_line(t.text), t.ts)}"


def assemble_context(
    ranked: Sequence[tuple[Candidate, float]],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    additive_lines: bool = False,
) -> tuple[str, list[tuple[Candidate, float]]]:
    """The layered context and the items it holds, never over ``budget_tokens``.

    Items are admitted best score first; one that does not fit is skipped and smaller ones
    are still tried. A memory must also earn its place (``_earns_place``): it enters only
    when it is at least as relevant as every turn its tokens would push out of the budget,
    and not when all it shows are turns already in the context. Every admission re-counts
    the whole rendered string (headers and separators included), so the bound holds for
    any counter. The layout reads from the top: memories (the current state) best first
    under ``## Memories``, then turns newest first under ``## Recent turns``, a day's turns
    under one heading (``Candidate.heading``).

    ``additive_lines``: the caller vouches that a text's count is the sum of its lines'
    counts (BERT's WordPiece: no token spans a newline). Then each item is counted once
    and the admissions are the same without re-rendering; the final context is still
    counted whole, and the plain path runs if that ever disagrees.
    """
    by_score = sorted(ranked, key=lambda item: -item[1])  # stable: keeps the ranking's ties
    costs = [count_tokens(c.text.strip()) for c, _ in by_score]
    if additive_lines:
        fast = _assemble_additive(by_score, costs, budget_tokens, count_tokens)
        if fast is not None:
            return fast
    chosen: list[tuple[Candidate, float]] = []
    context = ""
    used = 0  # the items' own tokens: what the earn-its-place test weighs
    for i, item in enumerate(by_score):
        if not _earns_place(by_score, costs, i, chosen, budget_tokens - used):
            continue
        for option in _options(item):
            trial = _render([*chosen, option])
            if count_tokens(trial) <= budget_tokens:
                chosen.append(option)
                context = trial
                used += costs[i] if option is item else count_tokens(option[0].text.strip())
                break
    return context, _layered(chosen)


def _options(item: tuple[Candidate, float]) -> list[tuple[Candidate, float]]:
    """What may be shown of an item, longest first: the whole, then its excerpt."""
    c, score = item
    if not c.excerpt:
        return [item]
    text = f"{c.heading} {c.excerpt}" if c.heading else c.excerpt
    shown = replace(c, text=text, body=c.excerpt if c.heading else "", excerpt="", cut=True)
    return [item, (shown, score)]


def _earns_place(
    by_score: Sequence[tuple[Candidate, float]],
    costs: Sequence[int],
    i: int,
    chosen: Sequence[tuple[Candidate, float]],
    room: int,
) -> bool:
    """Whether ``by_score[i]`` may enter next to ``chosen`` with ``room`` tokens left.

    A turn always may (it shows itself). A memory may not when every event it shows is a
    turn already chosen (it would repeat them), nor when a turn it would crowd out -- one
    that fits in ``room`` after the later turns, best first, but no longer once the memory
    took its tokens -- is more relevant (relevance x recency: strength never counts here,
    nor how many turns the memory was built from).
    """
    memory = by_score[i][0]
    if memory.kind != "memory":
        return True
    in_context = {c.id for c, _ in chosen if c.kind == "turn"}
    shows = set(memory.shows or memory.source_event_ids)
    if shows and shows <= in_context:
        return False
    later = [j for j in range(i + 1, len(by_score)) if by_score[j][0].kind == "turn"]
    without = _fill(later, costs, room)
    displaced = without - _fill(later, costs, room - costs[i])
    merit = memory.relevance * memory.boost
    return all(by_score[j][0].relevance * by_score[j][0].boost <= merit for j in displaced)


def _fill(rows: Sequence[int], costs: Sequence[int], room: int) -> set[int]:
    taken: set[int] = set()
    for j in rows:
        if costs[j] <= room:
            taken.add(j)
            room -= costs[j]
    return taken


def _assemble_additive(
    by_score: Sequence[tuple[Candidate, float]],
    costs: Sequence[int],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> tuple[str, list[tuple[Candidate, float]]] | None:
    headers = {"memory": count_tokens(MEMORIES_HEADER), "turn": count_tokens(TURNS_HEADER)}
    chosen: list[tuple[Candidate, float]] = []
    opened: set[str] = set()  # sections already in the context
    days: set[str] = set()  # day headings already in the context
    used = items = 0
    for i, item in enumerate(by_score):
        if not _earns_place(by_score, costs, i, chosen, budget_tokens - items):
            continue
        for option in _options(item):
            c = option[0]
            own = costs[i] if c is item[0] else count_tokens(c.text.strip())
            cost = own + (0 if c.kind in opened else headers[c.kind])
            day = c.heading if c.kind == "turn" else ""
            if day:
                # A day's turns share one heading line (checked below: the final count is
                # exact only while each day's turns sit together, as newest-first keeps them).
                cost += count_tokens(_body(c)) - own
                cost += 0 if day in days else count_tokens(day)
            if used + cost <= budget_tokens:
                chosen.append(option)
                opened.add(c.kind)
                if day:
                    days.add(day)
                used += cost
                items += own
                break
    context = _render(chosen)
    if count_tokens(context) != used:
        return None  # the counter is not additive after all: take the plain path
    return context, _layered(chosen)


def _layered(items: Sequence[tuple[Candidate, float]]) -> list[tuple[Candidate, float]]:
    """Memories best first, then turns newest first: a bot meets the current state first.
    But a memory is never read before a newer statement: when one chosen memory is older
    than the newest chosen turn, the turns come first (a memory's time is its newest line's,
    its ``Latest`` lines included)."""
    memories = sorted((i for i in items if i[0].kind == "memory"), key=lambda i: -i[1])
    turns = sorted(
        (i for i in items if i[0].kind == "turn"),
        key=lambda i: (-i[0].ts.timestamp(), i[0].id),
    )
    if turns and any(m.ts < turns[0][0].ts for m, _ in memories):
        return [*turns, *memories]
    return [*memories, *turns]


def _render(items: Sequence[tuple[Candidate, float]]) -> str:
    layered = _layered(items)
    memories = [c.text.strip() for c, _ in layered if c.kind == "memory"]
    turns: list[str] = []
    heading = ""  # the day heading the last turn line sits under
    for c, _ in layered:
        if c.kind != "turn":
            continue
        if c.heading:
            if c.heading != heading:
                turns.append(c.heading)
            turns.append(_body(c))
        else:
            turns.append(c.text.strip())
        heading = c.heading
    sections = []
    if memories:
        sections.append(MEMORIES_HEADER + "\n" + "\n\n".join(memories))
    if turns:
        sections.append("\n".join([TURNS_HEADER, *turns]))
    if layered and layered[0][0].kind == "turn":
        sections.reverse()
    return "\n\n".join(sections)


def _body(c: Candidate) -> str:
    """A turn's line under its day heading."""
    return (c.body or c.text).strip()


def _line(text: str) -> str:
    return " ".join(text.split())
