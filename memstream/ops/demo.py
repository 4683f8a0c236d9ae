"""``memstream demo``: replay the bundled sample, ask the example questions, print the answers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from memstream.client import MemoryClient
from memstream.ops.replay import (
    file_users,
    forgotten_hint,
    forgotten_users,
    handled_events,
    registry_counts,
    replay_file,
    wait_until_settled,
)
from memstream.runtime import RunningProcess
from memstream.schemas import RetrieveResponse
from memstream.settings import DEMO_API_KEY

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SAMPLE_STREAM = EXAMPLES / "sample_stream.jsonl"
DEMO_QUESTIONS = EXAMPLES / "demo_questions.json"

console = Console()


async def replay_sample(
    running: RunningProcess, path: Path = SAMPLE_STREAM, *, restore_forgotten: bool = False
) -> bool:
    """Replay ``path`` and wait for the pipeline to settle; False if it did not in time.

    While it settles, the RPC reports the backlog (``/readyz``, ``X-Memstream-Catching-Up``).
    Users forgotten earlier stay forgotten unless ``restore_forgotten`` (see README).
    """
    await running.api_ready.wait()
    users = await asyncio.to_thread(file_users, path)
    forgotten = await forgotten_users(running.deps.state, users, restore=restore_forgotten)
    if forgotten:
        console.print(forgotten_hint(forgotten, restored=restore_forgotten), soft_wrap=True)
    started = time.perf_counter()
    count = registry_counts(running.deps.metrics.registry)
    running.backlog.begin(0, lambda: handled_events(count))
    try:
        sent = await replay_file(
            path, running.stack.broker_url, running.settings.kafka.topic("events")
        )
        running.backlog.expected += sent
        settled = await wait_until_settled(running.deps.metrics, sent)
    finally:
        running.backlog.end()
    took = time.perf_counter() - started
    console.print(
        f"replayed {sent} events in {took:.1f}s ({sent / took:.0f} events/s end to end)"
        + ("" if settled else " — still settling, continuing anyway"),
        soft_wrap=True,
    )
    return settled


def _show(question: str, answer: RetrieveResponse) -> None:
    table = Table(show_header=True, header_style="bold", expand=True)
    table.add_column("kind", width=7)
    table.add_column("score", width=6)
    table.add_column("text", ratio=4)
    table.add_column("source events", ratio=2)
    for item in answer.items[:5]:
        table.add_row(
            item.kind, f"{item.score:.2f}", item.text[:300], ", ".join(item.source_event_ids[:6])
        )
    # The question above the table, not as its title: a title is cropped to the panel's
    # width (80 columns when the output goes to a file), a line wraps.
    console.print(f"[bold]{question}[/] ({answer.took_ms:.1f} ms)", highlight=False)
    console.print(Panel(table))


async def run_demo(running: RunningProcess, *, restore_forgotten: bool = False) -> int:
    await replay_sample(running, restore_forgotten=restore_forgotten)
    questions = json.loads(DEMO_QUESTIONS.read_text())
    url = f"http://{running.settings.rpc.host}:{running.settings.rpc.port}"
    ok = True
    with MemoryClient(url, DEMO_API_KEY) as client:
        for i, q in enumerate(questions):
            answer = await asyncio.to_thread(client.retrieve, q["user_id"], q["question"])
            _show(q["question"], answer)
            if i == 0:
                ok = _check_recurring_order(answer, set(q["expect_event_ids"]))
        first = questions[0]
        answer = await asyncio.to_thread(client.retrieve, first["user_id"], first["question"])
        console.print(Panel(answer.context, title="context handed to the bot (first question)"))
    return 0 if ok else 1


def _check_recurring_order(answer: RetrieveResponse, expected: set[str]) -> bool:
    memories = [i for i in answer.items if i.kind == "memory"]
    if not memories:
        console.print("[red]no consolidated memory answered the recurring-order question[/]")
        return False
    sources = set(memories[0].source_event_ids)
    covered = len(sources & expected)
    console.print(
        f"[green]consolidated memory[/] {memories[0].id} rests on {len(sources)} source events, "
        f"{covered} of the {len(expected)} turns about the order"
    )
    return covered > 0
