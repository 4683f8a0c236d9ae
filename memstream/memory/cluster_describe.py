"""Extractive cluster descriptions: the words that set a cluster apart from the user's others.

Each member keeps a few content words (``terms_of`` its text, taken when it is memorized), so
a description needs no text read back from storage. A word scores its count in the cluster
times its inverse cluster frequency over the user's clusters (tf-idf with clusters as
documents): words every topic shares ("order", "help") sink, the topic's own rise. They are
computed at ingest, so no LLM is asked for them (the LLM works only in consolidation).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from memstream.memory.cluster_state import Cluster
from memstream.memory.text import text_memo

MAX_TERMS_PER_MEMORY = 8

_WORD = re.compile(r"[a-z][a-z0-9'\-]{2,}")
# Function words and chat filler: they say nothing about what a topic is.
_STOP_WORDS = """
    the and for are but not you your yours with this that these those have has had was were
    will would could should can cannot can't don't didn't doesn't isn't wasn't won't i'm i've
    it's that's there's what's let's you're we're they're from into onto about above after
    again against all also any because been before being below between both each few further
    here how its just more most other our ours out over own same she her his him them they
    their then there too under until very what when where which while who whom why yes yet
    okay hello thanks thank please sure great good just like know think want need get got
    one two some such only than much many well still even really maybe today now did does
    doing done our ourselves himself herself itself themselves myself yourself hey hi bye
"""
_STOP = frozenset(_STOP_WORDS.split())


@text_memo  # memorize reads an event's terms twice: ``vectors_needed``, then ``step``
def terms_of(text: str, limit: int = MAX_TERMS_PER_MEMORY) -> tuple[str, ...]:
    """Up to ``limit`` distinct content words of a text, in order of first appearance."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        word = word.strip("'-")
        if len(word) >= 3 and word not in _STOP and not word.isdigit():
            seen.setdefault(word, None)
            if len(seen) >= limit:
                break
    return tuple(seen)


def document_frequency(clusters: Sequence[Cluster]) -> Counter[str]:
    df: Counter[str] = Counter()
    for c in clusters:
        df.update(c.term_counts.keys())
    return df


def keywords(cluster: Cluster, df: Counter[str], n_clusters: int, k: int) -> str:
    """The ``k`` most distinctive words of ``cluster`` (ties alphabetical), space-separated."""
    scored = [
        (count * math.log((1.0 + n_clusters) / (1.0 + df.get(term, 0))) + 1e-6 * count, term)
        for term, count in cluster.term_counts.items()
    ]
    scored.sort(key=lambda st: (-st[0], st[1]))
    # A word every cluster shares describes none of them (unless it is all there is).
    distinctive = [term for score, term in scored if score > 1e-3] or [t for _, t in scored]
    return " ".join(distinctive[:k])
