"""``memstream rebuild``: re-derive every store from ``memstream.events``, then switch to it.

Kafka is the log of record, so the derived stores (Redis short-term state and clusters,
Qdrant long-term memories) can be rebuilt whenever their settings change: another encoder,
other thresholds. A rebuild builds a new **generation** beside the one serving now:

- its own Redis prefix and Qdrant collection (``<prefix>.<name>``, ``<collection>_<name>``
  unless given), its own derived topics (``<topic prefix>.<name>.encoded`` ...) and its own
  consumer groups (``memstream-<name>``), so it never disturbs the live pipeline;
- it reads ``memstream.events`` from the first record with those fresh groups, runs the same
  processors and consolidator as a live process, and stops once it has caught up with the
  log as it was when the rebuild started (the end is found by reading the log, because
  Tansu's high-water answers are wrong for multi-record batches; progress is the group's
  committed offsets);
- then it records the generation in Redis and, unless told not to, makes it **active**.

The records, the active generation and how processes follow it are in
``memstream.generations``.

Interrupted, a rebuild is simply run again with the same name: the groups resume from
their committed offsets and every write is idempotent (processed-event marks,
deterministic trigger and memory ids), so it converges to the same state.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memstream.generations import Generation, activate, apply_generation, save_generation
from memstream.ops.replay import handled_events, registry_counts, unsettled_work
from memstream.settings import Settings
from memstream.streaming.broker import bootstrap_servers
from memstream.streaming.params import cluster_params, recurrence_params, written_out

if TYPE_CHECKING:
    from memstream.roles import Role
    from memstream.runtime import RunningProcess

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # goes into topic, group and collection names
REBUILD_ROLES: frozenset[Role] = frozenset({"process", "consolidate"})


def plan_generation(
    settings: Settings, name: str, *, redis_prefix: str | None = None, collection: str | None = None
) -> Generation:
    """The generation ``name`` with the derived-store settings of ``settings``."""
    if not NAME.match(name) or name == "first":  # "first" names the original generation
        raise ValueError(f"generation name {name!r}: lower-case letters, digits and '-', ≤ 32")
    return Generation(
        name=name,
        redis_prefix=redis_prefix or f"{settings.redis.prefix}.{name}",
        collection=collection or f"{settings.qdrant.collection}_{name.replace('-', '_')}",
        encoder=settings.encoder.model_dump(mode="json"),
        cluster=written_out(settings.cluster, cluster_params(settings.cluster)).model_dump(
            mode="json"
        ),
        recurrence=written_out(
            settings.recurrence, recurrence_params(settings.recurrence)
        ).model_dump(mode="json"),
    )


# --- the rebuild ------------------------------------------------------------------------


def rebuild_dlq_topic(base: Settings, generation: Generation) -> str:
    """Where a rebuild's processors send dead letters: re-reading the log dead-letters its
    invalid events a second time, which must not land in the shared topic operators watch."""
    return f"{base.kafka.topic_prefix}.{generation.name}.rebuild-dlq"


async def log_end(broker_url: str, topic: str, *, idle_s: float = 1.5) -> dict[int, int]:
    """Per partition, the offset after the last record of ``topic``, found by reading it.

    Reads from the first record with no consumer group until nothing has come for
    ``idle_s``, or, on a busy log, until a partition reaches records stamped after the
    call began (those belong to the live pipeline's future, not to the rebuild's target).
    Slower than asking for high-water marks, but right on every broker.
    """
    began_ms = time.time() * 1000
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(broker_url),
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        # Kafka answers a metadata request for no topic with none (Tansu with all): ask for
        # this one, so the client's metadata holds its partitions.
        if topic in await consumer.topics():
            await consumer._client.add_topic(topic)
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise SystemExit(f"topic {topic} does not exist: nothing to rebuild from")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = {tp.partition: 0 for tp in tps}
        reading = set(tps)
        last_data = time.monotonic()
        while reading and time.monotonic() - last_data < idle_s:
            batch = await consumer.getmany(*reading, timeout_ms=200, max_records=10_000)
            for tp, records in batch.items():
                for record in records:
                    if record.timestamp >= began_ms:
                        reading.discard(tp)
                        consumer.pause(tp)
                        break
                    ends[tp.partition] = record.offset + 1
                    last_data = time.monotonic()
        return ends
    finally:
        await consumer.stop()


def run_rebuild(
    base: Settings, generation: Generation, *, switch: bool, console: Console | None = None
) -> int:
    """Build ``generation`` from the whole log; make it active if ``switch``. Exit code."""
    from memstream.runtime import run_process  # pulls in faust

    console = console or Console()
    if not base.kafka.broker or not base.redis.url:
        raise SystemExit("memstream rebuild needs MEMSTREAM_KAFKA__BROKER and MEMSTREAM_REDIS__URL")
    if base.kafka.generation:
        raise SystemExit("MEMSTREAM_KAFKA__GENERATION is set: rebuild from the base settings")
    events = base.kafka.topic("events")
    ends = asyncio.run(log_end(base.kafka.broker, events))
    console.print(
        f"rebuilding generation [bold]{generation.name}[/] from {sum(ends.values())} offsets of "
        f"{events}: redis prefix {generation.redis_prefix}, collection {generation.collection}"
    )
    building = generation.model_copy(update={"state": "building", "log_end": ends})
    save_generation(base.redis.url, base.redis.prefix, building)
    caught_up: list[bool] = []

    async def catch_up(running: RunningProcess) -> int:
        await _follow_progress(running, ends, console)
        caught_up.append(True)
        return 0

    rebuilding = apply_generation(base, generation)
    dead_letters = rebuild_dlq_topic(base, generation)
    rebuilding = rebuilding.model_copy(
        update={"kafka": rebuilding.kafka.model_copy(update={"dlq_topic": dead_letters})}
    )
    code = run_process(rebuilding, REBUILD_ROLES, job=catch_up, generations=False)
    if code or not caught_up:
        console.print(f"[red]rebuild of {generation.name} stopped before the end[/]; run it again")
        return code or 1
    console.print(
        f"the rebuild's dead letters (the log's invalid events again) are in {dead_letters}"
    )
    ready = building.model_copy(update={"state": "ready"})
    save_generation(base.redis.url, base.redis.prefix, ready)
    if switch:
        activate(base.redis.url, base.redis.prefix, generation.name)
        console.print(f"[green]generation {generation.name} is active[/]: the RPC follows it now")
    else:
        console.print(f"generation {generation.name} is ready: memstream switch {generation.name}")
    return 0


async def _follow_progress(
    running: RunningProcess, ends: dict[int, int], console: Console, *, quiet_s: float = 1.5
) -> None:
    """Returns once the log is read up to ``ends`` and every stage has settled."""
    from faust.types import TP

    app, count = running.app, registry_counts(running.deps.metrics.registry)
    topic = running.settings.kafka.topic("events")
    columns = (TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as bar:
        read = bar.add_task("events read (offsets)", total=sum(ends.values()))
        memorized = bar.add_task("events memorized", total=0)
        consolidated = bar.add_task("triggers consolidated", total=0)
        last: tuple[float, ...] = ()
        changed = time.monotonic()
        while True:
            committed: dict[Any, int | None] = getattr(app.consumer, "_committed_offset", {})
            at = {p: min(committed.get(TP(topic, p)) or 0, end) for p, end in ends.items()}
            encoded = count("memstream_events_total", stage="encode")  # ok and dead letters
            handled = handled_events(count)
            triggers = count("memstream_triggers_total")
            unsettled = unsettled_work(count)
            bar.update(read, completed=sum(at.values()))
            bar.update(memorized, completed=handled, total=max(encoded, handled))
            bar.update(consolidated, completed=triggers - max(unsettled, 0), total=triggers)
            now = (sum(at.values()), handled, unsettled)
            if now != last:
                last, changed = now, time.monotonic()
            if (
                at == ends
                and handled >= encoded
                and unsettled <= 0
                and time.monotonic() - changed >= quiet_s
            ):
                return
            await asyncio.sleep(0.25)
