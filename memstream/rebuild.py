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

The active generation is one Redis key, ``<base prefix>:generation:active``, naming one of
the records in the hash ``<base prefix>:generations`` (JSON: name, Redis prefix,
collection, encoder and thresholds). Every process resolves it when it starts; the RPC also
follows it while running (``GenerationFollower``), so a switch moves retrieval within a few
seconds, and a restart moves workers and consolidators (they then continue the
generation's consumer groups where the rebuild left them). ``memstream switch`` points the
key at another generation, or deletes it to go back to the first.

Interrupted, a rebuild is simply run again with the same name: the groups resume from
their committed offsets and every write is idempotent (processed-event marks,
deterministic trigger and memory ids), so it converges to the same state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memstream.replay import handled_events, registry_counts, unsettled_work
from memstream.settings import (
    ClusterSettings,
    EncoderSettings,
    RecurrenceSettings,
    Settings,
)
from stores.broker import bootstrap_servers
from stores.redis_client import sync_redis

if TYPE_CHECKING:
    from memstream.runtime import RunningProcess
    from memstream.wiring import Role
    from rpc.server import ApiDeps
    from stores.longterm import LongTermStore
    from stores.short_term import ShortTermState
    from stores.text_encoder import TextEncoder

log = logging.getLogger("memstream.rebuild")

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # goes into topic, group and collection names
S = TypeVar("S", bound=BaseModel)
REBUILD_ROLES: frozenset[Role] = frozenset({"process", "consolidate"})


class Generation(BaseModel):
    """One set of derived stores and the settings that derived them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    redis_prefix: str
    collection: str
    # Whole settings sections as plain JSON: a process of another version keeps the fields
    # it knows (see ``_section``) instead of rejecting the record during a rolling upgrade.
    encoder: dict[str, Any]
    cluster: dict[str, Any]
    recurrence: dict[str, Any]
    state: Literal["building", "ready"] = "building"
    log_end: dict[int, int] = {}  # events partition -> offset caught up with
    updated_at: datetime | None = None


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
        cluster=settings.cluster.model_dump(mode="json"),
        recurrence=settings.recurrence.model_dump(mode="json"),
    )


def _section(model: type[S], values: dict[str, Any], name: str) -> S:
    known = {k: v for k, v in values.items() if k in model.model_fields}
    if dropped := sorted(set(values) - set(known)):
        log.warning("generation %s: this version ignores %s settings %s", name, model, dropped)
    return model.model_validate(known)


def apply_generation(base: Settings, generation: Generation | None) -> Settings:
    """The settings a process uses for ``generation`` (``base`` itself for the first one)."""
    if generation is None:
        return base
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"generation": generation.name}),
            "redis": base.redis.model_copy(
                update={
                    "prefix": generation.redis_prefix,
                    "tombstone_prefix": base.redis.tombstone_prefix or base.redis.prefix,
                }
            ),
            "qdrant": base.qdrant.model_copy(update={"collection": generation.collection}),
            "encoder": _section(EncoderSettings, generation.encoder, generation.name),
            "cluster": _section(ClusterSettings, generation.cluster, generation.name),
            "recurrence": _section(RecurrenceSettings, generation.recurrence, generation.name),
        }
    )


# --- the records in Redis (small and rare: a synchronous client is enough) ------------


def _registry_key(base_prefix: str) -> str:
    return f"{base_prefix}:generations"


def _active_key(base_prefix: str) -> str:
    return f"{base_prefix}:generation:active"


def save_generation(redis_url: str, base_prefix: str, generation: Generation) -> None:
    stamped = generation.model_copy(update={"updated_at": datetime.now(UTC)})
    with sync_redis(redis_url) as r:
        r.hset(_registry_key(base_prefix), generation.name, stamped.model_dump_json())


def generations(redis_url: str, base_prefix: str) -> tuple[list[Generation], str]:
    """Every recorded generation by name, and the active one's name ("" = the first)."""
    with sync_redis(redis_url) as r:
        raw: dict[bytes, bytes] = r.hgetall(_registry_key(base_prefix))
        active: bytes | None = r.get(_active_key(base_prefix))
    found = sorted((Generation.model_validate_json(v) for v in raw.values()), key=lambda g: g.name)
    return found, (active or b"").decode()


def active_generation(redis_url: str, base_prefix: str) -> Generation | None:
    with sync_redis(redis_url) as r:
        name: bytes | None = r.get(_active_key(base_prefix))
        if not name:
            return None
        raw: bytes | None = r.hget(_registry_key(base_prefix), name)
    if raw is None:
        log.warning("active generation %r has no record; serving the first", name.decode())
        return None
    return Generation.model_validate_json(raw)


def activate(redis_url: str, base_prefix: str, name: str) -> None:
    """Make ``name`` the active generation ("" = back to the first); it must be ready."""
    with sync_redis(redis_url) as r:
        if not name:
            r.delete(_active_key(base_prefix))
            return
        raw: bytes | None = r.hget(_registry_key(base_prefix), name)
        if raw is None or Generation.model_validate_json(raw).state != "ready":
            raise ValueError(f"generation {name!r} is not built (run memstream rebuild {name})")
        r.set(_active_key(base_prefix), name)


def with_active_generation(base: Settings, redis_url: str) -> Settings:
    """What a starting process runs as: the active generation's settings, if any."""
    return apply_generation(base, active_generation(redis_url, base.redis.prefix))


# --- the rebuild ------------------------------------------------------------------------


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
    events = base.topic("events")
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

    code = run_process(
        apply_generation(base, generation), REBUILD_ROLES, job=catch_up, generations=False
    )
    if code or not caught_up:
        console.print(f"[red]rebuild of {generation.name} stopped before the end[/]; run it again")
        return code or 1
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
    topic = running.settings.topic("events")
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


# --- the RPC follows the active generation ---------------------------------------------


@dataclasses.dataclass
class GenerationFollower:
    """Points a running API's retriever at the active generation's stores when it changes.

    Stores opened for a generation stay open for the life of the process: switches are
    rare, and a switch back reuses them. A switch that fails (an Edge shard still locked
    by the rebuild that is exiting) is tried again at the next poll.
    """

    api: ApiDeps
    base: Settings
    redis_url: str
    current: Settings  # the generation the API serves now
    interval_s: float = 2.0
    _states: dict[str, ShortTermState] = dataclasses.field(default_factory=dict)
    _stores: dict[str, LongTermStore] = dataclasses.field(default_factory=dict)
    _encoders: dict[EncoderSettings, TextEncoder] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        retriever = self.api.retriever
        self._states[self.current.redis.prefix] = retriever.state
        self._stores[self.current.qdrant.collection] = retriever.longterm
        self._encoders[self.current.encoder] = retriever.queries.encoder

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:
                log.warning("generation switch failed, retrying: %r", exc)

    async def check(self) -> bool:
        """Switch if the active generation changed; True when it did."""
        generation = await asyncio.to_thread(
            active_generation, self.redis_url, self.base.redis.prefix
        )
        if (generation.name if generation else "") == self.current.kafka.generation:
            return False
        from memstream.wiring import open_state
        from rpc.retrieval import QueryEncoder
        from stores.encoder import OnnxEncoder
        from stores.longterm import open_longterm

        target = apply_generation(self.base, generation)
        encoder = self._encoders.get(target.encoder)
        if encoder is None:
            encoder = await asyncio.to_thread(OnnxEncoder.from_settings, target.encoder)
            self._encoders[target.encoder] = encoder
        store = self._stores.get(target.qdrant.collection)
        if store is None:
            store = open_longterm(target.qdrant, target.data_dir)
            try:
                await store.ensure_collection(encoder.dim)
            except Exception:
                await store.close()
                raise
            self._stores[target.qdrant.collection] = store
        state = self._states.get(target.redis.prefix)
        if state is None:
            state = self._states[target.redis.prefix] = open_state(target, self.redis_url)
        self.api.retriever = dataclasses.replace(
            self.api.retriever, queries=QueryEncoder(encoder), state=state, longterm=store
        )
        log.info(
            "serving generation %s",
            target.kafka.generation or "(first)",
            extra={"redis_prefix": target.redis.prefix, "collection": target.qdrant.collection},
        )
        self.current = target
        return True
