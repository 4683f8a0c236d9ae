"""The faust worker logs at the configured level: no debug record is built at ``warning``
(faust's terminal spinner would turn the root logger to DEBUG; ``runtime.faust_worker``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import faust
import pytest

from memstream.runtime import faust_worker


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its level and handlers put back after the test."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_warning_worker_builds_no_debug_records(root_logger: logging.Logger) -> None:
    app = faust.App("logging-test", broker="kafka://127.0.0.1:1", autodiscover=False)
    worker = faust_worker(app, "warning")
    worker._setup_logging()  # what execute_from_commandline does first
    assert root_logger.level == logging.WARNING
    assert not logging.getLogger("aiokafka.conn").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("faust.topics").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("faust.topics").isEnabledFor(logging.WARNING)
