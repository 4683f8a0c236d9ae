"""The quick part of ``make reliability`` inside ``make test``: bad input and poison messages
against a real two-process memstream (the full suite, with crashes and outages, is
``make reliability``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability import bad_input, poison
from reliability.core import Context
from reliability.shared import close_all

pytestmark = pytest.mark.integration


async def test_bad_input_and_poison_are_dead_lettered_and_block_nothing(tmp_path: Path) -> None:
    ctx = Context(root=tmp_path, quick=True)
    try:
        rows = [*await bad_input.run(ctx), *await poison.run(ctx)]
    finally:
        close_all(ctx)
    assert len(rows) == 3
    for row in rows:
        assert row.ok, (row.fault, row.broken, row.note)
    topic = next(r for r in rows if "topic" in r.fault)
    assert topic.sent > 30  # at least 30 kinds plus the good event behind them
