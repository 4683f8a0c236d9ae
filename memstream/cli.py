"""The ``memstream`` command line. Settings come from MEMSTREAM_* variables (see settings.py)."""

from __future__ import annotations

import asyncio
import json
import logging.config
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from memstream.logs import logging_config
from memstream.settings import DEMO_API_KEY, Settings
from memstream.wiring import ALL_ROLES, Role

if TYPE_CHECKING:  # runtime pulls in faust: imported only by the commands that run it
    from memstream.runtime import Job, RunningProcess

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
schemas_cli = typer.Typer(no_args_is_help=True, help="JSON Schema of every topic and RPC body.")
cli.add_typer(schemas_cli, name="schemas")
console = Console()

Port = Annotated[int | None, typer.Option(help="RPC port (default: settings, 8080).")]


def _settings(port: int | None = None) -> Settings:
    settings = Settings()
    if port is not None:
        settings = settings.model_copy(
            update={"rpc": settings.rpc.model_copy(update={"port": port})}
        )
    logging.config.dictConfig(logging_config(settings.log_level))  # JSON lines on stderr
    return settings


def _run(settings: Settings, roles: frozenset[Role], job: Job | None = None) -> None:
    from memstream.runtime import run_process

    raise typer.Exit(run_process(settings, roles, job=job))


@cli.command()
def up(
    port: Port = None,
    replay: Annotated[
        Path | None, typer.Option(help="Replay this JSONL file once started.")
    ] = None,
) -> None:
    """Start the embedded stack and every role in this process; serve until Ctrl-C."""
    settings = _settings(port)

    async def announce(running: RunningProcess) -> int:
        from memstream.demo import replay_sample

        await running.api_ready.wait()
        if replay is not None:
            await replay_sample(running, replay)
        url = f"http://{settings.rpc.host}:{settings.rpc.port}"
        console.print(
            f"\n[bold green]memstream is serving on {url}[/] (Ctrl-C stops it)\n"
            f"  curl -s {url}/v1/retrieve -H 'Authorization: Bearer {DEMO_API_KEY}' "
            "-H 'Content-Type: application/json' \\\n"
            '    -d \'{"user_id": "cust-ana", "query": "What is the status of order A-10293?"}\'\n'
            f"  metrics: {url}/metrics   docs: {url}/docs"
        )
        await asyncio.Event().wait()  # serve until the worker is stopped
        return 0

    _run(settings, ALL_ROLES, announce)


@cli.command()
def demo(port: Port = None) -> None:
    """Start everything, replay the bundled sample, ask the example questions, stop."""
    from memstream.demo import run_demo

    _run(_settings(port), ALL_ROLES, run_demo)


@cli.command()
def worker() -> None:
    """Stream processors (encode, memorize) against the configured broker and Redis."""
    _run(_settings(), frozenset({"process"}))


@cli.command()
def consolidator() -> None:
    """Consolidation workers against the configured broker, Redis and Qdrant."""
    _run(_settings(), frozenset({"consolidate"}))


@cli.command()
def serve(port: Port = None) -> None:
    """The retrieval API alone (needs an external broker, Redis and Qdrant server)."""
    from memstream.runtime import serve_standalone

    asyncio.run(serve_standalone(_settings(port)))


@cli.command()
def replay(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL of events.")],
    broker: Annotated[
        str | None, typer.Option(help="kafka://host:port (default: settings).")
    ] = None,
) -> None:
    """Publish a JSONL file of InteractionEvents to memstream.events, with a progress bar."""
    from memstream.replay import replay_file

    settings = _settings()
    url = broker or settings.kafka.broker
    if not url:
        raise typer.BadParameter("no broker: pass --broker or set MEMSTREAM_KAFKA__BROKER")
    sent = asyncio.run(replay_file(file, url, settings.topic("events")))
    console.print(f"sent {sent} events to {settings.topic('events')}")


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
    from memstream.rebuild import plan_generation, run_rebuild

    settings = _settings()
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
    from memstream.rebuild import activate

    settings = _settings()
    if not settings.redis.url:
        raise typer.BadParameter("no Redis: set MEMSTREAM_REDIS__URL")
    try:
        activate(settings.redis.url, settings.redis.prefix, "" if name == "first" else name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    console.print(f"active generation: {name}")


@cli.command()
def generations() -> None:
    """The generations built by memstream rebuild, and which one is active."""
    from memstream.rebuild import generations as recorded

    settings = _settings()
    if not settings.redis.url:
        raise typer.BadParameter("no Redis: set MEMSTREAM_REDIS__URL")
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
) -> None:
    """Ask a running memstream for a user's memories and print the assembled context."""
    from rpc.client import MemoryClient

    with MemoryClient(url, api_key) as client:
        answer = client.retrieve(user, query, budget_tokens=budget)
    for item in answer.items:
        console.print(f"[bold]{item.kind}[/] {item.score:.3f} {item.text}")
    header = f"context ({answer.context_tokens} tokens, {answer.took_ms} ms)"
    console.print(f"\n[dim]{header}:[/]\n{answer.context}")


@cli.command()
def forget(
    user: Annotated[str, typer.Argument(help="User id.")],
    url: Annotated[str, typer.Option(help="RPC base URL.")] = "http://127.0.0.1:8080",
    api_key: Annotated[str, typer.Option(envvar="MEMSTREAM_API_KEY")] = DEMO_API_KEY,
) -> None:
    """Forget a user everywhere (Redis, Qdrant, pending triggers, in-flight events)."""
    from rpc.client import MemoryClient

    with MemoryClient(url, api_key) as client:
        gone = client.forget(user)
    console.print(
        f"forgot {user}: {gone.redis_keys_deleted} Redis keys, {gone.memories_deleted} memories"
    )


@cli.command()
def bench(
    quick: Annotated[bool, typer.Option(help="Small smoke run (CI): same code, small N.")] = False,
    only: Annotated[
        list[str] | None, typer.Option(help="Run only this benchmark (repeatable).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Markdown path; JSON and plots go beside it.")
    ] = None,
) -> None:
    """Run the benchmark suite; write BENCHMARKS.md, its plots and the raw numbers as JSON."""
    from bench.runner import main as run_benchmarks

    raise typer.Exit(run_benchmarks(quick=quick, only=only, out=out))


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
    from memstream.top import run_top

    raise typer.Exit(run_top(url, interval_s=interval, frames=frames, console=console))


@schemas_cli.command("export")
def export_schemas(
    out: Annotated[Path, typer.Argument(help="Folder for the JSON Schema files.")] = Path(
        "schemas/json"
    ),
) -> None:
    """Write one JSON Schema file per topic value and RPC body (for bots in other languages)."""
    import schemas

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
    from rpc.openapi import write

    console.print(f"wrote {write(out)}")


def main() -> None:
    cli()
