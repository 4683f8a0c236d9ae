"""``python -m reliability.roles run --roles R``: ``memstream run`` with a Qdrant outage switch.

The suite starts its processes through ``memstream.launch`` with this module as the entry
(``Process(..., entry=ENTRY)``); it takes the same ``run --roles`` as the CLI.

Qdrant outage switch (the one fault the suite cannot make for real): with no Qdrant server
installable here, the long-term store is Edge, in process, and "Qdrant down" would mean
"this process down". With ``RELIABILITY_QDRANT_DOWN_FILE`` (``QDRANT_DOWN_ENV``) set, every
long-term call made while that file exists fails exactly as qdrant-client fails against a
server that does not answer (``ResponseHandlingException`` around an
``httpx.ConnectError``), so the outage path of the real consolidator and its metrics run
unchanged. The store comes in through ``run_process``'s ``open_store`` seam (off by
default). Nothing outside the suite sets it.
"""

from __future__ import annotations

import logging.config
import os
import sys
from pathlib import Path
from typing import Any, cast

import httpx
from qdrant_client.http.exceptions import ResponseHandlingException

from memstream.logs import logging_config
from memstream.process_exit import exit_within
from memstream.roles import parse_roles
from memstream.runtime import run_process
from memstream.settings import QdrantSettings, Settings
from memstream.stores.longterm import LongTermStore
from memstream.wiring import LongTermOpener, open_longterm

ENTRY = "reliability.roles"
QDRANT_DOWN_ENV = "RELIABILITY_QDRANT_DOWN_FILE"


class SwitchableLongTerm:
    """A long-term store that is unreachable while ``down_file`` exists."""

    def __init__(self, store: LongTermStore, down_file: Path) -> None:
        self._store = store
        self._down_file = down_file

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name == "close":
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self._down_file.exists():
                raise ResponseHandlingException(httpx.ConnectError("Qdrant unreachable (fault)"))
            return await attr(*args, **kwargs)

        return call


def switchable_opener(down_file: Path) -> LongTermOpener:
    """``open_longterm``, its store wrapped in a ``SwitchableLongTerm`` on ``down_file``."""

    def opened(settings: QdrantSettings, data_dir: Path) -> LongTermStore:
        # The wrapper forwards every attribute: it is the store's Protocol by delegation.
        return cast(LongTermStore, SwitchableLongTerm(open_longterm(settings, data_dir), down_file))

    return opened


def main(argv: list[str]) -> int:
    """``run --roles R``, as ``memstream run`` takes it (``memstream.launch`` starts both)."""
    if len(argv) != 3 or argv[:2] != ["run", "--roles"]:
        print("usage: python -m reliability.roles run --roles ROLE[,ROLE...]")
        return 2
    try:
        roles = parse_roles(argv[2])
    except ValueError as exc:
        print(exc)
        return 2
    settings = Settings()
    down_file = os.environ.get(QDRANT_DOWN_ENV)
    opener = switchable_opener(Path(down_file)) if down_file else open_longterm
    logging.config.dictConfig(logging_config(settings.log_level))
    code = run_process(settings, roles, open_store=opener)
    exit_within(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
