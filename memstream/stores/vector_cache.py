"""The Edge store's in-process copy of its users' memory vectors (for exact top-k in
numpy) and lookup keys (for ``find_by_keys`` without a filtered scroll).

Qdrant Edge's user-filtered search walks the payload index and scores each point from its
mmapped vectors: ~1.1-2 ms for a 10k-memory user in a 1M store here (scoring only a
handful of ids picked in numpy still costs 0.5 ms, with the user filter 1.6), against
~0.7 ms for one numpy pass over the user's vectors held as a matrix. So
``QdrantEdgeStore.search`` ranks a cached user's vectors in numpy and reads only the top-k
payloads from the shard (``retrieve``: ~0.15 ms). The scores are float64 cosines of
Edge's own stored float32 vectors: they differ from Edge's float32 ones by rounding
(~1e-7), so only points that tie to that precision could come back in another order.

What is cached is what the shard holds (the vectors are read back from it, never taken
from a caller). The cache is kept exact by the store itself: one process owns an Edge
shard, so every write goes through its ``QdrantEdgeStore``, which tells this cache about
every point it adds, re-vectors, re-keys or deletes (``put`` / ``rekey`` / ``drop``); a
load that a write overlapped is thrown away (``begin`` / ``store``). Entries are keyed by
(tenant, user), and an entry only holds the points a tenant-and-user-filtered scroll
returned; every payload read back is checked to be the owner's again.

Bounded by memory (``max_bytes``, an estimate per user: its matrix, ids and keys), least
recently searched users out first; a user over the whole budget is not cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# Bytes per cached point beyond its vector: the id string and its table entries, its
# lookup keys (a memory has one or two) and their index entries.
POINT_OVERHEAD_BYTES = 400

# How far a float32 cosine of two unit vectors may sit from the exact one: rounding over
# 384 products is at most ~2.3e-5; candidates within this of the cut are re-scored.
SCORE_MARGIN = 1e-4

Owner = tuple[str, str]  # (tenant_id, user_id)


def point_bytes(dim: int) -> int:
    """What one cached point of ``dim`` floats costs, its spare capacity given back."""
    return 4 * dim + POINT_OVERHEAD_BYTES


@dataclass
class UserVectors:
    """One user's memory ids and unit vectors, id ``i`` in column ``i`` (capacity grows by
    doubling).

    Column per point, not row: ``query @ matrix`` is BLAS's axpy-style gemv, which streams
    the matrix; the row-major product is its dot-per-row gemv, which on one BLAS thread
    (memstream's setting) ran 4x slower once a user's vectors outgrew the cache (10k x 384
    float32 on an AMD EPYC: p50 2.0 -> 0.49 ms; 1k: 0.038 -> 0.034 ms).
    """

    dim: int
    ids: list[str] = field(default_factory=list)
    columns: dict[str, int] = field(default_factory=dict)  # id -> its column in ``matrix``
    matrix: npt.NDArray[np.float32] = field(init=False)  # (dim, capacity)
    # The points' lookup keys (the payload's ``keys``), both ways: ``with_keys`` answers
    # ``find_by_keys`` without the shard's filtered scroll (~0.3-0.45 ms a query).
    keys_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ids_by_key: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.matrix = np.zeros((self.dim, 0), dtype=np.float32)

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes) + POINT_OVERHEAD_BYTES * len(self.ids)

    @property
    def trimmed_nbytes(self) -> int:
        """What ``nbytes`` will be once ``trim`` gave back the spare capacity."""
        return len(self.ids) * point_bytes(self.dim)

    def put(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        keys: Sequence[Sequence[str]],
    ) -> None:
        """Set the vectors and lookup keys of ``ids`` (a known id is overwritten, a new
        one appended)."""
        for point_id, point_keys in zip(ids, keys, strict=True):
            self.rekey(point_id, point_keys)
        for point_id, vector in zip(ids, vectors, strict=True):
            column = self.columns.get(point_id)
            if column is None:
                column = len(self.ids)
                if column == self.matrix.shape[1]:
                    grown = np.zeros((self.dim, max(16, 2 * column)), dtype=np.float32)
                    grown[:, :column] = self.matrix[:, :column]
                    self.matrix = grown
                self.columns[point_id] = column
                self.ids.append(point_id)
            self.matrix[:, column] = vector

    def rekey(self, point_id: str, keys: Sequence[str]) -> None:
        """The lookup keys of ``point_id`` are now ``keys``."""
        for key in self.keys_of.get(point_id, ()):
            holders = self.ids_by_key[key]
            holders.discard(point_id)
            if not holders:
                del self.ids_by_key[key]
        self.keys_of[point_id] = tuple(dict.fromkeys(keys))
        for key in self.keys_of[point_id]:
            self.ids_by_key.setdefault(key, set()).add(point_id)

    def with_keys(self, keys: Sequence[str]) -> list[str]:
        """The ids holding any of ``keys``, in Edge's scroll order (canonical UUID
        strings sort as their 128-bit values)."""
        found: set[str] = set()
        for key in keys:
            found.update(self.ids_by_key.get(key, ()))
        return sorted(found)

    def trim(self) -> None:
        """Give back the spare capacity (a loaded user is rarely written again soon)."""
        if self.matrix.shape[1] > len(self.ids):
            self.matrix = self.matrix[:, : len(self.ids)].copy()

    def top(self, query: npt.NDArray[np.float32], limit: int) -> list[tuple[str, float]]:
        """The ``limit`` best (id, cosine), best first, ties by id (as ``QdrantEdgeStore``
        orders Edge's hits).

        One float32 pass ranks every point; it only picks candidates, those within
        ``SCORE_MARGIN`` of the ``limit``-th best. The candidates are then scored again
        in float64: those scores, and so the answer, do not depend on how the float32
        pass rounded.
        """
        n = len(self.ids)
        if n == 0 or limit <= 0:
            return []
        # float32 and whatever BLAS's rounding: the candidates near the cut are re-scored
        # in float64 below. (memstream's processes run BLAS on one thread:
        # ``memstream.runtime.tune_process_threads``.)
        rough: npt.NDArray[np.float32] = query @ self.matrix[:, :n]
        if limit < n:
            kth = np.partition(rough, n - limit)[n - limit]
            picked = np.flatnonzero(rough >= kth - SCORE_MARGIN)
        else:
            picked = np.arange(n)
        candidates = self.matrix[:, picked].T.astype(np.float64)  # (picked, dim), C order
        exact = (candidates * query.astype(np.float64)).sum(axis=1)
        found = sorted((-float(exact[j]), self.ids[i]) for j, i in enumerate(picked))[:limit]
        return [(point_id, -minus) for minus, point_id in found]


class VectorCache:
    """``UserVectors`` per (tenant, user), LRU within ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._users: OrderedDict[Owner, UserVectors] = OrderedDict()
        # Owners being loaded, with a count bumped by every write to them: a load that saw
        # a write start is stale when it ends (``store`` refuses it), so none is missed.
        # Only loads in progress are tracked, so this never grows with the user count.
        self._loading: dict[Owner, int] = {}

    def __contains__(self, owner: Owner) -> bool:
        return owner in self._users

    def __len__(self) -> int:
        return len(self._users)

    def get(self, owner: Owner) -> UserVectors | None:
        entry = self._users.get(owner)
        if entry is not None:
            self._users.move_to_end(owner)
        return entry

    def begin(self, owner: Owner) -> int:
        """A load of ``owner`` starts; its token for ``store``."""
        self._loading.setdefault(owner, 0)
        return self._loading[owner]

    def abandon(self, owner: Owner) -> None:
        self._loading.pop(owner, None)

    def store(self, owner: Owner, entry: UserVectors, token: int) -> bool:
        """Keep ``entry`` (loaded since ``begin`` gave ``token``) if no write came
        meanwhile and it fits; True when kept."""
        if self._loading.pop(owner, None) != token or entry.nbytes > self.max_bytes:
            return False
        self._forget(owner)
        entry.trim()
        self._users[owner] = entry
        self.nbytes += entry.nbytes
        while self.nbytes > self.max_bytes:
            _, gone = self._users.popitem(last=False)
            self.nbytes -= gone.nbytes
        return True

    def touch(self, owner: Owner) -> None:
        """Points of ``owner`` were written: a load of it in progress is stale."""
        if owner in self._loading:
            self._loading[owner] += 1

    def put(
        self,
        owner: Owner,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        keys: Sequence[Sequence[str]],
    ) -> None:
        """Points of ``owner`` written (added or re-vectored) with these stored vectors
        and lookup keys."""
        self.touch(owner)
        entry = self._users.get(owner)
        if entry is None or not ids:
            return
        before = entry.nbytes
        entry.put(ids, vectors, keys)
        self.nbytes += entry.nbytes - before
        if self.nbytes > self.max_bytes:
            self._forget(owner)

    def rekey(self, owner: Owner, point_id: str, keys: Sequence[str]) -> None:
        """A point of ``owner`` was rewritten (payload only) with these lookup keys."""
        self.touch(owner)
        entry = self._users.get(owner)
        if entry is not None and point_id in entry.columns:
            entry.rekey(point_id, keys)

    def drop(self, owner: Owner) -> None:
        """Points of ``owner`` deleted: its entry goes (the next search reloads it)."""
        self.touch(owner)
        self._forget(owner)

    def clear(self) -> None:
        """Forget everything, loads in progress included."""
        for owner in list(self._users):
            self._forget(owner)
        for owner in self._loading:
            self._loading[owner] += 1

    def _forget(self, owner: Owner) -> None:
        gone = self._users.pop(owner, None)
        if gone is not None:
            self.nbytes -= gone.nbytes
