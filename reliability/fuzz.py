"""Fuzzing: schemathesis generates requests from the served OpenAPI document (valid and
invalid ones) for every operation; not one may get a server error.

Bounded: a fixed number of examples per operation, no example database, deadline off (the
2-core machine is shared). Authenticated with a real key, so the handlers are reached.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings

from reliability.cluster import Deployment
from reliability.core import Context, Row
from reliability.shared import KEY_OF, service

NAME = "fuzz"


def fuzz(deployment: Deployment, examples: int) -> tuple[int, list[str], list[float]]:
    base = deployment["memory"].url
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    headers = {"Authorization": f"Bearer {KEY_OF['acme']}"}
    calls = 0
    failures: list[str] = []
    latencies: list[float] = []
    for result in schema.get_all_operations():
        calls += _fuzz_operation(result.ok(), base, headers, examples, failures, latencies)
    return calls, failures, latencies


async def run(ctx: Context) -> list[Row]:
    deployment = service(ctx)
    calls, failures, latencies = await asyncio.to_thread(fuzz, deployment, 20 if ctx.quick else 120)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    note = (
        f"schemathesis {schemathesis.__version__}, {calls} generated requests over every operation"
    )
    note += f" of /openapi.json; server errors: {len(failures)}" + (
        " — " + "; ".join(sorted(set(failures))[:6]) if failures else ""
    )
    return [
        Row(
            "fuzzing: schemathesis vs /openapi.json",
            calls,
            errors=len(failures),
            p99_ms=p99,
            promised=("errors",),
            note=note,
        )
    ]


def _fuzz_operation(
    operation: Any,
    base: str,
    headers: dict[str, str],
    examples: int,
    failures: list[str],
    latencies: list[float],
) -> int:
    calls = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def call(case: Any) -> None:
        nonlocal calls
        started = time.perf_counter()
        response = case.call(base_url=base, headers=headers, timeout=30)
        latencies.append((time.perf_counter() - started) * 1000)
        calls += 1
        if response.status_code >= 500:
            failures.append(
                f"{operation.method.upper()} {operation.path} -> {response.status_code} "
                f"({str(case.body)[:80]!r}, {case.path_parameters}, {case.query})"
            )

    call()
    return calls
