"""Long-term memory store: the `LongTermStore` Protocol and the helpers both backends share
(`memstream.wiring.open_longterm` picks a backend from settings: the backends import this
module, never the other way round).

Backends: `stores.qdrant_edge_store` (Qdrant Edge in-process, the embedded default) and
`stores.qdrant_client_store` (qdrant-client against a server, or its `:memory:` local
mode). Both store one point per memory, id = `memory_id`, with payload indexes on
`PAYLOAD_INDEXES`, and float indexes on two fields derived from the memory on every write:
`DUE_FIELD` (every open action's due time, `memory.reminders.due_times`) lets `due_between`
read only the memories with something due, and `DECAY_FIELD` (the time its strength last
decayed to) lets `decay_due` read only the memories a whole decay interval behind, instead
of scanning them all. The payload is either the memory's structured JSON dump
(the client backend: browsable in Qdrant's UI) or, compact, only the indexed fields plus
the whole memory as one JSON string in `MEMORY_JSON_FIELD` (Edge: its bindings convert
payloads value by value, so one string instead of a nested tree makes writes and reads
several times faster). `from_payload` reads both forms. `tests/integration/
test_longterm_contract.py` runs one contract suite against both and compares them.

The same store holds the turn archive: every turn a user said, one point per turn (id =
`turn_point_id`), in a second collection beside the memories (`<collection>_turns`).
It is what keeps a turn retrievable after it left short-term memory in Redis: the
archive worker (`workers.archive`) writes every encoded turn through, and the RPC's turn
index (`stores.turn_index`) reads a user's archive once and ranks it with the hot turns.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memstream.memory.reminders import due_times
from memstream.schemas.identity import scoped
from memstream.schemas.memories import ConsolidatedMemory, StoredTurn

# Fixed for the life of the project: changing it would orphan every stored memory id.
MEMORY_ID_NAMESPACE = uuid.UUID("466e5047-0907-4f05-9bdc-ef5ba26a895a")

# Payload fields with a keyword index; the bool marks the tenant (partitioning) field.
PAYLOAD_INDEXES: tuple[tuple[str, bool], ...] = (
    ("tenant_id", True),
    ("user_id", False),
    ("key", False),
    ("keys", False),
)

# The compact payload's copy of the whole memory (a JSON string, never indexed).
MEMORY_JSON_FIELD = "memory_json"

# The due times of a memory's open actions (epoch seconds, float-indexed; absent when none
# has one). Derived from the memory on every write, never read back into it. A range
# condition on it matches a memory when any one of its due times is in the range.
DUE_FIELD = "due_ts"
# The range `due_between` asks the index for is this much wider on each side than the one
# it was given, so a datetime's float rounding can never drop a memory; the caller's exact
# rule (`due_reminders`) decides what is due.
DUE_SLACK_S = 1.0
# The time a memory's strength last decayed to (`decayed_to`, or `created_at` before its
# first decay), epoch seconds, float-indexed. Derived like `DUE_FIELD`; `decay_due` widens
# its bound by `DUE_SLACK_S` and the caller's exact rule (`memory.strength.decayed`) decides.
# Not backfilled (every memory would need a write: ~10 min at 1M before a store could open):
# a memory stored before the field existed is read by `decay_due` until a rewrite adds it.
DECAY_FIELD = "decay_from_ts"
# Fields of the store's, never of the memory's (which forbids unknown fields).
DERIVED_FIELDS = (DUE_FIELD, DECAY_FIELD)

# Fixed too: the archive's point ids. Another namespace than memories', so a turn's id can
# never equal a memory's.
TURN_ID_NAMESPACE = uuid.UUID("9a4f7c52-5b1e-4d0c-8f63-2e7d1b0a6c39")
# The archive's indexed fields (bool: the tenant field); its payload also holds the turn
# as one JSON string and its float16 embedding (hex), exactly what the hot tier holds.
TURN_PAYLOAD_INDEXES: tuple[tuple[str, bool], ...] = (("tenant_id", True), ("user_id", False))
TURN_JSON_FIELD = "turn_json"
TURN_VECTOR_FIELD = "emb_f16"
TURNS_SUFFIX = "_turns"

Payload = dict[str, Any]


def memory_point_id(tenant_id: str, user_id: str, key: str) -> str:
    """The deterministic id of a user's memory for `key`: re-consolidating updates, never adds."""
    return str(uuid.uuid5(MEMORY_ID_NAMESPACE, scoped(tenant_id, user_id, key)))


def turn_point_id(tenant_id: str, user_id: str, event_id: str) -> str:
    """The archive's id of a user's turn: writing the same event again replaces it."""
    return str(uuid.uuid5(TURN_ID_NAMESPACE, scoped(tenant_id, user_id, event_id)))


@dataclass(frozen=True)
class ArchivedTurn:
    """A turn as the archive keeps it: the owner, the turn, its unit embedding."""

    tenant_id: str
    user_id: str
    turn: StoredTurn
    vector: np.ndarray  # float32; stored as float16 like the hot tier, so read back equal


@dataclass(frozen=True)
class ScoredMemory:
    memory: ConsolidatedMemory
    score: float  # cosine similarity in [-1, 1], higher is better


class MemoryStore(Protocol):
    """The consolidated memories: what consolidation writes, the RPC reads, the maintenance
    workers age and remind from. Its rules are ``LongTermStore``'s."""

    async def upsert(self, memories: Sequence[tuple[ConsolidatedMemory, np.ndarray]]) -> None: ...

    async def get(self, tenant_id: str, user_id: str, memory_id: str) -> ConsolidatedMemory | None:
        """One memory by id (the backends inherit this: it is ``get_many`` of one)."""
        found = await self.get_many(tenant_id, user_id, [memory_id])
        return found[0] if found else None

    async def get_many(
        self, tenant_id: str, user_id: str, memory_ids: Sequence[str]
    ) -> list[ConsolidatedMemory]:
        """The memories found, in the order asked, missing or foreign ids skipped."""
        ...

    async def search(
        self, tenant_id: str, user_id: str, vector: np.ndarray, limit: int
    ) -> list[ScoredMemory]: ...

    async def find_by_keys(
        self, tenant_id: str, user_id: str, keys: Sequence[str], limit: int
    ) -> list[ConsolidatedMemory]:
        """Memories whose payload `keys` contains any of `keys` (exact keyword match)."""
        ...

    async def list_user(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]: ...

    async def count(self, tenant_id: str | None = None, user_id: str | None = None) -> int: ...

    async def rewrite(self, memories: Sequence[ConsolidatedMemory]) -> int:
        """Replace stored memories in place, keeping their vectors (strength, links: fields
        that do not change what a memory says). Ids not stored, or stored for another tenant
        or user than the memory names, are skipped; returns how many were written."""
        ...

    async def scan(
        self, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        """Every memory of every tenant, in point-id order, paged like `list_user`.

        For operators' tools and checks, never for serving a user; the maintenance workers
        read through `due_between` and `decay_due` instead.
        """
        ...

    async def due_between(
        self, since: datetime, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        """The memories of every tenant with an open action due in [since, until] (and
        possibly a few due within `DUE_SLACK_S` of it), in point-id order, paged like
        `scan`. Read through the `DUE_FIELD` index, not a scan; for the reminders worker,
        which applies the exact rule to each."""
        ...

    async def decay_due(
        self, tenant_id: str, user_id: str, until: datetime, limit: int, offset: str | None = None
    ) -> tuple[list[ConsolidatedMemory], str | None]:
        """One user's memories whose strength last decayed to `until` or earlier (and
        possibly a few within `DUE_SLACK_S` after it, and any stored before `DECAY_FIELD`
        existed), in point-id order, paged like `list_user`. Read through the `DECAY_FIELD`
        index, not a scan; for the decay worker, which applies the exact rule to each and
        rewrites what it read (a rewrite stores the field)."""
        ...

    async def delete_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every memory of one user; returns how many there were."""
        ...


class TurnArchive(Protocol):
    """Every turn, written through by the archive worker: what the RPC's turn index and
    consolidation read once a turn has left the hot tier. Same rules as memories: every read
    is filtered by tenant AND user; writes before ``ensure_collection`` (which creates the
    archive too) raise RuntimeError; reads before it see nothing."""

    async def upsert_turns(self, turns: Sequence[ArchivedTurn]) -> int:
        """Archive turns, idempotent by (tenant, user, event id): the same turn again
        replaces it (last occurrence in a batch wins). A vector is float16-rounded on the
        way in, so `list_turns` hands back exactly what the hot tier in Redis holds; a
        vector of another size than `dim` is a `ValueError`. Returns the distinct turns."""
        ...

    async def list_turns(
        self, tenant_id: str, user_id: str, limit: int, offset: str | None = None
    ) -> tuple[list[ArchivedTurn], str | None]:
        """One user's archived turns in point-id order, paged like `list_user`."""
        ...

    async def get_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str]
    ) -> list[ArchivedTurn]:
        """The archived turns of `event_ids`, in the order asked, missing ones skipped
        (for readers of turns that left the hot tier, e.g. consolidation)."""
        ...

    async def count_turns(self, tenant_id: str | None = None, user_id: str | None = None) -> int:
        """How many turns are archived (of a tenant, of a user)."""
        ...

    async def delete_turns(
        self, tenant_id: str, user_id: str, event_ids: Sequence[str] | None = None
    ) -> int:
        """Delete one user's archived turns (a forget), or only those of `event_ids`;
        returns how many there were."""
        ...


@runtime_checkable
class LongTermStore(MemoryStore, TurnArchive, Protocol):
    """Consolidated long-term memories, one point per memory in one collection.

    Contract, identical for every backend:

    - Every read is filtered by tenant AND user: no call ever returns (or counts, or
      deletes) another user's or another tenant's memory, even given its id.
    - `upsert` is idempotent by `memory_id` (a canonical UUID string, normally
      `memory_point_id(tenant, user, key)`): the same id again replaces the memory,
      never duplicates it; within one batch the last occurrence wins.
    - Vectors are unit-norm float32 of the `dim` given to `ensure_collection`; a vector of
      another size is a `ValueError`.
    - Search scores are cosine similarity, higher is better, on the same scale in every
      backend.
    - `ensure_collection` creates the collection or checks an existing one (a different
      `dim` is a `ValueError`); it is idempotent. Reads before the collection exists see
      an empty store; writes before `ensure_collection` (on a store that does not exist
      yet) raise `RuntimeError`.
    - `list_user`, `scan`, `due_between`, `decay_due` and `find_by_keys` return memories
      in point-id order; all but `find_by_keys` page with an opaque string offset, None
      after the last page.
    - Every memory write (`upsert`, `upsert_bulk`, `rewrite`) stores the `DERIVED_FIELDS`
      from the memory, so a re-dated or done action, or a decay, is re-indexed by that
      write; `ensure_collection` fills in `DUE_FIELD` once for memories stored before it
      existed (few have one), and indexes `DECAY_FIELD` without filling it in.
    """

    async def ensure_collection(self, dim: int) -> None: ...

    async def ping(self) -> bool:
        """True when the backend answers and the collection is usable."""
        ...

    async def close(self) -> None: ...


# --- helpers shared by the backends -------------------------------------------------


def canonical_id(memory_id: str) -> str | None:
    """`memory_id` if it is a canonical UUID string (Qdrant's point id form), else None."""
    try:
        canonical = str(uuid.UUID(memory_id))
    except (ValueError, TypeError, AttributeError):
        return None
    return canonical if canonical == memory_id else None


def check_page(limit: int, offset: str | None, method: str) -> None:
    """Arguments of a paged read (``list_user``, ``scan``): ValueError names the bad one."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    if offset is not None and canonical_id(offset) is None:
        raise ValueError(f"not an offset from {method}: {offset!r}")


def due_range(since: datetime, until: datetime) -> tuple[float, float]:
    """The epoch-second bounds `due_between` filters `DUE_FIELD` on (widened by the slack)."""
    if since > until:
        raise ValueError("since must not be after until")
    return since.timestamp() - DUE_SLACK_S, until.timestamp() + DUE_SLACK_S


def decay_until(until: datetime) -> float:
    """The epoch-second bound `decay_due` filters `DECAY_FIELD` on (widened by the slack)."""
    return until.timestamp() + DUE_SLACK_S


def derived_fields(memory: ConsolidatedMemory) -> Payload:
    """The `DERIVED_FIELDS` of a memory (`DUE_FIELD` left out when no action has a due time)."""
    fields: Payload = {DECAY_FIELD: (memory.decayed_to or memory.created_at).timestamp()}
    times = due_times(memory)
    if times:
        fields[DUE_FIELD] = times
    return fields


def with_derived(memory: ConsolidatedMemory, payload: Payload) -> Payload:
    """`payload` with the memory's `DERIVED_FIELDS`."""
    payload.update(derived_fields(memory))
    return payload


def missing_due(payload: Payload | None) -> list[float]:
    """The due times to fill in on a point stored before `DUE_FIELD` existed (none when
    it has the field already, or nothing is due)."""
    if payload is None or DUE_FIELD in payload:
        return []
    return due_times(from_payload(payload))


def as_vector(vector: np.ndarray, dim: int | None) -> list[float]:
    """A 1-d finite float32 vector of `dim` (when known) as the list both clients take."""
    array = np.asarray(vector, dtype=np.float32)
    if array.ndim != 1 or (dim is not None and array.shape[0] != dim):
        raise ValueError(f"expected a vector of shape ({dim},), got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("vector has non-finite values")
    result: list[float] = array.tolist()
    return result


def prepare_points(
    memories: Sequence[tuple[ConsolidatedMemory, np.ndarray]],
    dim: int | None,
    payload: Callable[[ConsolidatedMemory], Payload] | None = None,
) -> list[tuple[str, list[float], Payload]]:
    """Validated (id, vector, payload) triples, one per memory id, the last occurrence winning.

    Deduplicating here keeps "last wins" true for both backends: what a single batch with
    a repeated id does is not something either engine documents. `payload` builds each
    point's payload (default: the structured `to_payload`).
    """
    make_payload = payload or to_payload
    by_id: dict[str, tuple[str, list[float], Payload]] = {}
    for memory, vector in memories:
        if canonical_id(memory.memory_id) is None:
            raise ValueError(f"memory_id must be a canonical UUID string: {memory.memory_id!r}")
        by_id.pop(memory.memory_id, None)  # re-insert so batch order follows the last write
        by_id[memory.memory_id] = (memory.memory_id, as_vector(vector, dim), make_payload(memory))
    return list(by_id.values())


def turns_name(collection: str) -> str:
    """The archive beside a memories collection (or Edge shard directory)."""
    return collection + TURNS_SUFFIX


def as_float16(vector: np.ndarray) -> np.ndarray:
    """The hot tier's float16 rounding of a vector, back as float32."""
    rounded: np.ndarray = np.asarray(vector, dtype=np.float16).astype(np.float32)
    return rounded


def prepare_turn_points(
    turns: Sequence[ArchivedTurn], dim: int | None
) -> list[tuple[str, list[float], Payload]]:
    """Validated (id, vector, payload) triples, one per turn, the last occurrence winning."""
    by_id: dict[str, tuple[str, list[float], Payload]] = {}
    for archived in turns:
        point_id = turn_point_id(archived.tenant_id, archived.user_id, archived.turn.event_id)
        rounded = as_float16(np.asarray(archived.vector, dtype=np.float32))
        values = as_vector(rounded, dim)
        payload: Payload = {
            "tenant_id": archived.tenant_id,
            "user_id": archived.user_id,
            TURN_JSON_FIELD: archived.turn.model_dump_json(),
            TURN_VECTOR_FIELD: rounded.astype(np.float16).tobytes().hex(),
        }
        by_id.pop(point_id, None)
        by_id[point_id] = (point_id, values, payload)
    return list(by_id.values())


def turn_from_payload(payload: Payload | None) -> ArchivedTurn:
    """The archived turn in a payload written by `prepare_turn_points`."""
    data = payload or {}
    emb = bytes.fromhex(str(data[TURN_VECTOR_FIELD]))
    return ArchivedTurn(
        tenant_id=str(data["tenant_id"]),
        user_id=str(data["user_id"]),
        turn=StoredTurn.model_validate_json(str(data[TURN_JSON_FIELD])),
        vector=np.frombuffer(emb, dtype=np.float16).astype(np.float32),
    )


def to_payload(memory: ConsolidatedMemory) -> Payload:
    """The structured payload: every field of the memory as JSON values (and its due times)."""
    return with_derived(memory, memory.model_dump(mode="json"))


def to_compact_payload(memory: ConsolidatedMemory) -> Payload:
    """The indexed fields as values, the whole memory as one JSON string beside them."""
    payload: Payload = {
        "tenant_id": memory.tenant_id,
        "user_id": memory.user_id,
        "key": memory.key,
        "keys": list(memory.keys),
        MEMORY_JSON_FIELD: memory.model_dump_json(),
    }
    return with_derived(memory, payload)


def from_payload(payload: Payload | None) -> ConsolidatedMemory:
    """The memory in a payload of either form (compact or structured)."""
    if payload is not None:
        dumped = payload.get(MEMORY_JSON_FIELD)
        if isinstance(dumped, str):
            return ConsolidatedMemory.model_validate_json(dumped)
    fields = {k: v for k, v in (payload or {}).items() if k not in DERIVED_FIELDS}
    return ConsolidatedMemory.model_validate(fields)


def owned_by(payload: Payload | None, tenant_id: str, user_id: str) -> bool:
    """Reads by id bypass filters, so the owner is checked on the payload itself."""
    return (
        payload is not None
        and payload.get("tenant_id") == tenant_id
        and payload.get("user_id") == user_id
    )
