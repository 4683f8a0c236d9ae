"""``python -m reliability.roles ROLE...``: one memstream process playing only these roles.

The CLI offers ``worker`` (process), ``consolidator`` and ``serve`` alone; with Qdrant Edge
the consolidator and the RPC must share the process that owns the shard, and no CLI command
plays exactly that pair, so the suite starts its processes through this entry point.

Qdrant outage switch (the one fault the suite cannot make for real): with no Qdrant server
installable here, the long-term store is Edge, in process, and "Qdrant down" would mean
"this process down". With ``RELIABILITY_QDRANT_DOWN_FILE`` set, every long-term call made
while that file exists fails exactly as qdrant-client fails against a server that does not
answer (``ResponseHandlingException`` around an ``httpx.ConnectError``), so the outage path
of the real consolidator and its metrics run unchanged. The store comes in through
``run_process``'s ``open_store`` seam (off by default). Nothing outside the suite sets it.
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
from memstream.runtime import run_process
from memstream.settings import QdrantSettings, Settings
from memstream.wiring import ALL_ROLES, LongTermOpener, Role
from stores.longterm import LongTermStore, open_longterm


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
    roles = frozenset(r for r in ALL_ROLES if r in argv)
    if not roles or len(roles) != len(set(argv)):
        print(f"usage: python -m reliability.roles {{{'|'.join(sorted(ALL_ROLES))}}}...")
        return 2
    settings = Settings()
    down_file = os.environ.get("RELIABILITY_QDRANT_DOWN_FILE")
    opener = switchable_opener(Path(down_file)) if down_file else open_longterm
    logging.config.dictConfig(logging_config(settings.log_level))
    chosen: frozenset[Role] = roles
    return run_process(settings, chosen, open_store=opener)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
