"""Generations of the derived stores: their records in Redis, the settings a process runs
as, and the follower that moves a running API to the active one.

A rebuild (``memstream.ops.rebuild``) builds a new **generation** beside the one serving
now: its own Redis prefix and Qdrant collection, its own derived topics and consumer
groups. The active generation is one Redis key, ``<base prefix>:generation:active``, naming
one of the records in the hash ``<base prefix>:generations`` (JSON: name, Redis prefix,
collection, encoder and thresholds). Every process resolves it when it starts; the RPC also
follows it while running (``GenerationFollower``), so a switch moves retrieval within a few
seconds, and a restart moves workers and consolidators (they then continue the
generation's consumer groups where the rebuild left them). ``memstream switch`` points the
key at another generation, or deletes it to go back to the first.

Here, not in the rebuild tool, because every process needs it: the runtime imports this
module, the rebuild imports the runtime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from memstream.settings import (
    ClusterSettings,
    EncoderSettings,
    RecurrenceSettings,
    Settings,
)
from memstream.stores.redis_client import sync_redis

if TYPE_CHECKING:
    from memstream.rpc.retrieval import Retriever
    from memstream.rpc.server import ApiDeps

log = logging.getLogger("memstream.generations")

S = TypeVar("S", bound=BaseModel)


class Generation(BaseModel):
    """One set of derived stores and the settings that derived them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    redis_prefix: str
    collection: str
    # Whole settings sections as plain JSON: a process of another version keeps the fields
    # it knows (see ``_section``) instead of rejecting the record during a rolling upgrade.
    encoder: dict[str, Any]
    cluster: dict[str, Any]
    recurrence: dict[str, Any]
    state: Literal["building", "ready"] = "building"
    log_end: dict[int, int] = {}  # events partition -> offset caught up with
    updated_at: datetime | None = None


def _section(model: type[S], values: dict[str, Any], name: str) -> S:
    known = {k: v for k, v in values.items() if k in model.model_fields}
    if dropped := sorted(set(values) - set(known)):
        log.warning("generation %s: this version ignores %s settings %s", name, model, dropped)
    return model.model_validate(known)


def apply_generation(base: Settings, generation: Generation | None) -> Settings:
    """The settings a process uses for ``generation`` (``base`` itself for the first one)."""
    if generation is None:
        return base
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"generation": generation.name}),
            "redis": base.redis.model_copy(
                update={
                    "prefix": generation.redis_prefix,
                    "tombstone_prefix": base.redis.tombstone_prefix or base.redis.prefix,
                }
            ),
            "qdrant": base.qdrant.model_copy(update={"collection": generation.collection}),
            "encoder": _section(EncoderSettings, generation.encoder, generation.name),
            "cluster": _section(ClusterSettings, generation.cluster, generation.name),
            "recurrence": _section(RecurrenceSettings, generation.recurrence, generation.name),
        }
    )


# --- the records in Redis (small and rare: a synchronous client is enough) ------------


def _registry_key(base_prefix: str) -> str:
    return f"{base_prefix}:generations"


def _active_key(base_prefix: str) -> str:
    return f"{base_prefix}:generation:active"


def save_generation(redis_url: str, base_prefix: str, generation: Generation) -> None:
    stamped = generation.model_copy(update={"updated_at": datetime.now(UTC)})
    with sync_redis(redis_url) as r:
        r.hset(_registry_key(base_prefix), generation.name, stamped.model_dump_json())


def generations(redis_url: str, base_prefix: str) -> tuple[list[Generation], str]:
    """Every recorded generation by name, and the active one's name ("" = the first)."""
    with sync_redis(redis_url) as r:
        raw: dict[bytes, bytes] = r.hgetall(_registry_key(base_prefix))
        active: bytes | None = r.get(_active_key(base_prefix))
    found = sorted((Generation.model_validate_json(v) for v in raw.values()), key=lambda g: g.name)
    return found, (active or b"").decode()


def active_generation(redis_url: str, base_prefix: str) -> Generation | None:
    with sync_redis(redis_url) as r:
        name: bytes | None = r.get(_active_key(base_prefix))
        if not name:
            return None
        raw: bytes | None = r.hget(_registry_key(base_prefix), name)
    if raw is None:
        log.warning("active generation %r has no record; serving the first", name.decode())
        return None
    return Generation.model_validate_json(raw)


def activate(redis_url: str, base_prefix: str, name: str) -> None:
    """Make ``name`` the active generation ("" = back to the first); it must be ready."""
    with sync_redis(redis_url) as r:
        if not name:
            r.delete(_active_key(base_prefix))
            return
        raw: bytes | None = r.hget(_registry_key(base_prefix), name)
        if raw is None or Generation.model_validate_json(raw).state != "ready":
            raise ValueError(f"generation {name!r} is not built (run memstream rebuild {name})")
        r.set(_active_key(base_prefix), name)


def with_active_generation(base: Settings, redis_url: str) -> Settings:
    """What a starting process runs as: the active generation's settings, if any."""
    return apply_generation(base, active_generation(redis_url, base.redis.prefix))


# --- the RPC follows the active generation ---------------------------------------------


@dataclasses.dataclass
class GenerationFollower:
    """Points a running API's retriever at the active generation's stores when it changes.

    ``retriever_for`` builds the retriever of a generation's settings: the process's
    ``wiring.ServiceBuilder.retriever``, which keeps what it opened for a generation, so a
    switch back reuses it. A switch that fails (an Edge shard still locked by the rebuild
    that is exiting) is tried again at the next poll.
    """

    api: ApiDeps
    base: Settings
    redis_url: str
    current: Settings  # the generation the API serves now
    retriever_for: Callable[[Settings], Awaitable[Retriever]]
    interval_s: float = 2.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:
                log.warning("generation switch failed, retrying: %r", exc)

    async def check(self) -> bool:
        """Switch if the active generation changed; True when it did."""
        generation = await asyncio.to_thread(
            active_generation, self.redis_url, self.base.redis.prefix
        )
        if (generation.name if generation else "") == self.current.kafka.generation:
            return False
        target = apply_generation(self.base, generation)
        self.api.retriever = await self.retriever_for(target)
        log.info(
            "serving generation %s",
            target.kafka.generation or "(first)",
            extra={"redis_prefix": target.redis.prefix, "collection": target.qdrant.collection},
        )
        self.current = target
        return True
