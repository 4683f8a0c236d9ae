"""How well ``memory.chatter`` recognises small talk (``python -m bench.chatter_lab``).

Customer-service streams (``bench.cs_stream``) of both halves of the paraphrase bank (A:
development, B: held out, only measured): recall on the small-talk turns, false positives
on every other turn (listed: a content turn called chatter loses a fact). LoCoMo-dev: the
share of all turns called chatter and the evidence turns among them (each one a lost
answer). Today's word-list test, ``memory.text.is_small_talk``, on the same turns.
Rates are per turn (a text said twice counts twice). About a minute on two cores.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench import locomo
from bench.cs_phrases import Half
from bench.cs_stream import generate
from memstream.memory.chatter import Prototypes, judge
from memstream.memory.text import is_small_talk
from memstream.memory.vectors import FloatArray
from memstream.settings import Settings
from memstream.stores.encoder import OnnxEncoder

CUSTOMERS = 60
SEED = 7
SHARED = Path(__file__).resolve().parents[2] / "shared" / "bench"
SHOW = 12  # failure examples listed per kind

Judge = Callable[[Sequence[str]], list[bool]]


def _rate(hits: int, total: int) -> str:
    return f"{hits / total:.3f} ({hits}/{total})" if total else "-"


def cs_half(half: Half, deciders: dict[str, Judge], show_misses: bool) -> None:
    stream = generate(CUSTOMERS, SEED, half)
    counts = Counter(str(e["text"]) for e in stream.events)
    texts = sorted(counts)
    talk = [t for t in texts if t in stream.small_talk]
    content = [t for t in texts if t not in stream.small_talk]
    n_talk, n_content = sum(counts[t] for t in talk), sum(counts[t] for t in content)
    print(f"\n== CS half {half}: {len(stream.events)} turns, {n_talk} small talk ==")
    for name, decide in deciders.items():
        said = dict(zip(texts, decide(texts), strict=True))
        hit = sum(counts[t] for t in talk if said[t])
        fps = [t for t in content if said[t]]
        fp = sum(counts[t] for t in fps)
        print(f"{name:>14}: recall {_rate(hit, n_talk)}  content FP {_rate(fp, n_content)}")
        for t in fps:
            print(f"{'':>16}FP x{counts[t]}: {t}")
        if show_misses and name == "chatter":
            misses = sorted((t for t in talk if not said[t]), key=lambda t: -counts[t])
            for t in misses[:SHOW]:
                print(f"{'':>16}missed x{counts[t]}: {t}")


def locomo_turns(deciders: dict[str, Judge]) -> None:
    if not locomo.available(SHARED):
        print(f"\n== LoCoMo-dev: not found under {SHARED}, skipped ==")
        return
    turns = [t for c in locomo.CONVERSATIONS for t in locomo.load_turns(SHARED, c)]
    questions = locomo.load_questions(SHARED, locomo.CONVERSATIONS)
    evidence = {locomo.event_id(q.conversation_id, e) for q in questions for e in q.evidence}
    texts = [locomo.event_text(t) for t in turns]
    n_ev = sum(t.event_id in evidence for t in turns)
    print(f"\n== LoCoMo-dev: {len(turns)} turns, {n_ev} evidence turns ==")
    for name, decide in deciders.items():
        said = decide(texts)
        lost = [
            x for t, x, s in zip(turns, texts, said, strict=True) if s and t.event_id in evidence
        ]
        print(
            f"{name:>14}: chatter share {_rate(sum(said), len(turns))}"
            f"  evidence turns called chatter {len(lost)}/{n_ev}"
        )
        for x in lost:
            print(f"{'':>16}LOST: {x[:110]}")
        if name == "chatter":
            called = [x for x, s in zip(texts, said, strict=True) if s]
            for x in called[:SHOW]:
                print(f"{'':>16}chatter: {x[:110]}")


def main(argv: Sequence[str]) -> None:
    started = time.perf_counter()
    encoder = OnnxEncoder.from_settings(Settings().encoder)
    vectors: dict[str, FloatArray] = {}

    def encode(texts: Sequence[str]) -> FloatArray:
        return encoder.encode(texts)

    prototypes = Prototypes.build(encode)

    def chatter(texts: Sequence[str]) -> list[bool]:
        fresh = [t for t in dict.fromkeys(texts) if t not in vectors]
        if fresh:
            vectors.update(zip(fresh, encode(fresh), strict=True))
        rows = np.stack([vectors[t] for t in texts]) if texts else np.zeros((0, encoder.dim))
        return [v.chatter for v in judge(texts, rows.astype(np.float32), prototypes)]

    deciders: dict[str, Judge] = {
        "chatter": chatter,
        "is_small_talk": lambda texts: [is_small_talk(t) for t in texts],
    }
    halves: list[Half] = [h for h in ("A", "B") if not argv or h in argv]
    for half in halves:
        # Misses are listed for A only: B is held out, read as a score, not as examples.
        cs_half(half, deciders, show_misses=half == "A")
    if not argv:
        locomo_turns(deciders)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
