"""An embedded Valkey restarted on its own folder stays up (and keeps its data)."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import redis

from memstream.stores.embedded import EmbeddedRedis


def test_restarted_valkey_survives_its_old_server_object(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        redis.Redis.from_url(server.url).set("k", "v")
        server.stop()
        server.start()
        # The stopped server object is collected now; it used to SIGTERM whatever daemon
        # the shared pidfile named (the new one), after a 5 s grace.
        gc.collect()
        time.sleep(0.5)
        client = redis.Redis.from_url(server.url)
        assert client.get("k") == b"v"
        assert client.ping()
    finally:
        server.stop()
