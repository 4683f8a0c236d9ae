"""The retrieval benchmark's data: a long-term store of up to 1M memories, short-term turns,
query texts, and the references measured on the same vectors (numpy brute force, the Edge
store's own search, the bare encoder at its best settings with a brute force), and the
check that the machine is quiet before they are timed. mem0 is `bench/mem0_runner.py`.

Vectors are random unit vectors: a filtered exact search costs the same whatever they
hold, and 1M encoder calls would take hours here. Texts are realistic where their length
matters: the queries (encoded per request) and the memories' JSON (stored and parsed).
The store is loaded through `QdrantEdgeStore.upsert_bulk`; a full-size one is kept under
the output folder and reused while its parameters and the payload format are unchanged.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil  # type: ignore[import-untyped]  # no stubs in the venv

from bench.services import busy_since, cpu_seconds
from memstream.schemas import ConsolidatedMemory, StoredTurn
from memstream.schemas.memories import Fact, OpenAction, TimelineEntry
from memstream.settings import Settings
from memstream.stores.encoder import OnnxEncoder, default_runners
from memstream.stores.longterm import MEMORY_JSON_FIELD, memory_point_id
from memstream.stores.qdrant_edge_store import QdrantEdgeStore
from memstream.stores.redis_state import RedisState
from memstream.stores.short_term import UserUpdate

DIM = 384
COLLECTION_DIR = Path("qdrant") / Settings().qdrant.collection  # where `memstream serve` looks
FORMAT = f"compact-{MEMORY_JSON_FIELD}-v1"  # bump when the stored layout changes
FILLER_PER_USER = 1000
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
Vectors = npt.NDArray[np.float32]

_TEMPLATE = ConsolidatedMemory(
    memory_id=memory_point_id("t", "u", "k"),
    tenant_id="t",
    user_id="u",
    key="k",
    title="Delayed parcel and refund request",
    facts=[
        Fact(text="The parcel left the warehouse on 3 March and has not arrived.", ts=T0),
        Fact(text="The customer asked for a refund of the shipping fee.", attribute="refund"),
    ],
    status="waiting for the carrier's answer",
    timeline=[TimelineEntry(ts=T0, text="asked where the parcel is", event_id="e1")],
    open_actions=[OpenAction(text="call the customer back", due=T0 + timedelta(days=2))],
    keys=["k"],
    summary="Customer reported a late parcel and wants the shipping fee refunded.",
    created_at=T0,
    updated_at=T0,
    source_event_ids=["e1"],
)
_QUESTIONS = (
    "Where is my order A-{n}? It should have arrived {d} days ago.",
    "Can you check the refund for order A-{n}, I was promised it last week?",
    "I changed my address, will parcel A-{n} still reach me in {d} days?",
    "The headphones from order A-{n} stopped working after {d} days, what now?",
    "Did you cancel the subscription I asked about {d} days ago (ref A-{n})?",
)


def memory(tenant: str, user: str, i: int) -> ConsolidatedMemory:
    key = f"order:A-{10_000 + i}"
    return _TEMPLATE.model_copy(
        update={
            "memory_id": memory_point_id(tenant, user, key),
            "tenant_id": tenant,
            "user_id": user,
            "key": key,
            "keys": [key],
            "updated_at": T0 + timedelta(minutes=i),
            "source_event_ids": [f"{user}-e{(7 * i) % 600}", f"{user}-e{(7 * i + 3) % 600}"],
        }
    )


def unit_rows(rng: np.random.Generator, n: int) -> Vectors:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    rows: Vectors = x / np.linalg.norm(x, axis=1, keepdims=True)
    return rows


def queries(seed: int) -> Iterator[str]:
    """Endless distinct query texts (distinct: every one misses the RPC's query cache)."""
    rng = np.random.default_rng(seed)
    n = 0
    while True:
        n += 1
        template = _QUESTIONS[n % len(_QUESTIONS)]
        yield template.format(n=10_000 + int(rng.integers(0, 99_999)), d=n % 97 + 2)


@dataclass
class StoreInfo:
    path: Path  # the data dir `memstream serve` gets
    total: int
    users: dict[str, int]  # target user -> memories
    bulk_per_s: float
    bulk_s: float
    reused: bool


async def build_store(
    root: Path, tenant: str, users: dict[str, int], total: int, seed: int, *, reuse: bool
) -> tuple[StoreInfo, dict[str, Vectors]]:
    """The store (cached when `reuse`) and each target user's vectors, for brute force."""
    fingerprint = f"{FORMAT}-{total}-{'-'.join(f'{u}={n}' for u, n in users.items())}-{seed}"
    data_dir = root / fingerprint
    marker = data_dir / "complete.json"
    rng = np.random.default_rng(seed)
    mine = {user: unit_rows(rng, n) for user, n in users.items()}
    if reuse and marker.exists():
        info = json.loads(marker.read_text())
        return StoreInfo(data_dir, total, users, info["bulk_per_s"], info["bulk_s"], True), mine
    if data_dir.exists():
        shutil.rmtree(data_dir)
    store = QdrantEdgeStore(data_dir / COLLECTION_DIR)
    await store.ensure_collection(DIM)
    elapsed = 0.0
    for user, n in users.items():
        elapsed += await _timed_bulk(store, [memory(tenant, user, i) for i in range(n)], mine[user])
    filler = total - sum(users.values())
    for start in range(0, filler, 50_000):  # bounded memory: 50k memories at a time
        count = min(50_000, filler - start)
        batch = [
            memory(f"t{(j // FILLER_PER_USER) % 10}", f"fill-{j // FILLER_PER_USER}", j)
            for j in range(start, start + count)
        ]
        elapsed += await _timed_bulk(store, batch, unit_rows(rng, count))
    await store.close()
    info = StoreInfo(data_dir, total, users, total / elapsed, elapsed, False)
    marker.write_text(json.dumps({k: v for k, v in asdict(info).items() if k != "path"}))
    return info, mine


async def _timed_bulk(
    store: QdrantEdgeStore, memories: list[ConsolidatedMemory], vectors: Vectors
) -> float:
    started = time.perf_counter()
    await store.upsert_bulk(memories, vectors)  # optimizes what it wrote, and flushes
    return time.perf_counter() - started


async def upsert_rate(root: Path, tenant: str, seed: int, n: int) -> dict[str, float]:
    """Memories/s through the ordinary `upsert`, batches of 16 as the consolidator writes."""
    store = QdrantEdgeStore(root / f"upsert-{seed}")
    await store.ensure_collection(DIM)
    memories = [memory(tenant, "ups", i) for i in range(n)]
    items = list(zip(memories, unit_rows(rng(seed), n), strict=True))
    started = time.perf_counter()
    for k in range(0, n, 16):
        await store.upsert(items[k : k + 16])
    elapsed = time.perf_counter() - started
    await store.close()
    shutil.rmtree(root / f"upsert-{seed}")
    return {"memories": n, "per_s": n / elapsed}


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed + 1)


async def direct_search(path: Path, tenant: str, user: str, n: int, seed: int) -> dict[str, float]:
    """`QdrantEdgeStore.search` in-process (no RPC), top-8, over `n` random queries
    (after as many unrecorded ones: the first touch of a freshly opened shard pages in)."""
    store = QdrantEdgeStore(path / COLLECTION_DIR)
    for q in unit_rows(rng(seed + 1), n):
        await store.search(tenant, user, q, 8)
    lat = []
    for q in unit_rows(rng(seed), n):
        started = time.perf_counter()
        await store.search(tenant, user, q, 8)
        lat.append((time.perf_counter() - started) * 1000)
    await store.close()
    return summary(lat)


def brute_force(vectors: Vectors, n: int, seed: int, k: int = 8) -> dict[str, float]:
    """A flat numpy top-k over one user's vectors: the floor any search is compared with."""
    lat = []
    for q in unit_rows(rng(seed + 1), 10):  # unrecorded: the first calls page code in
        np.argpartition(-(vectors @ q), k)[:k]
    for q in unit_rows(rng(seed), n):
        started = time.perf_counter()
        scores = vectors @ q
        top = np.argpartition(-scores, k)[:k]
        top[np.argsort(-scores[top])]
        lat.append((time.perf_counter() - started) * 1000)
    return summary(lat)


def encode_and_rank(
    encoder: OnnxEncoder, vectors: Vectors, text: str, k: int = 8
) -> npt.NDArray[np.intp]:
    """The reference's whole retrieval for one query: encode it, numpy top-k, best first."""
    q = encoder.encode([text], query=True)[0]
    scores = vectors @ q
    top = np.argpartition(-scores, k)[:k]
    ranked: npt.NDArray[np.intp] = top[np.argsort(-scores[top])]
    return ranked


def encode_and_search(
    encoder: OnnxEncoder, vectors: Vectors, texts: list[str], k: int = 8
) -> dict[str, Any]:
    """The reference pipeline back to back: encode one query, numpy top-k; one at a time,
    in-process, each starting when the last is done (no arrivals, so no queue)."""
    encode, total = [], []
    for text in texts:
        started = time.perf_counter()
        q = encoder.encode([text], query=True)[0]
        encoded = time.perf_counter()
        scores = vectors @ q
        top = np.argpartition(-scores, k)[:k]
        top[np.argsort(-scores[top])]
        total.append((time.perf_counter() - started) * 1000)
        encode.append((encoded - started) * 1000)
    return {"total": summary(total), "encode": summary(encode), "total_ms": total}


# The bare encoder's candidates for one query at a time: intra-op threads (spinning off,
# no cache: bench/ingest.py measured spinning only burning CPU here). The fastest wins.
BARE_THREADS = (1, 2)


def bare_encoder(texts: list[str]) -> tuple[OnnxEncoder, str, dict[str, float]]:
    """The bare encoder at its best settings for one-sentence calls, picked by p50 over
    `texts` (after a few unrecorded calls each); its settings in words; each candidate's p50."""
    picked: dict[str, float] = {}
    best: tuple[float, int] = (float("inf"), 1)
    for threads in BARE_THREADS:
        candidate = _bare(threads)
        for text in texts[:5]:
            candidate.encode([text])
        lat = []
        for text in texts:
            started = time.perf_counter()
            candidate.encode([text])
            lat.append((time.perf_counter() - started) * 1000)
        p50 = float(np.percentile(lat, 50))
        picked[f"{threads} thread{'s' if threads > 1 else ''}"] = p50
        best = min(best, (p50, threads))
        del candidate
    threads = best[1]
    return _bare(threads), f"{threads} thread{'s' if threads > 1 else ''}, no spinning", picked


def _bare(threads: int, runners: int = 1) -> OnnxEncoder:
    settings = Settings().encoder.model_copy(
        # nice 0: the reference's own thread runs it, at the benchmark's priority
        update={
            "runners": runners,
            "threads": threads,
            "cache_size": 0,
            "spinning": False,
            "nice": 0,
        }
    )
    return OnnxEncoder.from_settings(settings)


def bare_pool() -> OnnxEncoder:
    """The bare encoder as the RPC runs it by default: one one-thread run per core at once
    (a reference with as many workers serves that many queries side by side)."""
    return _bare(1, runners=default_runners())


def wait_quiet(max_s: float, window_s: float = 0.5) -> dict[str, float]:
    """Wait (at most `max_s`) until this process and its children are idle and the machine
    has settled; what the last window saw. The benchmark's own store work is over by
    construction (the server, broker and Valkey are stopped, every store it wrote is
    closed); this checks it, and says how busy the rest of a shared machine was."""
    me = psutil.Process()
    started = time.perf_counter()
    while True:
        procs = [me, *me.children(recursive=True)]
        cpu0, machine0 = _cpu(procs), psutil.cpu_times()
        time.sleep(window_s)
        own = (_cpu(procs) - cpu0) / window_s
        busy = busy_since(machine0)
        waited = time.perf_counter() - started
        if (own < QUIET_OWN_CORES and busy < QUIET_MACHINE_BUSY) or waited >= max_s:
            return {"waited_s": waited, "own_cores": own, "machine_busy": busy}


QUIET_OWN_CORES = 0.05  # this process: below 5% of a core, nothing of ours runs
QUIET_MACHINE_BUSY = 0.5  # the whole machine: less than half its cores in use


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            total += cpu_seconds(proc)
        except psutil.NoSuchProcess:
            continue  # gone between the listing and the read: it is quiet now
    return total


async def seed_turns(state: RedisState, tenant: str, user: str, n: int, seed: int) -> None:
    """`n` short-term turns for `user`, written as `memorize` writes them."""
    for i, vector in enumerate(unit_rows(rng(seed), n)):
        turn = StoredTurn(
            event_id=f"{user}-e{i}",
            session_id=f"s{i // 20}",
            role="user" if i % 2 else "assistant",
            text=f"About order A-{10_000 + i % 300}: the parcel is late, please check it.",
            ts=T0 + timedelta(minutes=i),
        )
        await state.apply(tenant, user, UserUpdate(turn.event_id, turn, vector))


def summary(values_ms: list[float]) -> dict[str, float]:
    a = np.asarray(values_ms, dtype=float)
    if a.size == 0:
        return {"n": 0}
    return {
        "n": float(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }
