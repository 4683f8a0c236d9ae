"""Crashes: SIGKILL each memstream process in turn mid-stream, restart it, lose nothing.

SIGKILL gives no chance to drain, commit offsets or flush: the restarted process re-reads
from the last committed offsets, so it sees events and triggers again. Idempotent writes
(processed-event marks, deterministic trigger and memory ids) must make that harmless.

Each kill fires at a share of the stream's turns stored (reliability/progress.py): the
processors at 25% and 75%, restarted at once (no turn is stored while they are down); the
consolidator + RPC from 50% to 60%, so triggers pile up for a tenth of the stream before
it is back; its RPC is probed at 65%.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from memstream.settings import DEMO_API_KEY
from reliability.cluster import Deployment
from reliability.core import Context, Row
from reliability.pipeline import faults_label, run_pipeline, stream_file
from reliability.progress import Fault

NAME = "crashes"


def _kill_and_restart(name: str, at: float) -> Fault:
    async def fault(deployment: Deployment) -> str:
        process = deployment[name]
        process.kill()
        began = time.monotonic()
        await asyncio.to_thread(process.restart)
        return f"SIGKILL {name}, back in {time.monotonic() - began:.1f} s"

    return Fault(f"SIGKILL {name}, restarted", at, fault)


def _killed_between(name: str, at: float, until: float) -> Fault:
    async def kill(deployment: Deployment) -> str:
        deployment[name].kill()
        return f"SIGKILL {name}"

    async def restart(deployment: Deployment) -> str:
        began = time.monotonic()
        await asyncio.to_thread(deployment[name].restart)
        return f"{name} started again in {time.monotonic() - began:.1f} s"

    return Fault(f"SIGKILL {name}, down", at, kill, until, restart)


def rpc_errors(deployment: Deployment, users: list[tuple[str, str]]) -> int:
    """Server errors from the restarted RPC over a few retrievals (it must answer at once)."""
    errors = 0
    with httpx.Client(
        base_url=deployment["memory"].url,
        headers={"Authorization": f"Bearer {DEMO_API_KEY}"},
        timeout=30,
    ) as client:
        for _tenant, user in users[:20]:
            answer = client.post("/v1/retrieve", json={"user_id": user, "query": "my order"})
            errors += answer.status_code != 200
    return errors


async def run(ctx: Context) -> list[Row]:
    n = 300 if ctx.quick else 5000
    root = ctx.root / NAME
    path, events = stream_file(root, n)
    deployment = Deployment(root)
    users = sorted({(e["tenant_id"], e["user_id"]) for e in events})
    errors = 0
    try:
        faults: list[Fault] = [
            _kill_and_restart("stream", 0.25),
            _killed_between("memory", 0.5, 0.6),
            _kill_and_restart("stream", 0.75),
        ]

        async def probe_rpc(d: Deployment) -> str:
            nonlocal errors
            bad = rpc_errors(d, users)
            errors += bad
            return f"RPC after its restart: {bad} errors in {min(20, len(users))} retrievals"

        faults.append(Fault("RPC probed after its restart", 0.65, probe_rpc))
        outcome = await run_pipeline(
            deployment, path, events, faults, settle_timeout_s=240 if ctx.quick else 720
        )
    finally:
        deployment.stop()
    ctx.say("; ".join(outcome.log))
    errors += 0 if outcome.settled else 1
    note = (
        f"{'; '.join(outcome.log)}. After settling ({outcome.seconds:.0f} s): "
        f"{outcome.verdict.detail}." + ("" if outcome.settled else " NOT SETTLED.")
    )
    return [
        Row(
            f"crash: {faults_label(outcome.spans)}",
            n,
            lost=outcome.verdict.lost,
            duplicated=outcome.verdict.duplicated,
            errors=errors,
            note=note,
            spans=tuple(outcome.spans),
        )
    ]
