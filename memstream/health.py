"""``/healthz``, ``/readyz`` and ``/metrics`` of a worker or consolidator process.

The listener runs in its own thread (as prometheus_client's does), so it still answers when
the process's event loop is stuck, and says so:

- ``/healthz`` (liveness): the event loop is alive, i.e. a heartbeat task on it ran within
  ``stale_after_s``, and the faust app has not crashed. A 503 here means "restart me".
- ``/readyz`` (readiness): the broker consumer has joined its group (an assignment was
  received and no rebalance is in progress), and every dependency check (Redis, and Qdrant
  for the consolidator) answers within ``timeout_s``, run on the event loop itself.

The RPC process answers the same paths from its FastAPI app (``rpc/server.py``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import faust
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from memstream.streaming.broker import on_start

Check = Callable[[], Awaitable[bool]]


@dataclass
class Health:
    """What the probes look at; the heartbeat and the join flag are set on the event loop."""

    app: faust.App
    checks: Mapping[str, Check]
    stale_after_s: float = 10.0
    timeout_s: float = 2.0
    beat: float = field(default_factory=time.monotonic)
    joined: bool = False
    loop: asyncio.AbstractEventLoop | None = None

    def attach(self, beat_every_s: float = 1.0) -> None:
        """Register the heartbeat task and the join signal on the app."""

        async def heartbeat() -> None:
            self.loop = asyncio.get_running_loop()
            while True:
                self.beat = time.monotonic()
                await asyncio.sleep(beat_every_s)

        on_start(self.app, heartbeat)

        # mode calls a receiver as receiver(app, assigned, signal=..., **kwargs).
        @self.app.on_partitions_assigned.connect
        async def on_assigned(app: faust.App, /, *_: object, signal: object, **__: object) -> None:
            self.joined = True

    def live(self) -> tuple[bool, dict[str, Any]]:
        age = time.monotonic() - self.beat
        crashed = bool(getattr(self.app, "crashed", False))
        ok = self.loop is not None and age < self.stale_after_s and not crashed
        return ok, {"loop_beat_age_s": round(age, 3), "crashed": crashed}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        checks: dict[str, bool] = {
            "loop": self.live()[0],
            "consumer": self.joined and not bool(getattr(self.app, "rebalancing", False)),
        }
        for name, check in self.checks.items():
            checks[name] = self._run_on_loop(check)
        return all(checks.values()), {"checks": checks}

    def _run_on_loop(self, check: Check) -> bool:
        if self.loop is None or self.loop.is_closed():
            return False

        async def guarded() -> bool:
            return bool(await check())

        future = asyncio.run_coroutine_threadsafe(guarded(), self.loop)
        try:
            return future.result(self.timeout_s)
        except Exception:
            future.cancel()
            return False


def serve_health(
    health: Health, registry: CollectorRegistry, *, host: str, port: int
) -> ThreadingHTTPServer:
    """Start the listener in a daemon thread; the caller shuts it down."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, body = health.live() if path == "/healthz" else health.ready()
                payload = json.dumps({"ok": ok, **body}).encode()
                self._send(200 if ok else 503, payload, "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # probes every few seconds: not worth a log line

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="memstream-health", daemon=True).start()
    return server
