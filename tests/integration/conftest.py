"""Fixtures shared by the integration tests that run a real ``memstream up`` process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memstream.settings import Settings
from tests.integration.process import MemstreamProcess, with_free_port


@pytest.fixture
def running(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> Iterator[MemstreamProcess]:
    """One ``memstream up`` with default settings on the session's broker and Valkey."""
    process = MemstreamProcess(
        with_free_port(settings_factory()), tmp_path / "memstream.log"
    ).start()
    yield process
    process.stop()
