"""A real ``memstream up`` against the test session's broker and Valkey (``memstream.launch``)."""

from __future__ import annotations

from pathlib import Path

import httpx

from memstream.launch import Process, on_free_port, settings_env, wait_for
from memstream.roles import ALL_ROLES
from memstream.settings import DEMO_API_KEY, Settings

__all__ = ["MemstreamProcess", "settings_env", "wait_for", "with_free_port"]


class MemstreamProcess(Process):
    """Every role in one process, its output in ``log_path``; a client on the demo key."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        super().__init__(settings, ALL_ROLES, log_path=log_path)

    def start(self, timeout_s: float = 90.0) -> MemstreamProcess:
        return super().start(timeout_s)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {DEMO_API_KEY}"}, timeout=10
        )


def with_free_port(settings: Settings) -> Settings:
    return on_free_port(settings, ALL_ROLES)
