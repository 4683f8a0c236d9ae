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
from prometheus_client import start_http_server

from memstream.logs import logging_config
from memstream.metrics import Metrics
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


def run_process(settings: Settings, roles: frozenset[Role], *, job: Job | None = None) -> int:
    """Start the stack and a faust worker with ``roles``; block until Ctrl-C or ``job`` ends."""
    stack = Stack.start(settings)
    try:
        metrics = Metrics()
        deps = Dependencies.build(settings, stack, metrics)
        app, _topics = build_app(deps, stack, roles)
        running = RunningProcess(settings, stack, deps, app)
        exit_code = [0]
        if "serve" in roles:
            _serve_inside(running)
        elif settings.metrics_port:
            start_http_server(
                settings.metrics_port, addr=settings.metrics_host, registry=metrics.registry
            )
        if job is not None:
            _run_job_inside(running, job, exit_code)
        code = _run_worker(app, settings.log_level)
        return exit_code[0] or code
    finally:
        stack.stop()


def _serve_inside(running: RunningProcess) -> None:
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
    try:
        await make_server(api, settings, guest=False).serve()
    finally:
        await publisher.close()
        await state.close()
        await longterm.close()
