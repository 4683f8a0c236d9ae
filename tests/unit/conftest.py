"""Fixtures of the unit tests that run processors, workers and the retriever over fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from memstream.stores.longterm import LongTermStore
from tests.unit.over_fakes import memory_store


@pytest.fixture
async def longterm() -> AsyncIterator[LongTermStore]:
    async for store in memory_store():
        yield store
