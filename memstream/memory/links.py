"""Links between related memories of one user: shared entity keys or close vectors.

A link is stored on both memories (``links`` holds the other's id), so either one leads to
the other at retrieval time. Only entity keys (``order:A-10293``, ``email:...``) count as
shared keys: the distinctive words a consolidator also lists as keys ("refund") are shared
by too many unrelated memories to mean anything. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memstream.schemas import ConsolidatedMemory


@dataclass(frozen=True)
class LinkParams:
    similarity: float = 0.8  # cosine between memory vectors above which two are related
    max_links: int = 8  # per memory; the oldest links are dropped first

    def __post_init__(self) -> None:
        if not -1.0 <= self.similarity <= 1.0 or self.max_links < 1:
            raise ValueError("similarity must lie in [-1, 1] and max_links be >= 1")


def entity_keys(memory: ConsolidatedMemory) -> list[str]:
    """The memory's keys that name an entity (``kind:value``)."""
    return [k for k in memory.keys if ":" in k and not k.startswith(("topic:", "entity:"))]


def related_ids(
    memory: ConsolidatedMemory,
    nearest: Iterable[tuple[ConsolidatedMemory, float]],
    sharing_keys: Iterable[ConsolidatedMemory],
    params: LinkParams,
) -> list[str]:
    """Ids of the same user's memories related to ``memory``: key-sharing ones first, then by
    similarity (above the bound), best first; never itself, at most ``max_links``."""
    own = set(entity_keys(memory))
    found: dict[str, None] = {}
    for other in sharing_keys:
        if _same_user(memory, other) and own & set(entity_keys(other)):
            found[other.memory_id] = None
    for other, score in sorted(nearest, key=lambda pair: -pair[1]):
        if _same_user(memory, other) and score >= params.similarity:
            found[other.memory_id] = None
    found.pop(memory.memory_id, None)
    return list(found)[: params.max_links]


def linked(
    memory: ConsolidatedMemory, ids: Sequence[str], params: LinkParams
) -> ConsolidatedMemory:
    """``memory`` with ``ids`` added to its links (newest last, bounded); itself if none is new."""
    new = [i for i in dict.fromkeys(ids) if i not in memory.links and i != memory.memory_id]
    if not new:
        return memory
    links = [*memory.links, *new][-params.max_links :]
    return memory.model_copy(update={"links": links})


def _same_user(a: ConsolidatedMemory, b: ConsolidatedMemory) -> bool:
    return a.tenant_id == b.tenant_id and a.user_id == b.user_id
