"""Running memstream processes: a faust worker with the chosen roles, the API inside it or alone.

With Qdrant Edge (embedded), one process owns the store, so ``memstream up`` runs every role
in one process; with a Qdrant server, ``worker``, ``consolidator`` and ``serve`` run apart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import faust
from fastapi import FastAPI

from memstream.health import Health, serve_health
from memstream.logs import logging_config
from memstream.metrics import Metrics
from memstream.rebuild import GenerationFollower, with_active_generation
from memstream.settings import Settings
from memstream.wiring import Dependencies, Role, Stack, build_app
from rpc.serving import make_server, start_api

log = logging.getLogger("memstream")

# A task run inside the worker once it has started; its return value is the exit code.
Job = Callable[["RunningProcess"], Awaitable[int]]


@dataclass
class RunningProcess:
    """What a job inside a running process can reach."""

    settings: Settings
    stack: Stack
    deps: Dependencies
    app: faust.App
    api_ready: asyncio.Event = field(default_factory=asyncio.Event)


def run_process(
    settings: Settings,
    roles: frozenset[Role],
    *,
    job: Job | None = None,
    generations: bool = True,
) -> int:
    """Start the stack and a faust worker with ``roles``; block until Ctrl-C or ``job`` ends.

    With ``generations`` (every process but a rebuild's), the process runs as the active
    generation (``memstream.rebuild``) and its API follows later switches.
    """
    stack = Stack.start(settings)
    health_server = None
    try:
        base = settings
        if generations:
            settings = with_active_generation(base, stack.redis_url)
        metrics = Metrics()
        deps = Dependencies.build(settings, stack, metrics)
        app, _topics = build_app(deps, stack, roles)
        running = RunningProcess(settings, stack, deps, app)
        exit_code = [0]
        if "serve" in roles:
            _serve_inside(running, follow=base if generations else None)
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
        stack.stop()


def _health(running: RunningProcess, roles: frozenset[Role]) -> Health:
    """Probes of a worker or consolidator: its loop, its consumer, the stores it writes."""
    deps = running.deps
    checks = {"redis": deps.state.ping}
    if "consolidate" in roles:  # only the consolidator writes to Qdrant
        checks["qdrant"] = deps.longterm.ping
    health = Health(running.app, checks)
    health.attach()
    return health


def _follow(api: FastAPI, base: Settings, redis_url: str, current: Settings) -> None:
    """Keep the API on the active generation while it runs (see memstream.rebuild)."""
    follower = GenerationFollower(api.state.deps, base, redis_url, current)
    task = asyncio.ensure_future(follower.run())
    api.state.generation_follower = (follower, task)  # held: a bare task may be collected


def _serve_inside(running: RunningProcess, *, follow: Settings | None) -> None:
    deps = running.deps

    @running.app.task
    async def serve_api() -> None:
        api, publisher = await start_api(
            running.settings,
            broker_url=running.stack.broker_url,
            encoder=deps.encoder,
            state=deps.state,
            longterm=deps.longterm,
            metrics=deps.metrics,
        )
        if follow is not None:
            _follow(api, follow, running.stack.redis_url, running.settings)
        server = make_server(api, running.settings, guest=True)
        try:
            serving = asyncio.ensure_future(server.serve())
            while not server.started and not serving.done():  # noqa: ASYNC110 - a flag, no event
                await asyncio.sleep(0.05)
            running.api_ready.set()
            await serving
        finally:
            server.should_exit = True
            await publisher.close()


def _run_job_inside(running: RunningProcess, job: Job, exit_code: list[int]) -> None:
    @running.app.task
    async def run_job() -> None:
        try:
            exit_code[0] = await job(running)
        except Exception:
            log.exception("job failed")
            exit_code[0] = 1
        # Stop the way Ctrl-C does, so the worker drains and commits.
        os.kill(os.getpid(), signal.SIGTERM)


def _run_worker(app: faust.App, loglevel: str) -> int:
    worker = faust.Worker(
        app,
        loglevel=loglevel,
        logging_config=logging_config(loglevel),
        quiet=True,
        redirect_stdouts=False,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


async def serve_standalone(settings: Settings) -> None:
    """``memstream serve``: the API alone, against external (or already running) services."""
    from memstream.wiring import open_state
    from stores.encoder import OnnxEncoder
    from stores.longterm import open_longterm

    if not settings.kafka.broker or not settings.redis.url:
        raise SystemExit("memstream serve needs MEMSTREAM_KAFKA__BROKER and MEMSTREAM_REDIS__URL")
    base, settings = settings, with_active_generation(settings, settings.redis.url)
    metrics = Metrics()
    state = open_state(settings, settings.redis.url)
    longterm = open_longterm(settings.qdrant, settings.data_dir)
    api, publisher = await start_api(
        settings,
        broker_url=settings.kafka.broker,
        encoder=OnnxEncoder.from_settings(settings.encoder),
        state=state,
        longterm=longterm,
        metrics=metrics,
    )
    _follow(api, base, settings.redis.url, settings)
    try:
        await make_server(api, settings, guest=False).serve()
    finally:
        await publisher.close()
        await state.close()
        await longterm.close()
