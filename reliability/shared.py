"""One running deployment that the request-level families (bad input, poison, isolation,
fuzzing, load) share, so the suite pays for starting memstream's processes once."""

from __future__ import annotations

import contextlib

import httpx

from reliability.cluster import Deployment
from reliability.core import Context

# Clear API keys of the tenants the suite plays; the demo key is then refused.
API_KEYS = {"key-acme": "acme", "key-globex": "globex", "key-initech": "initech"}
KEY_OF = {tenant: key for key, tenant in API_KEYS.items()}


def service(ctx: Context) -> Deployment:
    deployment = ctx.shared.get("service")
    if deployment is None:
        deployment = Deployment(ctx.root / "service", api_keys=API_KEYS)
        ctx.shared["service"] = deployment
        ctx.on_exit.append(deployment.stop)
        deployment.start_services()
        deployment.start("stream")
        deployment.start("memory")
    assert isinstance(deployment, Deployment)
    return deployment


def client(
    deployment: Deployment, tenant: str | None = "acme", timeout_s: float = 30
) -> httpx.Client:
    headers = {"Authorization": f"Bearer {KEY_OF[tenant]}"} if tenant else {}
    return httpx.Client(base_url=deployment["memory"].url, headers=headers, timeout=timeout_s)


def close_all(ctx: Context) -> None:
    for stop in reversed(ctx.on_exit):
        with contextlib.suppress(Exception):
            stop()
    ctx.on_exit.clear()
