"""The Python client bots import: ``MemoryClient(url, api_key).retrieve(user, query)``, and
``AsyncMemoryClient`` for asyncio bots. It needs httpx, pydantic and ``memstream.schemas``
only, so it also ships alone as ``memstream-client`` (``clients/python/``)."""

from memstream.client._client import (
    MAX_RETRY_AFTER_S,
    AsyncMemoryClient,
    MemoryClient,
    MemstreamError,
    detail_text,
    retry_delay,
)

__all__ = [
    "MAX_RETRY_AFTER_S",
    "AsyncMemoryClient",
    "MemoryClient",
    "MemstreamError",
    "detail_text",
    "retry_delay",
]
