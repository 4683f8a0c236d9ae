"""Where pure CPU work runs: a few threads of its own, off the event loop.

Deciding an event, building archived turns and extractive consolidation are pure Python
over texts up to the size limit (milliseconds, tens at the worst). Off the loop, health
checks and retrievals are served meanwhile; on threads of their own rather than asyncio's
default executor, they never queue ahead of what waits there (the encoder calls of
encode and of the RPC's queries). One thread per core: more would only share the GIL.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="memstream-cpu")


async def off_loop(work: Callable[[], T]) -> T:
    """``work()`` on a CPU thread; the caller's loop goes on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, work)
