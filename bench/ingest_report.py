"""The ingest benchmark's section of BENCHMARKS.md: tables, the per-stage profile, a reading.

Kept apart from ``bench/ingest.py`` so that module stays about measuring; this one only
turns what was measured into markdown, including *where the time goes* when the
pipeline falls short of the encoder.
"""

from __future__ import annotations

import os
from typing import Any

from bench.ingest_results import Measured, Params, StreamRun
from bench.scaleout import markdown as scale_markdown

TARGET_RATIO = 0.8


def _f(x: float) -> str:
    if x != x:  # NaN
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def markdown(p: Params, m: Measured) -> str:
    return "\n\n".join(
        (
            "One `memstream up` process (encode, memorize, consolidate with the offline "
            "extractive consolidator, the RPC, Qdrant Edge) against a Tansu broker and a Valkey "
            "started by the benchmark as their own processes; default settings (encode and "
            "memorize take what has arrived as soon as they are free, encoder batches of up to "
            f"{m.encoder['batch']}, one one-thread encoder run per core at once; consumer "
            "fetches wait 10 ms while the pipeline keeps up, "
            "100 ms idle or backlogged; 4 partitions). The reference is the bare ONNX encoder "
            "in the benchmark process on the same texts, in stream-order chunks of "
            f"{m.encoder['batch']} (a text twice in one call is encoded once, as in the "
            f"pipeline), at its best settings: {_candidates(m.encoder)}.",
            _throughput(m),
            _profile(m.streams[-1], m.encoder),
            _latency(m),
            _scale(m.scale),
        )
    )


def _candidates(enc: dict[str, Any]) -> str:
    tried = enc.get("candidates_per_s", {})
    rates = ", ".join(f"{name} {_f(rate)}/s" for name, rate in tried.items())
    return f"{enc.get('settings', 'default')} (timed on the first texts: {rates})"


def _throughput(m: Measured) -> str:
    enc = m.encoder
    lines = [
        "### Throughput (to settled: every event memorized, every trigger consolidated)",
        "",
        "| run | events | to memorized s | to settled s | events/s | triggers | LLM calls "
        "| encoder texts per event (encoded / cache hits) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| bare encoder, same texts ({enc.get('settings', 'default')}) | {enc['sentences']} "
        f"| | {_f(enc['seconds'])} "
        f"| {_f(enc['sentences_per_s'])} | | | 1 |",
    ]
    for s in m.streams:
        per_event = {k: v / s.events for k, v in s.encoder.items()} if s.events else {}
        lines.append(
            f"| pipeline, {s.name} | {s.events} | {_f(s.memorized_s)} | {_f(s.elapsed_s)} "
            f"| {_f(s.events_per_s)} | {s.triggers:.0f} | {s.llm_calls:.0f} "
            f"| {s.encoder_texts_per_event:.3f} ({per_event.get('encoded', 0.0):.3f} / "
            f"{per_event.get('cache_hits', 0.0):.3f}) |"
        )
    ratio = m.streams[-1].events_per_s / enc["sentences_per_s"]
    verdict = "met" if ratio >= TARGET_RATIO else "**missed** — see where the time goes below"
    lines += [
        "",
        f"Pipeline / encoder = **{ratio:.2f}** (target ≥ {TARGET_RATIO}): {verdict}.",
        "",
        "Encoder texts per event count every text the process's encoder was handed "
        "(`memstream_encoder_texts_total`: the turns, memorize's cluster descriptions, any "
        "queries; a memory's vector is its source turns' mean, not encoded); the bare "
        "encoder encodes one per event.",
    ]
    return "\n".join(lines)


def _profile(s: StreamRun, enc: dict[str, Any]) -> str:
    cores = os.cpu_count() or 1
    elapsed = s.elapsed_s
    encoder_alone = s.events / enc["sentences_per_s"]
    labels = {
        "encode": f"encode stage (per batch of {s.encode_batch_mean:.1f}: decode, ONNX, "
        "then serialize and send each embedding)",
        "memorize": "memorize stage (per batch: one Redis read, cluster and recurrence per "
        "event, one write per user)",
        "consolidate": "consolidate stage (batches of triggers)",
        "llm": "… of which consolidator calls",
    }
    lines = [
        f"### Where the time goes ({s.name}, {s.events} events, {_f(elapsed)} s to settled)",
        "",
        "Wall time inside each stage, from the process's own `memstream_stage_latency_seconds` "
        "histograms. Stages overlap (encoding runs in a thread while the event loop memorizes), "
        "so shares need not add up to 100%.",
        "",
        "| where | wall s | calls | ms per event | share of elapsed |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for stage, label in labels.items():
        st = s.stages[stage]
        lines.append(
            f"| {label} | {_f(st['sum_s'])} | {st['count']:.0f} "
            f"| {_f(1000 * st['sum_s'] / s.events)} | {100 * st['sum_s'] / elapsed:.0f}% |"
        )
    beyond = s.stages["encode"]["sum_s"] - encoder_alone
    lines += [
        f"| bare encoder on the same texts (reference) | {_f(encoder_alone)} | | "
        f"{_f(1000 * encoder_alone / s.events)} | {100 * encoder_alone / elapsed:.0f}% |",
        "| encode stage beyond the bare encoder (the same ONNX work sharing the cores "
        f"with the event loop; serializing and sending) | {_f(beyond)} | "
        f"| {_f(1000 * beyond / s.events)} "
        f"| {100 * beyond / elapsed:.0f}% |",
        "",
        f"CPU time of each process over the same run ({cores} cores = "
        f"{_f(cores * elapsed)} CPU-s available):",
        "",
        "| process | CPU s | CPU ms per event | cores busy on average |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, cpu in [*s.cpu_s.items(), ("all of them", sum(s.cpu_s.values()))]:
        lines.append(f"| {name} | {_f(cpu)} | {_f(1000 * cpu / s.events)} | {cpu / elapsed:.2f} |")
    lines += ["", _reading(s, enc, cores)]
    return "\n".join(lines)


def _reading(s: StreamRun, enc: dict[str, Any], cores: int) -> str:
    """Where the time goes, in CPU terms: the pipeline's CPU per event against the cores."""
    ratio = s.events_per_s / enc["sentences_per_s"]
    total_ms = 1000 * sum(s.cpu_s.values()) / s.events
    enc_ms = 1000 * enc["cpu_s"] / enc["sentences"]
    beyond_ms = 1000 * s.cpu_s["memstream"] / s.events - enc_ms
    others_ms = total_ms - 1000 * s.cpu_s["memstream"] / s.events
    cap = 1000 * cores / total_ms
    needed = 1000 * cores / (TARGET_RATIO * enc["sentences_per_s"])
    stages = {k: s.stages[k]["sum_s"] / s.elapsed_s for k in ("encode", "memorize", "consolidate")}
    busiest = max(stages, key=stages.__getitem__)
    machine = (
        f" The machine was {100 * enc['machine_busy']:.0f}% busy during the encoder reference "
        f"and {100 * s.machine_busy:.0f}% during this replay (other work on it included)."
        if "machine_busy" in enc
        else f" The machine was {100 * s.machine_busy:.0f}% busy during this replay (other "
        "work on it included)."
    )
    return (
        f"Reading: the target is {'met' if ratio >= TARGET_RATIO else 'missed'}. Per event, "
        f"the processes above spend {total_ms:.1f} CPU-ms: the encoder's own work is about "
        f"{enc_ms:.1f} (the bare encoder's CPU per sentence), memstream's other work "
        f"(memorize, consolidation, Kafka, JSON, the event loop) {beyond_ms:.1f}, and the "
        f"broker, Valkey and the publisher {others_ms:.1f}. On {cores} cores that caps the "
        f"pipeline at {cap:.0f} events/s; it reached {s.events_per_s:.0f}. To reach "
        f"{TARGET_RATIO} × the encoder, everything would have to fit in {needed:.1f} CPU-ms "
        f"per event, i.e. {max(needed - enc_ms, 0):.1f} beyond the encoder's. By wall time "
        f"the {busiest} stage is the busiest ({100 * stages[busiest]:.0f}% of the run): "
        "the stage the others queue behind." + machine
    )


def _latency(m: Measured) -> str:
    lat, enc = m.latency, m.encoder["single_ms"]
    alone = m.encoder.get("single_settings", m.encoder.get("settings", "default"))
    ms, post = lat["ms"], lat["post_ms"]
    return "\n".join(
        [
            "### Event → retrievable",
            "",
            f"{lat['sent']} single events posted to `POST /v1/events` at "
            f"{lat['rate_per_s']:.1f}/s (half the measured throughput), open loop; the clock "
            "runs from each event's scheduled send time until its turn is in Valkey (where "
            "the retrieval RPC reads short-term turns; told by Valkey's keyspace notifications, "
            f"not polled). {lat['arrived']} "
            f"arrived; a sample of those that state something (not greetings or thanks, "
            "which a context leaves out by design) asked back through `POST /v1/retrieve` by "
            f"its own text came back {lat['confirmed_by_retrieve']}.",
            "",
            "| | p50 ms | p95 ms | p99 ms |",
            "| --- | ---: | ---: | ---: |",
            f"| event → retrievable | {_f(ms['p50'])} | {_f(ms['p95'])} | {_f(ms['p99'])} |",
            f"| … of which the POST | {_f(post['p50'])} | {_f(post['p95'])} | {_f(post['p99'])} |",
            f"| bare encoder, one sentence ({alone}; reference) | {_f(enc['p50'])} "
            f"| {_f(enc['p95'])} "
            f"| {_f(enc['p99'])} |",
            "",
            *_hops(lat),
            _latency_reading(lat),
        ]
    )


# Each hop's share of the way, from memstream_event_age_seconds (age when a stage took an
# event and when it had handled it; from the record's timestamp, set as the POST published).
HOP_NAMES = (
    ("encode taken", "events topic: the hop and the wait for the encoder"),
    ("encode done", "encoded (and published)"),
    ("memorize taken", "encoded topic: the hop and the wait for memorize"),
    ("memorize done", "memorized: retrievable"),
)


def _hops(lat: dict[str, Any]) -> list[str]:
    hops = lat.get("hops")
    if not hops:
        return []
    lines = [
        "Where the time goes: each event's age since the POST published it, as the stages "
        "report it (`memstream_event_age_seconds`, quantiles interpolated in its buckets); "
        "the POST before it adds its own time (above).",
        "",
        "| event's age when … | mean ms | p50 ms | p95 ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key, name in HOP_NAMES:
        hop = hops[key]
        lines.append(f"| {name} | {_f(hop['mean'])} | {_f(hop['p50'])} | {_f(hop['p95'])} |")
    return [*lines, ""]


def _latency_reading(lat: dict[str, Any]) -> str:
    enc, mem = lat["stages"]["encode"], lat["stages"]["memorize"]
    per_batch = 1000 * enc["sum_s"] / max(enc["count"], 1)
    per_event = 1000 * mem["sum_s"] / max(mem["count"], 1)
    rest = lat["ms"]["p50"] - lat["post_ms"]["p50"] - per_batch - per_event
    return (
        f"Reading: at this load the encode stage ran batches of "
        f"{lat['encode_batch_mean']:.1f} events taking {per_batch:.0f} ms each (taken as they "
        f"arrive, not waited for) and memorize took {per_event:.0f} ms per batch. Of the "
        f"median {lat['ms']['p50']:.0f} ms, the POST "
        f"(publish with acks=all) is {lat['post_ms']['p50']:.0f} ms, one encode batch and one "
        f"memorize step {per_batch + per_event:.0f} ms, and the remaining {max(rest, 0):.0f} ms "
        "is time in the two topics (consumer fetches, up to 10 ms a hop while records flow) and "
        "queueing behind other work of the process's event loop (consolidation, the RPC)."
    )


def _scale(runs: list[dict[str, Any]]) -> str:
    return scale_markdown(runs)  # bench/scaleout.py measures the pinned runs and reads them
