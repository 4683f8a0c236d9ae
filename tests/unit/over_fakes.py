"""What the unit tests over fakes share: one hash encoder, qdrant-client's in-process
``:memory:`` store, and a turn written to the short-term fake the way memorize writes it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from memstream.schemas import StoredTurn
from memstream.stores.longterm import LongTermStore
from memstream.stores.qdrant_client_store import QdrantClientStore
from memstream.stores.short_term import UserUpdate
from tests.fakes import FakeShortTermState, HashEncoder

ENCODER = HashEncoder(dim=64)


async def memory_store() -> AsyncIterator[LongTermStore]:
    """The ``longterm`` fixture's body: a fresh in-process store sized for ``ENCODER``."""
    store = QdrantClientStore(":memory:", "memories")
    await store.ensure_collection(ENCODER.dim)
    yield store
    await store.close()


async def put_hot(state: FakeShortTermState, tenant: str, user: str, turn: StoredTurn) -> None:
    """``turn`` in the user's hot tier, with its text's hash vector."""
    vector = ENCODER.encode([turn.text])[0]
    await state.apply(tenant, user, UserUpdate(event_id=turn.event_id, turn=turn, vector=vector))
