"""The Qdrant outage switch comes in through wiring's ``open_store`` seam, not a monkeypatch:
the process's dependencies hold the store it opened, and that store fails the way an
unreachable Qdrant server does while the switch file exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from qdrant_client.http.exceptions import ResponseHandlingException

from memstream.metrics import Metrics
from memstream.settings import QdrantSettings, Settings
from memstream.stores.embedded import free_port
from memstream.stores.longterm import LongTermStore
from memstream.streaming.stage import is_outage
from memstream.wiring import ServiceBuilder, Stack
from reliability.roles import SwitchableLongTerm, switchable_opener


async def test_the_opened_store_is_down_while_the_file_exists(tmp_path: Path) -> None:
    down = tmp_path / "qdrant-down"
    store = switchable_opener(down)(QdrantSettings(), tmp_path / "data")
    try:
        await store.ensure_collection(4)
        assert await store.ping()
        down.touch()
        with pytest.raises(ResponseHandlingException) as caught:
            await store.ping()
        assert is_outage(caught.value)  # retried as an outage, never dead-lettered
        down.unlink()
        assert await store.ping()
    finally:
        await store.close()


async def test_dependencies_hold_the_store_the_seam_opened(tmp_path: Path) -> None:
    opened: list[LongTermStore] = []
    opener = switchable_opener(tmp_path / "qdrant-down")

    def recording(settings: QdrantSettings, data_dir: Path) -> LongTermStore:
        opened.append(opener(settings, data_dir))
        return opened[-1]

    settings = Settings(data_dir=tmp_path)
    # Nothing is contacted while building: Redis and the store connect on first use.
    stack = Stack("kafka://127.0.0.1:1", f"redis://127.0.0.1:{free_port()}")
    builder = ServiceBuilder(stack, Metrics(CollectorRegistry()), open_store=recording)
    deps = builder.dependencies(settings)
    try:
        assert opened == [deps.longterm]
        assert isinstance(deps.longterm, SwitchableLongTerm)
    finally:
        await builder.close()
