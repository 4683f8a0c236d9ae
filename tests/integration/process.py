"""Run a real ``memstream up`` process against the test session's broker and Valkey."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from memstream.settings import DEMO_API_KEY, Settings
from stores.embedded import free_port

T = TypeVar("T")


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process these settings: every field that differs
    from its default, as ``MEMSTREAM_SECTION__FIELD`` (JSON for lists and maps)."""
    env: dict[str, str] = {}
    ours = settings.model_dump(mode="json")
    for name, field in Settings.model_fields.items():
        value, default = ours[name], field.get_default(call_default_factory=True)
        if isinstance(value, dict) and not isinstance(getattr(settings, name), dict):
            section_default = default.model_dump(mode="json")
            for key, item in value.items():
                if item != section_default.get(key) and item != "**********":
                    env[f"MEMSTREAM_{name.upper()}__{key.upper()}"] = _env_value(item)
        elif value != (default if not hasattr(default, "__fspath__") else str(default)):
            env[f"MEMSTREAM_{name.upper()}"] = _env_value(value)
    return env


def _env_value(value: object) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


@dataclass
class MemstreamProcess:
    settings: Settings
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.rpc.port}"

    def start(self, timeout_s: float = 90.0) -> MemstreamProcess:
        env = {**os.environ, **settings_env(self.settings)}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstream", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        wait_for(lambda: self._healthy(), timeout_s, f"memstream up (log: {self.log_path})")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"memstream exited {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
            )
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {DEMO_API_KEY}"}, timeout=10
        )


def with_free_port(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"rpc": settings.rpc.model_copy(update={"port": free_port()})}
    )


def wait_for(check: Callable[[], T | bool | None], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result  # type: ignore[return-value]
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
