"""The resources benchmark's section of BENCHMARKS.md: cost and memory tables, a reading.

Kept apart from ``bench/resources.py``, which measures; this module only writes.
"""

from __future__ import annotations

from typing import Any

from bench.resources_params import Params
from memstream.settings import Settings
from memstream.streaming.params import recurrence_params

MIB = 1024 * 1024


def _f(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def markdown(p: Params, raw: dict[str, Any], mem0_note: str) -> str:
    mem = raw["memories"]
    replayed = sum(raw["runs"][n]["events"] for n in raw["tokens"])
    return "\n\n".join(
        (
            f"Before the process starts, {p.memories:,} long-term memories (shaped like "
            f"consolidation's output, over {p.memory_users} users, random unit vectors) are "
            f"bulk-loaded into its Qdrant Edge shard through `LongTermStore.upsert` "
            f"({_f(mem['per_s'])} memories/s), and {raw['bulk_turns']:,} short-term turns "
            f"(generated texts, over {p.turn_users} users) into Valkey through "
            f"`RedisState.apply`, memorize's own write path. Then one `memstream up` opens "
            f"them, {replayed:,} events are replayed through the whole pipeline — "
            f"{raw['bulk_turns'] + replayed:,} short-term turns in all — and "
            f"{p.retrievals} retrievals ask the users holding the bulk-loaded turns.",
            _cost(raw),
            _memory(p, raw, mem0_note),
        )
    )


def _cost(raw: dict[str, Any]) -> str:
    tokens, runs = raw["tokens"], raw["runs"]
    events = sum(t["events"] for t in tokens.values())
    eager_tokens = sum(t["eager_tokens"] for t in tokens.values())
    eager_per_call = eager_tokens / events
    lines = [
        "### Cost: consolidation calls and LLM tokens per 1,000 events",
        "",
        "| run | events | triggers | calls | calls per 1k events | tokens per call "
        "(prompt + completion) | tokens per 1k events |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| eager baseline: every event (reference) | {events} | | {events} | 1,000 "
        f"| {_f(eager_per_call)} | {_f(1000 * eager_per_call)} |",
    ]
    calls = tok = 0.0
    for name, t in tokens.items():
        run = runs[name]
        calls += run["llm_calls"]
        tok += t["memstream_tokens"]
        lines.append(
            f"| memstream, {name} | {t['events']} | {run['triggers']:.0f} | "
            f"{run['llm_calls']:.0f} | {_f(1000 * run['llm_calls'] / t['events'])} | "
            f"{_f(t['prompt_per_call'])} + {_f(t['completion_per_call'])} | "
            f"{_f(1000 * t['memstream_tokens'] / t['events'])} |"
        )
    outcomes = {
        o: sum(runs[n][f"consolidations_{o}"] for n in tokens)
        for o in ("created", "updated", "unchanged", "skipped")
    }
    saved = 1 - tok / eager_tokens if eager_tokens else float("nan")
    lines += [
        "",
        f"memstream: **{calls / events:.3f} calls per event** (target ≤ 0.1) and "
        f"{_f(1000 * tok / events)} tokens per 1,000 events, {100 * saved:.0f}% fewer tokens "
        f"than the eager baseline (RecMem reports up to 87% lower construction cost than "
        f"eager systems). Consolidation outcomes: "
        + ", ".join(f"{v:.0f} {k}" for k, v in outcomes.items())
        + ".",
        "",
        _how(eager_per_call, tok / calls if calls else 0.0),
    ]
    return "\n".join(lines)


def _parts(parts: dict[str, dict[str, float]]) -> list[str]:
    """memstream's resident memory split by kind of mapping, when started and at the end."""
    moments = list(parts)
    lines = [
        "| memstream's RSS, MiB | " + " | ".join(moments) + " |",
        "| --- |" + " ---: |" * len(moments),
    ]
    for kind in parts[moments[0]]:
        lines.append(f"| {kind} | " + " | ".join(_f(parts[m][kind]) for m in moments) + " |")
    return [*lines, ""]


def _how(eager_per_call: float, memstream_per_call: float) -> str:
    settings = Settings()
    # The engine's values where the settings leave a field to it (None in the section).
    r, max_turns = recurrence_params(settings.recurrence), settings.consolidation.max_turns
    return (
        "How tokens are counted (no model runs here; the default consolidator is the offline "
        "extractive one): with the encoder's WordPiece tokenizer, a memstream call's prompt "
        "is the messages `stores.llm.build_messages` sends — system rules + key + the memory "
        f"it updates + up to {max_turns} source turns — plus 4 tokens per message, and its "
        "completion is the memory's content as JSON; calls that changed nothing are costed "
        "at the mean of those seen on `memstream.consolidated`. The eager baseline makes one "
        "call per event: prompt = the same messages for that one turn, completion = the "
        "extractive content of that turn; it leaves out the related memories an eager system "
        "also sends, so it is a lower bound. Reading: the number of calls is set by "
        f"recurrence (an entity named in {r.entity_min_turns} turns, or {r.min_similar} "
        f"earlier turns above cosine {r.similarity}); each call carries the turns of its key "
        f"and the memory it updates, {memstream_per_call / max(eager_per_call, 1e-9):.1f}× "
        "an eager call's tokens, so the saving comes from making few calls."
    )


def _split(raw: dict[str, Any]) -> list[str]:
    at, top = raw.get("rss_at_peak_mib"), raw.get("rss_split_peak_mib")
    if not at or not top:
        return []
    return [
        f"At memstream's peak its RSS was {_f(at['anon'])} MiB anonymous memory (heap: "
        f"Python, onnxruntime, the in-RAM indexes) and {_f(at['file'])} MiB file-backed "
        "pages (the Edge shard's mmapped segments, libraries); over the run the anonymous "
        f"part peaked at {_f(top['anon'])} MiB, the file-backed one at {_f(top['file'])} MiB "
        "(sampled every 0.2 s from `/proc/PID/statm`).",
        "",
    ]


def _memory(p: Params, raw: dict[str, Any], mem0_note: str) -> str:
    peak, idle = raw["rss_peak_mib"], raw["rss_idle_mib"]
    names = {
        "memstream": "memstream (every role, one process)",
        "broker": "broker (Tansu, records in memory)",
        "valkey": "Valkey (short-term turns, state)",
    }
    lines = [
        "### Memory and disk",
        "",
        "| process | RSS when started, MiB | peak RSS, MiB |",
        "| --- | ---: | ---: |",
    ]
    for key, label in names.items():
        lines.append(f"| {label} | {_f(idle.get(key, 0.0))} | {_f(peak.get(key, 0.0))} |")
    turns = raw["bulk_turns"] + sum(raw["runs"][n]["events"] for n in raw["tokens"])
    mem = raw["memories"]
    ms = peak["memstream"]
    verdict = "within" if ms <= 600 else "**over**"
    lines += [
        "",
        f"memstream's peak is **{_f(ms)} MiB**, {verdict} the 600 MiB target, with "
        f"{p.memories:,} long-term memories and {turns:,} short-term turns; the broker and "
        "Valkey are reported apart. On disk the Edge shard takes "
        f"{mem['disk_bytes'] / MIB:.1f} MiB, **{_f(mem['bytes_per_memory'])} bytes per "
        f"memory** (payload + 384 float32 + indexes); Valkey holds "
        f"{raw['valkey_used_bytes'] / MIB:.1f} MiB, about "
        f"{_f(raw['valkey_used_bytes'] / max(turns, 1))} bytes per short-term turn (with its "
        "float16 embedding, indexes and per-user state). Retrievals over users with "
        f"~{raw['bulk_turns'] // max(p.turn_users, 1)} turns took "
        f"{_f(raw['runs']['retrievals']['p50_ms'])} ms at p50.",
        "",
        *_split(raw),
        *_parts(raw["rss_parts_mib"]),
        f"Reading: {_f(idle.get('memstream', 0.0))} MiB of the peak is there before the "
        "first event — Python with faust, FastAPI and pydantic, onnxruntime with the "
        "encoder, and the opened Edge shard; replaying, consolidating and retrieving add "
        f"{_f(ms - idle.get('memstream', 0.0))} MiB. Mapped data-file pages count in RSS but "
        f"are the kernel's to drop and re-read under memory pressure. {mem0_note}",
    ]
    return "\n".join(lines)
