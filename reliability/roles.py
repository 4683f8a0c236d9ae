"""``python -m reliability.roles ROLE...``: one memstream process playing only these roles.

The CLI offers ``worker`` (process), ``consolidator`` and ``serve`` alone; with Qdrant Edge
the consolidator and the RPC must share the process that owns the shard, and no CLI command
plays exactly that pair, so the suite starts its processes through this entry point.

Qdrant outage switch (the one fault the suite cannot make for real): with no Qdrant server
installable here, the long-term store is Edge, in process, and "Qdrant down" would mean
"this process down". With ``RELIABILITY_QDRANT_DOWN_FILE`` set, every long-term call made
while that file exists fails exactly as qdrant-client fails against a server that does not
answer (``ResponseHandlingException`` around an ``httpx.ConnectError``), so the outage path
of the real consolidator and its metrics run unchanged. Nothing outside the suite sets it.
"""

from __future__ import annotations

import logging.config
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from qdrant_client.http.exceptions import ResponseHandlingException

import memstream.wiring
from memstream.logs import logging_config
from memstream.runtime import run_process
from memstream.settings import Settings
from memstream.wiring import ALL_ROLES, Role
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


def _switchable(open_longterm: Callable[..., LongTermStore], down_file: Path) -> Any:
    def opened(*args: Any, **kwargs: Any) -> Any:
        return SwitchableLongTerm(open_longterm(*args, **kwargs), down_file)

    return opened


def main(argv: list[str]) -> int:
    roles = frozenset(r for r in ALL_ROLES if r in argv)
    if not roles or len(roles) != len(set(argv)):
        print(f"usage: python -m reliability.roles {{{'|'.join(sorted(ALL_ROLES))}}}...")
        return 2
    settings = Settings()
    down_file = os.environ.get("RELIABILITY_QDRANT_DOWN_FILE")
    if down_file:
        # wiring looks ``open_longterm`` up when it builds the process's dependencies
        memstream.wiring.open_longterm = _switchable(open_longterm, Path(down_file))  # type: ignore[attr-defined]
    logging.config.dictConfig(logging_config(settings.log_level))
    chosen: frozenset[Role] = roles
    return run_process(settings, chosen)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
