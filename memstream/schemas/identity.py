"""The one string that names a user in every store, and its inverse.

A user is the pair (tenant, user id). Kafka keys, Redis hash tags and key names, long-term
point ids and the consumers' per-user state all name it by one string, so the composition
must be injective over every pair the schema accepts: ``("acme", "eu:bob")`` and
``("acme:eu", "bob")`` must never meet. Each part is percent-encoded (RFC 3986, UTF-8), ':'
included, before the parts are joined by ':'; an encoded part holds no ':', '{' or '}', so
the key splits back at its one ':' and a Redis hash tag ``{key}`` ends where it should.

Ids of the old ASCII alphabet without ':' encode to themselves: their keys, tags and point
ids are what they were. Only ids holding ':' (ambiguous before) move; see the README.
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

SEPARATOR = ":"
# Kept as they are besides RFC 3986's unreserved characters: the rest of the old alphabet.
_KEPT = "@+"


def _part(value: str) -> str:
    # NFC as the schema stores ids, so a producer's decomposed spelling keys the same user.
    return quote(unicodedata.normalize("NFC", value), safe=_KEPT, encoding="utf-8", errors="strict")


def user_key(tenant_id: str, user_id: str) -> str:
    """The user's name in every store: ``tenant:user``, each part percent-encoded."""
    return f"{_part(tenant_id)}{SEPARATOR}{_part(user_id)}"


def scoped(tenant_id: str, user_id: str, name: str) -> str:
    """A name within the user (a memory key, an event id): the seed of a point id.

    ``name`` comes last and unencoded: the user's part ends at the key's one ':'."""
    return f"{user_key(tenant_id, user_id)}{SEPARATOR}{name}"


class UserKeyed:
    """A record of one user (``tenant_id``, ``user_id``), keyed by ``user_key`` on its topic.

    A plain mixin: the fields are the model's own (declared for type checkers only, so
    pydantic's field order stays the model's)."""

    if TYPE_CHECKING:
        tenant_id: str
        user_id: str

    @property
    def user_key(self) -> str:
        return user_key(self.tenant_id, self.user_id)


def parse_user_key(key: str) -> tuple[str, str]:
    """(tenant, user) of a key ``user_key`` made, or ValueError for any other string."""
    tenant, sep, user = key.partition(SEPARATOR)
    if not sep or not tenant or not user:
        raise ValueError(f"not a 'tenant:user' key: {key[:80]!r}")
    pair = unquote(tenant, errors="strict"), unquote(user, errors="strict")
    if user_key(*pair) != key:  # a second ':', a stray '%' or an encoding not ours
        raise ValueError(f"not a 'tenant:user' key in memstream's encoding: {key[:80]!r}")
    return pair


def key_problem(record_key: bytes | None, owner: str) -> str | None:
    """Why a record keyed ``record_key`` cannot carry a body of user ``owner`` (None: it can).

    The key routes the record (its partition, so its processor and its user's state): a key
    that names another user, or none, would put one user's turn in another's order. The
    key a producer wrote before ids were encoded (``tenant:user`` as they are) is accepted
    for its own body, so a log from then can still be rebuilt."""
    if record_key is None:
        return f"record has no key (expected {owner!r}, the body's tenant and user)"
    try:
        text = record_key.decode("utf-8")
    except UnicodeDecodeError:
        return "record key is not UTF-8"
    owner_pair = parse_user_key(owner)
    if text == owner or text == SEPARATOR.join(owner_pair):
        return None
    try:
        tenant = parse_user_key(text)[0]
    except ValueError:
        return f"malformed record key {text[:80]!r} (expected {owner!r})"
    which = "tenant" if tenant != owner_pair[0] else "user"
    return f"record key {text[:80]!r} names another {which} than the body ({owner!r})"
