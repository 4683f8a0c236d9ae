"""Running memstream processes: a faust worker with the chosen roles, the API inside it or alone.

With Qdrant Edge (embedded), one process owns the store, so ``memstream up`` runs every role
in one process; with a Qdrant server, ``worker``, ``consolidator`` and ``serve`` run apart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import faust
import numpy  # noqa: F401 - loads the OpenBLAS that tune_process_threads limits
from fastapi import FastAPI
from threadpoolctl import threadpool_limits

from memstream.generations import GenerationFollower, with_active_generation
from memstream.health import Health, serve_health
from memstream.logs import logging_config
from memstream.metrics import Metrics
from memstream.process_exit import dump_stacks_on_sigquit
from memstream.roles import Role
from memstream.rpc.serving import make_server
from memstream.settings import Settings
from memstream.stores.embedded import DataDirBusy, DataDirLock, ServiceConflict, port_taken
from memstream.streaming.broker import on_start
from memstream.wiring import (
    Dependencies,
    LongTermOpener,
    ServiceBuilder,
    Stack,
    open_longterm,
    stop_api,
)

log = logging.getLogger("memstream")

# A task run inside the worker once it has started; its return value is the exit code.
Job = Callable[["RunningProcess"], Awaitable[int]]


class StartupError(RuntimeError):
    """A reason not to start that the operator can fix; the CLI prints it as one line."""


# The GIL switch interval of every memstream process (CPython's default: 5 ms). The event
# loop releases the GIL on each socket call (Redis, Kafka, HTTP); getting it back can mean
# waiting out the consumer's or the encoder's threads for up to a whole interval, dozens of
# times a batch (the convoy effect). On a machine busy with other work the loop stood
# still 100-500 ms at a time under half load (interleaved A/B at 70 events/s: event ->
# stored p50 553 -> 79-187 ms); on a quiet machine the two intervals measure the same.
GIL_SWITCH_INTERVAL_S = 0.0005


def tune_process_threads() -> None:
    """numpy's BLAS on one thread and a short GIL switch interval, for the process's life.

    BLAS: its products here are small (a vector against a user's clusters, turns or cached
    memory vectors), and OpenBLAS splitting one over both cores waits for whichever core the
    encoder holds (10k x 384: p50 3.4 ms split on a busy machine, 0.65 ms on one thread).
    One thread also rounds a product the same way on any machine, whatever its core count.
    The switch interval: ``GIL_SWITCH_INTERVAL_S``.
    """
    threadpool_limits(limits=1, user_api="blas")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


@dataclass
class Backlog:
    """Events this process published (a replay) that its pipeline has not settled yet.

    ``pending`` is what the RPC reports (``/readyz``, the ``X-Memstream-Catching-Up``
    header) so a caller can tell "nothing remembered" from "not arrived yet".
    """

    handled: Callable[[], float] = field(default=lambda: 0.0)
    expected: float = 0.0  # handled count at which the replay will have settled
    settling: bool = False

    def begin(self, events: int, handled: Callable[[], float]) -> None:
        self.handled = handled
        self.expected = handled() + events
        self.settling = True

    def end(self) -> None:
        self.settling = False

    def pending(self) -> int:
        if not self.settling:
            return 0
        return max(1, round(self.expected - self.handled()))  # 1: triggers still settling


@dataclass
class RunningProcess:
    """What a job inside a running process can reach."""

    settings: Settings
    stack: Stack
    deps: Dependencies
    app: faust.App
    api_ready: asyncio.Event = field(default_factory=asyncio.Event)
    backlog: Backlog = field(default_factory=Backlog)


def rpc_url(settings: Settings) -> str:
    return f"http://{settings.rpc.host}:{settings.rpc.port}"


def data_dir_lock(settings: Settings) -> DataDirLock | None:
    """What of ``settings.data_dir`` this process would own: the whole folder when it starts
    embedded services, else its Qdrant Edge collection (one process per collection; a
    rebuild builds another collection beside a running stack), else nothing."""
    if not settings.kafka.broker or not settings.redis.url:
        return DataDirLock(settings.data_dir)
    if settings.qdrant.backend == "edge":
        return DataDirLock(settings.data_dir, f"qdrant-{settings.qdrant.collection}")
    return None


def claim_data_dir(settings: Settings, *, serving: bool) -> DataDirLock | None:
    """Take the data folder (and check the RPC port) before starting anything in it.

    Two stacks on one folder would fight over Qdrant Edge's lock and the embedded
    services' files; refusing up front touches nothing of the one running.
    """
    lock = data_dir_lock(settings)
    if lock is not None:
        try:
            lock.acquire(rpc_url(settings) if serving else "")
        except DataDirBusy as busy:
            raise StartupError(str(busy)) from None
    if serving and port_taken(settings.rpc.port, settings.rpc.host):
        if lock is not None:
            lock.release()
        raise StartupError(
            f"port {settings.rpc.port} on {settings.rpc.host} is taken (another memstream?) "
            f"— pick another: MEMSTREAM_RPC__PORT={settings.rpc.port + 1} (or --port)"
        )
    return lock


def run_process(
    settings: Settings,
    roles: frozenset[Role],
    *,
    job: Job | None = None,
    generations: bool = True,
    open_store: LongTermOpener = open_longterm,
) -> int:
    """Start the stack and a faust worker with ``roles``; block until Ctrl-C or ``job`` ends.

    With ``generations`` (every process but a rebuild's), the process runs as the active
    generation (``memstream.generations``) and its API follows later switches. ``open_store``
    replaces how the long-term store is opened (the reliability suite's fault injection).
    Raises ``StartupError`` when another stack holds the data folder or the RPC port is taken.
    """
    tune_process_threads()
    dump_stacks_on_sigquit()
    lock = claim_data_dir(settings, serving="serve" in roles)
    stack: Stack | None = None
    try:
        stack = Stack.start(settings)
    except ServiceConflict as conflict:
        raise StartupError(str(conflict)) from None
    finally:
        if lock is not None and stack is None:
            lock.release()
    if lock is not None:
        serving = "serve" in roles
        lock.record(
            url=rpc_url(settings) if serving else "",
            broker=stack.broker_url,
            redis=stack.redis_url,
        )
    health_server = None
    try:
        base = settings
        if generations:
            settings = with_active_generation(base, stack.redis_url)
        metrics = Metrics()
        builder = ServiceBuilder(stack, metrics, open_store=open_store)
        deps = builder.dependencies(settings)
        app, _topics = builder.build_app(deps, roles)
        running = RunningProcess(settings, stack, deps, app)
        exit_code = [0]
        if "serve" in roles:
            _serve_inside(running, builder, follow=base if generations else None)
        elif settings.metrics_port:
            health = _health(running, roles)
            health_server = serve_health(
                health,
                metrics.registry,
                host=settings.metrics_host,
                port=settings.metrics_port,
            )
        if job is not None:
            _run_job_inside(running, job, exit_code)
        code = _run_worker(app, settings.log_level)
        return exit_code[0] or code
    finally:
        if health_server is not None:
            health_server.shutdown()
        stack.stop()  # after the worker stopped its consumers: they need the broker to leave
        if lock is not None:
            lock.release()


def _health(running: RunningProcess, roles: frozenset[Role]) -> Health:
    """Probes of a worker or consolidator: its loop, its consumer, the stores it writes."""
    deps = running.deps
    checks = {"redis": deps.state.ping}
    if "consolidate" in roles:  # only the consolidator writes to Qdrant
        checks["qdrant"] = deps.longterm.ping
    health = Health(running.app, checks)
    health.attach()
    return health


def _follow(api: FastAPI, builder: ServiceBuilder, base: Settings, current: Settings) -> None:
    """Keep the API on the active generation while it runs (see memstream.generations)."""
    follower = GenerationFollower(
        api.state.deps, base, builder.stack.redis_url, current, builder.retriever
    )
    task = asyncio.ensure_future(follower.run())
    api.state.generation_follower = (follower, task)  # held: a bare task may be collected


def _serve_inside(
    running: RunningProcess, builder: ServiceBuilder, *, follow: Settings | None
) -> None:
    async def serve_api() -> None:
        api = await builder.start_api(running.settings)
        if follow is not None:
            _follow(api, builder, follow, running.settings)
        api.state.backlog = running.backlog.pending
        server = make_server(api, running.settings.rpc, guest=True)
        try:
            serving = asyncio.ensure_future(server.serve())
            while not server.started and not serving.done():  # noqa: ASYNC110 - a flag, no event
                await asyncio.sleep(0.05)
            running.api_ready.set()
            await serving
        finally:
            server.should_exit = True
            await stop_api(api)

    on_start(running.app, serve_api)


def _run_job_inside(running: RunningProcess, job: Job, exit_code: list[int]) -> None:
    async def run_job() -> None:
        try:
            exit_code[0] = await job(running)
        except Exception:
            log.exception("job failed")
            exit_code[0] = 1
        # Stop the way Ctrl-C does, so the worker drains and commits.
        os.kill(os.getpid(), signal.SIGTERM)

    on_start(running.app, run_job)


def _run_worker(app: faust.App, loglevel: str) -> int:
    try:
        faust_worker(app, loglevel).execute_from_commandline()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def faust_worker(app: faust.App, loglevel: str) -> faust.Worker:
    """The faust worker that runs ``app``, logging through ``logging_config`` alone."""
    worker = faust.Worker(
        app,
        loglevel=loglevel,
        logging_config=logging_config(loglevel),
        quiet=True,
        redirect_stdouts=False,
    )
    # faust's terminal spinner turns the root logger to DEBUG (its handler spins on every
    # record), so each debug call of faust and aiokafka built and handled a record: ~5% of
    # the event loop's CPU during a replay (issue 14).
    worker.spinner = None
    return worker


async def serve_standalone(settings: Settings) -> None:
    """``memstream serve``: the API alone, against external (or already running) services."""
    if not settings.kafka.broker or not settings.redis.url:
        raise StartupError("memstream serve needs MEMSTREAM_KAFKA__BROKER and MEMSTREAM_REDIS__URL")
    tune_process_threads()
    dump_stacks_on_sigquit()
    lock = claim_data_dir(settings, serving=True)  # Qdrant Edge's folder, the port
    try:
        await _serve_alone(settings)
    finally:
        if lock is not None:
            lock.release()


async def _serve_alone(settings: Settings) -> None:
    base, settings = settings, with_active_generation(settings, settings.redis.url)
    builder = ServiceBuilder(Stack(settings.kafka.broker, settings.redis.url), Metrics())
    api = await builder.start_api(settings)
    _follow(api, builder, base, settings)
    try:
        await make_server(api, settings.rpc, guest=False).serve()
    finally:
        await stop_api(api)
        await builder.close()
