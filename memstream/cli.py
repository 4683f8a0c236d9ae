"""The ``memstream`` command line. Settings come from MEMSTREAM_* variables (see settings.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging.config
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

from memstream.logs import logging_config
from memstream.process_exit import exit_within
from memstream.roles import ALL_ROLES, ROLE_SETS, parse_roles
from memstream.settings import (
    DEMO_API_KEY,
    DEMO_TENANT,
    ENV_NESTED,
    ENV_PREFIX,
    Settings,
    UnknownSettingError,
)

if TYPE_CHECKING:  # runtime pulls in faust: imported only by the commands that run it
    from memstream.roles import Role
    from memstream.runtime import Job, RunningProcess

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
schemas_cli = typer.Typer(no_args_is_help=True, help="JSON Schema of every topic and RPC body.")
cli.add_typer(schemas_cli, name="schemas")
console = Console()
errors = Console(stderr=True)

Port = Annotated[int | None, typer.Option(help="RPC port (default: settings, 8080).")]


def _settings(port: int | None = None) -> Settings:
    import pydantic
    from pydantic_settings import SettingsError

    from memstream.schemas.common import tenant_problem

    try:
        settings = Settings()
    except UnknownSettingError as exc:  # a misspelt or renamed MEMSTREAM_* variable
        _fail(str(exc))
    except SettingsError as exc:  # a JSON value (map, list, section) that does not parse
        _fail(f"invalid setting: {exc} ({exc.__cause__})")
    except pydantic.ValidationError as exc:  # a value the setting does not accept
        first = exc.errors()[0]
        name = ENV_PREFIX + ENV_NESTED.join(str(part) for part in first["loc"]).upper()
        _fail(f"invalid setting {name}: {first['msg']}")
    for tenant in settings.rpc.api_keys.values():
        if problem := tenant_problem(tenant):
            _fail(f"invalid setting MEMSTREAM_RPC__API_KEYS: tenant {tenant!r}: {problem}")
    if port is not None:
        settings = settings.model_copy(
            update={"rpc": settings.rpc.model_copy(update={"port": port})}
        )
    logging.config.dictConfig(logging_config(settings.log_level))  # JSON lines on stderr
    return settings


def _found_stack(settings: Settings) -> Settings:
    """``settings`` with the broker and Valkey of the stack running on its data folder where
    none is configured (``memstream up`` records them in ``stack.lock``), saying so."""
    if settings.kafka.broker and settings.redis.url:
        return settings
    from memstream.stores.embedded import running_stack

    found = running_stack(settings.data_dir)
    if found is None:
        return settings
    broker = settings.kafka.broker or str(found.get("broker") or "")
    redis = settings.redis.url or str(found.get("redis") or "")
    console.print(
        f"using the stack running on {settings.data_dir} (pid {found.get('pid')}): "
        f"broker {broker or '-'}, valkey {redis or '-'}",
        soft_wrap=True,
        highlight=False,
    )
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"broker": broker}),
            "redis": settings.redis.model_copy(update={"url": redis}),
        }
    )


def _fail(message: str) -> NoReturn:
    """A user's mistake or a missing service: one line on stderr, exit 1, no traceback."""
    errors.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _run(settings: Settings, roles: frozenset[Role], job: Job | None = None) -> None:
    from memstream.runtime import StartupError, run_process

    try:
        code = run_process(settings, roles, job=job)
    except StartupError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def banner(settings: Settings, broker: str = "", redis: str = "") -> str:
    """How to ask the running stack something, and where its broker and Valkey answer; the
    demo key (and its tenant, which a producer writing to the broker must use) only where
    it is accepted."""
    url = f"http://{settings.rpc.host}:{settings.rpc.port}"
    key = DEMO_API_KEY if not settings.rpc.api_keys else "$MEMSTREAM_API_KEY"
    note = "" if not settings.rpc.api_keys else "  (rpc.api_keys is set: use one of its keys)\n"
    tenant = f", tenant '{DEMO_TENANT}' for the demo key" if not settings.rpc.api_keys else ""
    services = (
        f"\n  broker: {broker} (topic {settings.kafka.topic('events')}{tenant})   valkey: {redis}"
        if broker or redis
        else ""
    )
    return (
        f"\n[bold green]memstream is serving on {url}[/] (Ctrl-C stops it)\n{note}"
        f"  curl -s {url}/v1/retrieve -H 'Authorization: Bearer {key}' "
        "-H 'Content-Type: application/json' \\\n"
        '    -d \'{"user_id": "cust-ana", "query": "What is the status of order A-10293?"}\'\n'
        f"  metrics: {url}/metrics   docs: {url}/docs{services}"
    )


RestoreForgotten = Annotated[
    bool,
    typer.Option(
        help="Lift the forget tombstones of the users in the replayed file first, so the "
        "replay brings them back (they are kept otherwise: a replay skips a forgotten "
        "user's earlier events)."
    ),
]


Roles = Annotated[
    str,
    typer.Option(
        help="Comma-separated roles: process (encode, memorize), consolidate, serve (the "
        "RPC); or an alias: up, worker, consolidator, serve."
    ),
]
Replay = Annotated[
    Path | None, typer.Option(help="Replay this JSONL file once started (every role only).")
]


@cli.command()
def run(
    roles: Roles = "up",
    port: Port = None,
    replay: Replay = None,
    restore_forgotten: RestoreForgotten = False,
) -> None:
    """One process playing these roles; the commands below are aliases of role sets."""
    try:
        chosen = parse_roles(roles)
    except ValueError as exc:
        _fail(str(exc))
    _run_roles(chosen, port, replay=replay, restore_forgotten=restore_forgotten)


def _run_roles(
    roles: frozenset[Role],
    port: int | None = None,
    *,
    replay: Path | None = None,
    restore_forgotten: bool = False,
) -> None:
    """Every role: the embedded stack and the curl banner (``up``); serve alone: the API
    without a faust worker; any other set: a worker playing those roles."""
    settings = _settings(port)
    if replay is not None and roles != ALL_ROLES:
        _fail("--replay needs every role (memstream up): the replay settles through all three")
    if roles == ROLE_SETS["serve"]:
        from memstream.runtime import StartupError, serve_standalone

        try:
            asyncio.run(serve_standalone(settings))
        except StartupError as exc:
            _fail(str(exc))
        return
    if replay is not None and not replay.is_file():
        _fail(f"no such file to replay: {replay}")

    async def announce(running: RunningProcess) -> int:
        from memstream.ops.demo import replay_sample

        await running.api_ready.wait()
        if replay is not None:
            url = f"http://{settings.rpc.host}:{settings.rpc.port}"
            console.print(
                f"memstream is up on {url}; replaying {replay.name} — answers fill in until "
                "it settles (/readyz says how many events are pending)",
                soft_wrap=True,
            )
            await replay_sample(running, replay, restore_forgotten=restore_forgotten)
        stack = running.stack
        console.print(  # soft wrap: the curl must paste whole
            banner(running.settings, stack.broker_url, stack.redis_url), soft_wrap=True
        )
        await asyncio.Event().wait()  # serve until the worker is stopped
        return 0

    _run(settings, roles, announce if roles == ALL_ROLES else None)


@cli.command()
def up(
    port: Port = None, replay: Replay = None, restore_forgotten: RestoreForgotten = False
) -> None:
    """Start the embedded stack and every role in this process; serve until Ctrl-C."""
    _run_roles(ROLE_SETS["up"], port, replay=replay, restore_forgotten=restore_forgotten)


@cli.command()
def demo(port: Port = None, restore_forgotten: RestoreForgotten = False) -> None:
    """Start everything, replay the bundled sample, ask the example questions, stop."""
    from functools import partial

    from memstream.ops.demo import run_demo

    _run(_settings(port), ALL_ROLES, partial(run_demo, restore_forgotten=restore_forgotten))


@cli.command()
def worker() -> None:
    """Stream processors (encode, memorize) against the configured broker and Redis."""
    _needs_services("worker")
    _run_roles(ROLE_SETS["worker"])


@cli.command()
def consolidator() -> None:
    """Consolidation workers against the configured broker, Redis and Qdrant."""
    _needs_services("consolidator")
    _run_roles(ROLE_SETS["consolidator"])


def _needs_services(command: str) -> None:
    """A role set joins a deployment's broker and Redis; started with neither configured it
    refuses in one line, rather than start an embedded stack of its own nobody else uses."""
    settings = _settings()
    if not settings.kafka.broker or not settings.redis.url:
        _fail(
            f"memstream {command} joins a deployment: set MEMSTREAM_KAFKA__BROKER and "
            "MEMSTREAM_REDIS__URL; every role on this machine is `memstream up`"
        )


@cli.command()
def serve(port: Port = None) -> None:
    """The retrieval API alone (needs an external broker, Redis and Qdrant server)."""
    _run_roles(ROLE_SETS["serve"], port)


@cli.command()
def replay(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL of events.")],
    broker: Annotated[
        str | None, typer.Option(help="kafka://host:port (default: settings).")
    ] = None,
    restore_forgotten: RestoreForgotten = False,
) -> None:
    """Publish a JSONL file of InteractionEvents to memstream.events, with a progress bar."""
    from memstream.ops.replay import file_users, forgotten_hint, forgotten_users, replay_file
    from memstream.wiring import open_state

    settings = _settings() if broker else _found_stack(_settings())
    url = broker or settings.kafka.broker
    if not url:
        raise typer.BadParameter(
            "no broker: pass --broker, set MEMSTREAM_KAFKA__BROKER or start `memstream up`"
        )
    if restore_forgotten and not settings.redis.url:
        raise typer.BadParameter(
            "--restore-forgotten needs the stack's Redis (MEMSTREAM_REDIS__URL); with the "
            "embedded stack use `memstream up --replay FILE --restore-forgotten`"
        )

    async def run() -> int:
        if settings.redis.url:  # tombstones: say who stays forgotten, or lift them
            state = open_state(
                settings.redis, settings.redis.url, cluster_cache_users=settings.cluster.cache_users
            )
            try:
                found = await forgotten_users(state, file_users(file), restore=restore_forgotten)
            finally:
                await state.close()
            if found:
                console.print(forgotten_hint(found, restored=restore_forgotten), soft_wrap=True)
        return await replay_file(file, url, settings.kafka.topic("events"))

    from aiokafka.errors import KafkaError
    from redis.exceptions import ConnectionError as RedisConnectionError

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its retries: we say it once
    try:
        sent = asyncio.run(run())
    except KafkaError as exc:
        _fail(f"no broker answers at {url} ({type(exc).__name__}) — pass --broker or start it")
    except RedisConnectionError:
        _fail(f"no Redis answers at {settings.redis.url} — check MEMSTREAM_REDIS__URL")
    console.print(f"sent {_plural(sent, 'event')} to {settings.kafka.topic('events')}")


@cli.command()
def rebuild(
    name: Annotated[str, typer.Argument(help="The new generation's name (a-z, 0-9, '-').")],
    redis_prefix: Annotated[
        str | None, typer.Option(help="Its Redis prefix (default: <prefix>.<name>).")
    ] = None,
    collection: Annotated[
        str | None, typer.Option(help="Its Qdrant collection (default: <collection>_<name>).")
    ] = None,
    encoder_model: Annotated[
        Path | None, typer.Option(help="ONNX encoder for it (default: settings).")
    ] = None,
    encoder_sha256: Annotated[
        str | None, typer.Option(help="That model's sha256 ('' skips the check).")
    ] = None,
    merge_threshold: Annotated[float | None, typer.Option(help="Cluster merge threshold.")] = None,
    create_threshold: Annotated[
        float | None, typer.Option(help="Cluster create threshold.")
    ] = None,
    switch: Annotated[bool, typer.Option(help="Make it active once built.")] = True,
) -> None:
    """Replay memstream.events from the start into a new generation of stores, then switch.

    Settings of the new generation come from MEMSTREAM_* variables (e.g.
    MEMSTREAM_RECURRENCE__MIN_SIMILAR) and these flags; run it again to resume.
    """
    from memstream.ops.rebuild import plan_generation, run_rebuild

    settings = _found_stack(_settings())
    encoder = {
        k: v
        for k, v in (("model_path", encoder_model), ("model_sha256", encoder_sha256))
        if v is not None
    }
    cluster = {
        k: v
        for k, v in (("merge_threshold", merge_threshold), ("create_threshold", create_threshold))
        if v is not None
    }
    derived = settings.model_copy(
        update={
            "encoder": settings.encoder.model_copy(update=encoder),
            "cluster": settings.cluster.model_copy(update=cluster),
        }
    )
    try:
        generation = plan_generation(
            derived, name, redis_prefix=redis_prefix, collection=collection
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    raise typer.Exit(run_rebuild(settings, generation, switch=switch, console=console))


@cli.command()
def switch(
    name: Annotated[str, typer.Argument(help="A built generation, or 'first' for the original.")],
) -> None:
    """Make a built generation the one the RPC serves (workers follow when restarted)."""
    from memstream.generations import activate

    settings = _found_stack(_settings())
    if not settings.redis.url:
        raise typer.BadParameter("no Redis: set MEMSTREAM_REDIS__URL or start `memstream up`")
    try:
        activate(settings.redis.url, settings.redis.prefix, "" if name == "first" else name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(f"active generation: {name}")


@cli.command()
def generations() -> None:
    """The generations built by memstream rebuild, and which one is active."""
    from memstream.generations import generations as recorded

    settings = _found_stack(_settings())
    if not settings.redis.url:
        raise typer.BadParameter("no Redis: set MEMSTREAM_REDIS__URL or start `memstream up`")
    found, active = recorded(settings.redis.url, settings.redis.prefix)
    console.print(f"{'*' if not active else ' '} first  prefix {settings.redis.prefix}")
    for g in found:
        mark = "*" if g.name == active else " "
        console.print(
            f"{mark} {g.name}  {g.state}  prefix {g.redis_prefix}  collection {g.collection}"
            f"  events {sum(g.log_end.values())}  model {g.encoder.get('model_path') or 'default'}"
        )


@cli.command()
def search(
    user: Annotated[str, typer.Argument(help="User id.")],
    query: Annotated[str, typer.Argument(help="What the bot wants to know.")],
    url: Annotated[str, typer.Option(help="RPC base URL.")] = "http://127.0.0.1:8080",
    api_key: Annotated[str, typer.Option(envvar="MEMSTREAM_API_KEY")] = DEMO_API_KEY,
    budget: Annotated[int, typer.Option(help="Context budget in tokens.")] = 512,
    context: Annotated[
        bool, typer.Option("--context", help="Print the assembled context instead.")
    ] = False,
) -> None:
    """Ask a running memstream for a user's memories: the items, or the assembled context."""
    from memstream.client import MemoryClient

    with _service_errors(url), MemoryClient(url, api_key) as client:
        answer = client.retrieve(user, query, budget_tokens=budget)
    if context:  # exactly what a bot would paste into its prompt
        console.print(answer.context, markup=False, highlight=False)
        return
    for item in answer.items:
        console.print(f"[bold]{item.kind}[/] {item.score:.3f} ", end="")
        console.print(item.text, markup=False, highlight=False, soft_wrap=True)
    found = _plural(len(answer.items), "item") if answer.items else f"nothing about {user} yet"
    console.print(
        f"[dim]{found}; context {answer.context_tokens} tokens in {answer.took_ms:.1f} ms "
        "(--context prints it)[/]",
        soft_wrap=True,
    )


@cli.command()
def forget(
    user: Annotated[str, typer.Argument(help="User id.")],
    url: Annotated[str, typer.Option(help="RPC base URL.")] = "http://127.0.0.1:8080",
    api_key: Annotated[str, typer.Option(envvar="MEMSTREAM_API_KEY")] = DEMO_API_KEY,
) -> None:
    """Forget a user everywhere (Redis, Qdrant, pending triggers, in-flight events).

    A tombstone keeps replays from bringing the user back; a replay run with
    ``--restore-forgotten`` lifts it.
    """
    from memstream.client import MemoryClient

    with _service_errors(url), MemoryClient(url, api_key) as client:
        gone = client.forget(user)
    console.print(
        f"forgot {user}: {_plural(gone.redis_keys_deleted, 'Redis key')}, "
        f"{_plural(gone.memories_deleted, 'memory', 'memories')} "
        "(a replay skips its earlier events unless run with --restore-forgotten)",
        soft_wrap=True,
    )


@contextlib.contextmanager
def _service_errors(url: str) -> Iterator[None]:
    """What went wrong talking to a running memstream, as one line with the fix."""
    import httpx
    import pydantic

    from memstream.client import MemstreamError, detail_text

    try:
        yield
    except MemstreamError as exc:
        if exc.status in (401, 403):
            _fail(
                f"the API key was refused ({exc.status}): {exc.reason} — pass --api-key KEY "
                "or set MEMSTREAM_API_KEY"
            )
        if exc.status == 404:
            _fail(f"memstream answered 404 ({exc.reason}) — is {url} the RPC's base URL?")
        _fail(f"memstream answered {exc.status}: {exc.reason}")
    except httpx.TimeoutException:
        _fail(f"memstream at {url} did not answer in time — is it overloaded? (see {url}/readyz)")
    except httpx.HTTPError:  # refused, unreachable, bad URL
        _fail(f"no memstream at {url} — is `make run` running? (or pass --url)")
    except pydantic.ValidationError as exc:
        if exc.title.endswith("Request"):  # the client checks what it sends, before sending
            _fail(f"invalid request: {detail_text(exc.errors())}")
        _fail(f"{url} answered, but not as memstream does — is it the RPC's base URL?")


@cli.command(
    hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def bench() -> None:
    """Moved: the benchmark harness is not installed with memstream."""
    _fail("the benchmarks run from a checkout, not the installed memstream: `make bench`")


@cli.command()
def top(
    url: Annotated[str, typer.Option(help="A process's /metrics URL.")] = (
        "http://127.0.0.1:8080/metrics"
    ),
    interval: Annotated[float, typer.Option(help="Seconds between frames.")] = 2.0,
    frames: Annotated[
        int | None, typer.Option(help="Stop after N frames (default: never).")
    ] = None,
) -> None:
    """A live view of rates and latencies from a running process's /metrics."""
    import httpx

    from memstream.ops.top import run_top

    try:
        code = run_top(url, interval_s=interval, frames=frames, console=console)
    except httpx.HTTPError:
        _fail(f"no memstream metrics at {url} — is `make run` running? (or pass --url)")
    except ValueError:  # the parser's complaint: the page is not Prometheus text
        _fail(f"{url} is not a /metrics page — pass a process's metrics URL with --url")
    raise typer.Exit(code)


@schemas_cli.command("export")
def export_schemas(
    out: Annotated[Path, typer.Argument(help="Folder for the JSON Schema files.")] = Path(
        "memstream/schemas/json"
    ),
) -> None:
    """Write one JSON Schema file per topic value and RPC body (for bots in other languages)."""
    from memstream import schemas

    out.mkdir(parents=True, exist_ok=True)
    for name in schemas.__all__:
        model = getattr(schemas, name)
        if isinstance(model, type) and hasattr(model, "model_json_schema"):
            (out / f"{name}.json").write_text(
                json.dumps(model.model_json_schema(), indent=2) + "\n"
            )
            console.print(f"wrote {out / (name + '.json')}")


@schemas_cli.command("openapi")
def export_openapi(
    out: Annotated[Path, typer.Argument(help="Where to write the document.")] = Path(
        "docs/openapi.json"
    ),
) -> None:
    """Write the RPC's OpenAPI document (the one ``GET /openapi.json`` serves)."""
    from memstream.rpc.openapi import write

    console.print(f"wrote {write(out)}")


def main() -> None:
    """The ``memstream`` command. Once a command has ended, the process exits with its code
    within ``process_exit.EXIT_GRACE_S``, whatever thread or destructor would hang the exit."""
    try:
        cli()
    except SystemExit as done:
        exit_within(0 if done.code is None else done.code if isinstance(done.code, int) else 1)
        raise
