"""The broker: the faust app and its topics, built from settings, and the RPC's producer.

No module-level app anywhere: ``create_app`` builds one per process (``memstream.wiring``).
Every stage reaches the broker through here, so the processors (``streams/``), the workers
(``workers/``) and the RPC (``rpc/``) share the plumbing without importing each other.

faust hard-codes ``fetch_max_wait_ms=1500``. Kafka answers a fetch as soon as data arrives,
but Tansu (the embedded broker) holds every empty fetch for the full wait, which adds up to
1.5 s per hop — two hops from a bot's event to a retrievable turn. ``ShortFetchTransport``
makes the wait a setting, short while the pipeline keeps up with its load and longer once
the consumer is idle or a stage is backlogged: each hop of a pipeline that keeps up is fast
on either broker, and an idle one sends a few small requests a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import aiokafka
import faust
from aiokafka import AIOKafkaProducer
from aiokafka.conn import CloseReason
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import EventT, TransportT

from memstream.schemas import TOPICS
from memstream.settings import KafkaSettings

log = logging.getLogger("memstream.streams")

# -- the consumer transport ---------------------------------------------------------------


# The apps whose latency-bound stages (``take_ready``) have a full batch waiting: events
# queue there anyway, so a short fetch wait would buy nothing (read by the consumer thread).
_BACKLOGGED: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


def backlogged(app: Any) -> bool:
    """Whether a ``take_ready`` stage of ``app`` has a full batch waiting for its consumer."""
    return app is not None and bool(_BACKLOGGED.get(app))


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Fetches wait ``fetch_max_wait_ms`` while records flow and no stage is backlogged,
    else ``fetch_idle_wait_ms``: idle (no records for ``IDLE_AFTER_S``) or backlogged (a
    stage's next batch already full).

    Each empty fetch costs the consumer thread and the broker ~1 ms here, one per wait:
    10 ms all the time cost an idle stack ~0.15 core, and a full-load replay (the consumer
    waiting on the encode stage most of the time) 2-4 CPU-ms per event (issue 14). So the
    wait is short only when it decides the latency: a pipeline keeping up with its load.
    The first event after a quiet spell waits at most the idle wait at its first hop.
    """

    fetch_max_wait_ms: ClassVar[int] = 10
    fetch_idle_wait_ms: ClassVar[int] = 100
    IDLE_AFTER_S: ClassVar[float] = 1.0
    _records_at: float = 0.0

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when the consumer starts (pinned aiokafka==0.14.0).
        assert hasattr(consumer, "_fetch_max_wait_ms"), "aiokafka changed: revisit fetch wait"
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms
        return consumer

    async def _fetch_records(
        self,
        consumer: aiokafka.AIOKafkaConsumer,
        active_partitions: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - faust's signature, overridden
        max_records: int | None = None,
    ) -> Any:
        records = await super()._fetch_records(
            consumer, active_partitions, timeout=timeout, max_records=max_records
        )
        now = time.monotonic()
        if records:
            self._records_at = now
        idle = now - self._records_at > self.IDLE_AFTER_S or backlogged(getattr(self, "app", None))
        # The fetcher builds each request from this (aiokafka 0.14's Fetcher): set here,
        # in the consumer's thread, before the fetch this consumption wakes is sent.
        fetcher = getattr(consumer, "_fetcher", None)
        if fetcher is not None:
            fetcher._fetch_max_wait_ms = self.fetch_idle_wait_ms if idle else self.fetch_max_wait_ms
        return records


class ShortFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


# -- the producer ---------------------------------------------------------------------------

# How long the producer waits for a metadata answer before it gives the connections up. The
# producer's request timeout is faust's 20 minutes (it is also how long an undelivered batch
# is retried), so a broker that is connected but answers nothing (SIGSTOP here: 6 of 6 sends
# to new topics hung) would hold every send that needs metadata for 20 minutes. Kafka's Java
# client closes a connection whose request timed out (request.timeout.ms, 30 s); so does this.
METADATA_TIMEOUT_S = 30.0


def bound_metadata_updates(client: Any, timeout_s: float = METADATA_TIMEOUT_S) -> None:
    """Make ``client`` (an ``aiokafka.AIOKafkaClient``) give up a metadata update after
    ``timeout_s``: its connections are closed (their pending requests fail and are retried
    on fresh ones) and the update reports failure, so the next one starts over."""
    update = client._metadata_update  # aiokafka's own, pinned; no public hook exists

    async def bounded(cluster: Any, topics: Any) -> bool:
        try:
            return bool(await asyncio.wait_for(update(cluster, topics), timeout_s))
        except TimeoutError:
            log.warning(
                "no metadata answer from the broker in %.0f s: reconnecting the producer",
                timeout_s,
            )
            for conn in list(client._conns.values()):
                conn.close(reason=CloseReason.CONNECTION_TIMEOUT)
            return False

    client._metadata_update = bounded


# How long a partition may hold batches with no leader known before the producer says so.
# Leader elections take well under a second on a healthy cluster; a send waits on them
# silently, so a partition whose leader this client cannot learn would otherwise show only
# as a stage that stopped producing.
LEADERLESS_WARN_S = 20.0


def warn_leaderless(
    client: Any,
    waiting: Callable[[], Sequence[aiokafka.TopicPartition]],
    after_s: float = LEADERLESS_WARN_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """After each metadata update of ``client``, log once per episode every partition in
    ``waiting`` (those with batches to send) that has had no known leader for ``after_s``:
    what this client's metadata says of its topic, and the brokers it knows."""
    update = client._metadata_update
    since: dict[aiokafka.TopicPartition, float] = {}  # inf once warned

    async def watched(cluster: Any, topics: Any) -> bool:
        updated = bool(await update(cluster, topics))
        now = clock()
        leaderless = {tp for tp in waiting() if cluster.leader_for_partition(tp) in (None, -1)}
        for tp in [tp for tp in since if tp not in leaderless]:
            del since[tp]
        for tp in sorted(leaderless):
            first = since.setdefault(tp, now)
            if now - first >= after_s:
                since[tp] = float("inf")
                parts = sorted(cluster.partitions_for_topic(tp.topic) or ())
                leaders = {
                    p: cluster.leader_for_partition(aiokafka.TopicPartition(tp.topic, p))
                    for p in parts
                }
                log.warning(
                    "%s[%d] has had batches waiting and no leader for %.0f s; this producer's "
                    "metadata (last update %s) has leaders %s for its partitions; brokers %s",
                    tp.topic,
                    tp.partition,
                    now - first,
                    "answered" if updated else "failed",
                    leaders,
                    sorted(b.nodeId for b in cluster.brokers()),
                )
        return updated

    client._metadata_update = watched


def track_sent_topics(client: Any) -> None:
    """Make ``client`` keep asking for the metadata of every topic it was asked to send to.

    aiokafka adds a topic to the set its metadata requests name only when it does not know
    the topic's partitions yet. A topic learnt from an all-topics answer (the first requests,
    and every request while that set is empty) is never added; once a later send adds another
    topic, each answer names only that one, and the first topic drops out of the metadata.
    Its batches then wait for a leader the producer no longer asks about, until another send
    to it (none, at the end of a stream). Seen on the 3-node cluster: a topic's partitions
    with batches waiting and an empty leader map, every update answered.
    """
    wait = client._wait_on_metadata  # aiokafka's own, pinned

    async def tracked(topic: str) -> Any:
        if topic not in client._topics:
            client.add_topic(topic)  # the update it starts runs in the background
        return await wait(topic)

    client._wait_on_metadata = tracked


class BoundedMetadataProducer(faust_aiokafka.Producer):
    def _new_producer(self, transactional_id: str | None = None) -> AIOKafkaProducer:
        producer = super()._new_producer(transactional_id)
        track_sent_topics(producer.client)
        bound_metadata_updates(producer.client)
        batches = producer._message_accumulator._batches  # aiokafka's own, pinned
        warn_leaderless(producer.client, lambda: [tp for tp, queued in batches.items() if queued])
        return producer


class ShortFetchTransport(faust_aiokafka.Transport):
    Consumer = ShortFetchConsumer
    Producer = BoundedMetadataProducer


# -- the app and its topics ---------------------------------------------------------------


@dataclass(frozen=True)
class Topics:
    events: faust.TopicT
    encoded: faust.TopicT
    triggers: faust.TopicT
    consolidated: faust.TopicT
    feedback: faust.TopicT
    control: faust.TopicT
    reminders: faust.TopicT
    dlq: faust.TopicT
    # Set once ``declare`` has run: the stages produce only after it. A process started on
    # a log that holds events dead-letters within its first second; sent before the dlq was
    # declared, the letter had a broker that auto-creates topics make the dlq with its own
    # partitions and replication, which memstream's declaration then could not change.
    declared: asyncio.Event = field(default_factory=asyncio.Event, init=False, compare=False)

    def all(self) -> list[faust.TopicT]:
        return [getattr(self, t.name) for t in TOPICS]

    async def declare(self) -> None:
        """Declare every topic on the broker (the output-only ones too, so that they exist
        before anyone reads them), then let the stages produce, whatever happened."""
        started = time.perf_counter()
        try:
            for topic in self.all():
                await topic.maybe_declare()
            log.info("declared %d topics in %.2f s", len(TOPICS), time.perf_counter() - started)
        finally:
            self.declared.set()


class MemstreamApp(faust.App):
    """A faust app whose consumers use ``ShortFetchTransport`` (above)."""

    def _new_transport(self) -> TransportT:
        return ShortFetchTransport(self.conf.broker_consumer, self)


def create_app(kafka: KafkaSettings, *, app_id: str, broker_url: str, data_dir: Path) -> faust.App:
    """A faust app with broker settings that suit both Kafka and the embedded Tansu broker.

    Tansu answers group joins in about half the session timeout, so the timeout is short;
    per-user state lives in Redis, so the app declares no tables (no changelog recovery).
    ``data_dir``: the process's data folder; faust keeps its files in ``faust/<app_id>``.
    """
    datadir = data_dir / "faust" / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)
    ShortFetchConsumerThread.fetch_max_wait_ms = kafka.fetch_max_wait_ms
    ShortFetchConsumerThread.fetch_idle_wait_ms = max(
        kafka.fetch_idle_wait_ms, kafka.fetch_max_wait_ms
    )
    return MemstreamApp(
        app_id,
        broker=broker_url,
        broker_session_timeout=kafka.session_timeout_s,
        broker_heartbeat_interval=max(kafka.session_timeout_s / 3, 0.5),
        broker_commit_every=100,
        broker_commit_interval=1.0,
        stream_wait_empty=False,
        topic_partitions=kafka.partitions,
        topic_replication_factor=kafka.replication_factor,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
        producer_acks=-1,
        processing_guarantee=kafka.processing_guarantee,
    )


def create_topics(app: faust.App, kafka: KafkaSettings) -> Topics:
    """Raw-bytes topics: values are decoded by the stages so that bad input reaches the DLQ."""
    made = {
        t.name: app.topic(
            kafka.topic(t.name),
            key_serializer="raw",
            value_serializer="raw",
            partitions=t.partitions or kafka.partitions,
            # "internal": faust declares the topic before it subscribes. Kafka does not
            # create a topic for a consumer, and a group that joined before its topics
            # existed is assigned nothing until its next metadata refresh (5 minutes).
            internal=True,
        )
        for t in TOPICS
    }
    return Topics(**made)


# -- typed doors to faust's untyped decorators ---------------------------------------------

Job = Callable[[], Awaitable[None]]


def on_start(app: faust.App, job: Job) -> None:
    """Run ``job`` once when the worker is ready (``@app.task``)."""
    app.task(job)


def every(
    app: faust.App, interval_s: float, job: Job, *, name: str | None = None, on_leader: bool = False
) -> None:
    """Run ``job`` every ``interval_s`` seconds while the worker runs (``@app.timer``)."""
    app.timer(interval_s, on_leader=on_leader, name=name)(job)


def take_events(
    stream: faust.StreamT[bytes], size: int, within_s: float
) -> AsyncIterator[Sequence[EventT[bytes]]]:
    """Batches of up to ``size`` events, each flushed after ``within_s`` at the latest.

    faust declares ``take_events`` on its ``Stream`` but not on the ``StreamT`` an agent gets.
    """
    return cast(faust.Stream[bytes], stream).take_events(size, within=within_s)


@dataclass
class Taken:
    """A batch ``take_ready_deferred`` handed over, with its acknowledgement.

    ``ack`` once the batch's handler has finished (what it sent is in the producer, which
    faust flushes before it commits): never before, or a crash could skip the batch.
    """

    events: Sequence[EventT[bytes]]
    _stream: faust.Stream[bytes]

    async def ack(self) -> None:
        for event in self.events:
            await self._stream.ack(event)


async def take_ready(
    stream: faust.StreamT[bytes], size: int, within_s: float
) -> AsyncGenerator[Sequence[EventT[bytes]], None]:
    """Batches of up to ``size`` events, handed over as soon as the consumer is free.

    faust's ``take_events`` waits ``within_s`` for a batch to fill even when the stage is
    idle (at half load that was most of an encode batch's latency), and buffers nothing
    while its consumer works. Here events keep arriving into the next batch while the
    consumer handles one, so batches form under load by themselves, and an idle stage
    takes what has arrived at once: only the records of the same fetch still on their way
    (a few loop turns, at most ``within_s``) join it. Acks are as in faust's: an event is
    acknowledged once the consumer has finished the batch it was handed in (at least
    once), never while a batch is in hand, nor when its handler raised or was cancelled.
    """
    async with contextlib.aclosing(take_ready_deferred(stream, size, within_s)) as batches:
        async for taken in batches:
            yield taken.events
            # Only when the consumer asks for the next batch: a batch whose handler failed
            # or was cancelled (the generator closed at the yield) stays unacked.
            await taken.ack()


async def take_ready_deferred(
    stream: faust.StreamT[bytes], size: int, within_s: float
) -> AsyncGenerator[Taken, None]:
    """``take_ready``'s batches, each acknowledged by its consumer (``Taken.ack``) rather
    than when it asks for the next: a pipelined stage takes batch N+1 while batch N is
    still being sent. A batch never acked is redelivered after a crash or a rebalance.
    Built on faust 0.15's stream internals (``add_processor``, ``_enable_passive``,
    ``current_event``), as ``take_events`` is.
    """
    s = cast(faust.Stream[bytes], stream)
    loop = asyncio.get_running_loop()
    pending: list[EventT[bytes]] = []
    backlog = _BACKLOGGED.setdefault(s.app, set())
    arrived = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def add(value: bytes) -> bytes:
        event = s.current_event
        if event is None:
            raise RuntimeError("take_ready found current_event is None")
        while len(pending) >= size:  # at most ``size``: the stream waits for the consumer
            backlog.add(id(s))
            room.clear()
            await s.wait(room)  # type: ignore[arg-type]  # mode's Event, asyncio's works
            if s.should_stop:
                return value
        pending.append(event)
        arrived.set()
        return value

    enable_acks = s.enable_acks
    s.enable_acks = False  # acked by the consumer, once it has finished the batch
    s.add_processor(add)
    s._enable_passive(cast(faust.ChannelT[bytes], aiter(s.channel)))
    try:
        while not s.should_stop:
            await s.wait_for_stopped(arrived, timeout=1.0)  # type: ignore[arg-type]
            if not pending:
                continue
            deadline = loop.time() + within_s
            while len(pending) < size and loop.time() < deadline:
                before = len(pending)
                for _ in range(_SETTLE_TURNS):
                    await asyncio.sleep(0)
                if len(pending) == before:
                    break  # nothing more of this fetch is on its way
            batch = pending[:]
            pending.clear()
            arrived.clear()
            backlog.discard(id(s))
            room.set()
            yield Taken(batch, s)
    finally:
        backlog.discard(id(s))
        s.enable_acks = enable_acks
        s._processors.remove(add)


# Loop turns a fetched record may take from the consumer to ``take_ready``'s buffer.
_SETTLE_TURNS = 3


# -- the RPC's producer -------------------------------------------------------------------


def bootstrap_servers(broker_url: str) -> str:
    """faust-style ``kafka://h1:9092;kafka://h2:9092`` -> aiokafka's ``h1:9092,h2:9092``."""
    hosts = [
        part.removeprefix("kafka://").strip("/") for part in broker_url.replace(";", ",").split(",")
    ]
    return ",".join(h for h in hosts if h)


class EventPublisher:
    """Publishing from the RPC (and the operator tools) to Kafka: one pooled producer."""

    def __init__(self, broker_url: str) -> None:
        # Idempotent producers are not supported by every Kafka-protocol broker (Tansu):
        # at-least-once delivery plus idempotent consumers instead.
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers(broker_url),
            acks="all",
            enable_idempotence=False,
            # No linger: a bot's event goes out at once (a POST waited the 2 ms it was).
            # Sends made while a request is in flight still go out as one batch.
            linger_ms=0,
        )
        track_sent_topics(self._producer.client)

    async def start(self) -> None:
        await self._producer.start()

    async def publish(self, topic: str, key: str, value: bytes) -> None:
        await self._producer.send_and_wait(topic, value=value, key=key.encode())

    async def publish_many(self, topic: str, items: list[tuple[str | None, bytes]]) -> None:
        """Send every (key, value), then wait for all (a None key: a record without one)."""
        futures = [
            await self._producer.send(topic, value=v, key=None if k is None else k.encode())
            for k, v in items
        ]
        for future in futures:
            await future

    async def partitions(self, topic: str) -> int:
        """How many partitions the broker lists for ``topic`` (0: it does not exist yet)."""
        cluster = await self._producer.client.fetch_all_metadata()
        return len(cluster.partitions_for_topic(topic) or ())

    async def ping(self) -> bool:
        try:
            await self._producer.client.fetch_all_metadata()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self._producer.stop()


# -- a consumer group's lag, as the broker reports it ---------------------------------------


@dataclass(frozen=True)
class GroupLag:
    """Records of some topics that a consumer group has not committed yet."""

    lag: int
    committed: int  # the group's committed offsets, summed: how far it has come (its pace)
    group: str | None  # the group read; None: none has committed yet (everything is lag)


class ConsumerGroupLag:
    """End offsets against a consumer group's committed offsets, read from the broker.

    What any Kafka tool reports as the group's lag, so a producer elsewhere sees the same
    number. It never joins the group: a consumer with the group's id that subscribes to
    nothing only fetches the group's offsets (aiokafka's admin client cannot parse Tansu's
    OffsetFetch answer; the consumer's request can). Of several candidate groups (the
    processors' group depends on the roles they run with) the one that lags least is the
    one reading now: a stale group of an earlier layout only lags more.

    The end offsets are the high watermarks of fetch answers, from a consumer (no group)
    that follows the topics' tails and drops what it reads. Tansu answers ListOffsets with
    the last record batch's base offset + 1, short of the end by the size of that batch
    less one (a partition holding one batch of 5 records said 1); its fetch answers carry
    the true high watermark. ListOffsets stands in only until a partition's first fetch.
    """

    def __init__(
        self, broker_url: str, groups: Sequence[str], topics: Sequence[str], timeout_s: float = 5.0
    ) -> None:
        self.groups = list(groups)
        self.topics = list(topics)
        self.timeout_s = timeout_s
        servers = bootstrap_servers(broker_url)
        self._ends = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=servers,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            max_partition_fetch_bytes=256 * 1024,  # only the answers' watermarks are wanted
        )
        self._members = {
            g: aiokafka.AIOKafkaConsumer(
                bootstrap_servers=servers, group_id=g, enable_auto_commit=False
            )
            for g in self.groups
        }
        self._partitions: list[aiokafka.TopicPartition] = []

    async def start(self) -> None:
        await self._ends.start()
        for member in self._members.values():
            await member.start()

    async def read(self) -> GroupLag:
        return await asyncio.wait_for(self._read(), self.timeout_s)

    async def _read(self) -> GroupLag:
        tps = await self._topic_partitions()
        if not tps:
            return GroupLag(0, 0, None)
        # Drop what the tail consumer fetched: its fetches go on only once it is taken.
        await self._ends.getmany(timeout_ms=0)
        watermarks = {tp: self._ends.highwater(tp) for tp in tps}
        unknown = [tp for tp, w in watermarks.items() if w is None]
        listed = await self._ends.end_offsets(unknown) if unknown else {}
        ends: dict[aiokafka.TopicPartition, int] = {
            tp: listed[tp] if w is None else w for tp, w in watermarks.items()
        }
        starts: dict[aiokafka.TopicPartition, int] | None = None  # asked only when needed
        best: GroupLag | None = None
        for group, member in self._members.items():
            done = await _committed(member, tps)
            if all(d is None for d in done):
                continue  # never committed: not this layout's group (or not started yet)
            if starts is None and None in done:
                starts = await self._ends.beginning_offsets(tps)
            fallback = starts or {}
            at = [fallback.get(tp, 0) if d is None else d for tp, d in zip(tps, done, strict=True)]
            lag = sum(max(0, ends[tp] - a) for tp, a in zip(tps, at, strict=True))
            if best is None or lag < best.lag:
                best = GroupLag(lag, sum(at), group)
        if best is not None:
            return best
        # No group has committed: a group that starts reads from the earliest offset.
        starts = await self._ends.beginning_offsets(tps)
        return GroupLag(sum(max(0, ends[tp] - starts[tp]) for tp in tps), 0, None)

    async def _topic_partitions(self) -> list[aiokafka.TopicPartition]:
        if len({tp.topic for tp in self._partitions}) < len(self.topics):
            # Every topic's metadata, asked anew: a topic may exist by now.
            cluster = await self._ends._client.fetch_all_metadata()
            found: list[aiokafka.TopicPartition] = []
            for topic in self.topics:
                partitions = cluster.partitions_for_topic(topic) or set()
                if partitions:  # tracked, so that offset requests know its leaders
                    await self._ends._client.add_topic(topic)
                found += [aiokafka.TopicPartition(topic, p) for p in sorted(partitions)]
            if found != self._partitions:
                self._ends.assign(found)
                await self._ends.seek_to_end(*found)  # follows the tail from here on
            self._partitions = found
        return self._partitions

    async def close(self) -> None:
        for member in self._members.values():
            await member.stop()
        await self._ends.stop()


async def _committed(
    member: aiokafka.AIOKafkaConsumer, tps: list[aiokafka.TopicPartition]
) -> list[int | None]:
    """The group's committed offset of each partition (None: none), in one OffsetFetch: the
    public ``committed`` asks one partition per request, a request per partition per read."""
    found = await member._coordinator.fetch_committed_offsets(tps)
    return [found[tp].offset if tp in found and found[tp].offset >= 0 else None for tp in tps]
