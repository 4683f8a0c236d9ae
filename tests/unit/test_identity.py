"""Every store names a user by ``schemas.identity.user_key``: no two distinct (tenant, user)
pairs the schema accepts may share a Kafka key, a Redis hash tag or key, or a point id."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memstream.schemas import InteractionEvent
from memstream.schemas.common import (
    MAX_TENANT_CHARS,
    MAX_USER_ID_CHARS,
    normal_user_id,
    tenant_problem,
)
from memstream.schemas.identity import key_problem, parse_user_key, scoped, user_key
from memstream.stores.longterm import memory_point_id, turn_point_id
from memstream.stores.redis_state import user_tag

TS = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

tenants = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}\Z")
# Characters that were separators, escapes or hash-tag braces, any script, case pairs.
_tricky = st.sampled_from([":", "%", "%3A", "{", "}", "@", "+", " ", ".", "-", "Z", "z", "é", "名"])
_any = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def _valid_user(text: str) -> bool:
    try:
        return normal_user_id(text) == text
    except ValueError:
        return False


users = (
    st.lists(st.one_of(_tricky, _any), min_size=1, max_size=MAX_USER_ID_CHARS)
    .map("".join)
    .filter(_valid_user)
)
pairs = st.tuples(tenants, users)


def names(tenant: str, user: str) -> dict[str, str]:
    """Every name a store gives the user (or one of its records)."""
    return {
        "kafka key": InteractionEvent(
            event_id="e1",
            tenant_id=tenant,
            user_id=user,
            session_id="s",
            role="user",
            text="hi",
            ts=TS,
        ).user_key,
        "hash tag": user_tag(tenant, user),
        "redis key": f"ms:{user_tag(tenant, user)}:turn:e1",
        "memory point": memory_point_id(tenant, user, "entity:order:A-1"),
        "turn point": turn_point_id(tenant, user, "e1"),
    }


@settings(max_examples=400, deadline=None, database=None)
@given(a=pairs, b=pairs)
def test_distinct_users_share_no_name_in_any_store(a: tuple[str, str], b: tuple[str, str]) -> None:
    if a == b:
        return
    for kind, name in names(*a).items():
        assert name != names(*b)[kind], kind


@settings(max_examples=400, deadline=None, database=None)
@given(pair=pairs)
def test_a_user_key_parses_back_and_its_hash_tag_is_the_whole_key(pair: tuple[str, str]) -> None:
    key = user_key(*pair)
    assert parse_user_key(key) == pair
    assert key.count(":") == 1
    tag = user_tag(*pair)
    assert tag == "{" + key + "}"
    assert "{" not in key
    assert "}" not in key


def test_the_collision_of_the_security_report_cannot_happen() -> None:
    # ("acme", "eu:bob") and ("acme:eu", "bob") were one user; the second is no tenant now.
    assert tenant_problem("acme:eu") is not None
    assert tenant_problem("acme") is None
    assert user_key("acme", "eu:bob") != user_key("acme", "eu%3Abob")
    assert memory_point_id("acme", "eu:bob", "k") != memory_point_id("acme", "eu", "bob:k")
    assert scoped("acme", "eu:bob", "k") != scoped("acme", "eu", "bob:k")


def test_ids_of_the_old_alphabet_without_a_colon_keep_their_keys() -> None:
    # Existing data stays where it is for them: only ids holding ':' moved.
    assert user_key("acme", "u-1.x@example.com+tag") == "acme:u-1.x@example.com+tag"
    assert user_tag("acme", "u1") == "{acme:u1}"


def test_user_ids_are_nfc_normalised_and_case_sensitive() -> None:
    composed, decomposed = "Zo\u00eb", "Zoe\u0308"
    assert unicodedata.normalize("NFC", decomposed) == composed
    event = InteractionEvent(
        event_id="e1",
        tenant_id="acme",
        user_id=decomposed,
        session_id="s",
        role="user",
        text="hi",
        ts=TS,
    )
    assert event.user_id == composed
    assert user_key("acme", decomposed) == user_key("acme", composed)
    assert user_key("acme", "Bob") != user_key("acme", "bob")


@pytest.mark.parametrize(
    "user",
    [
        "",
        " bob",
        "bob ",
        "a/b",
        "a\\b",
        ".",
        "..",
        "a\u200bb",
        "a\nb",
        "x" * (MAX_USER_ID_CHARS + 1),
    ],
)
def test_user_ids_that_cannot_be_stored_or_routed_are_refused(user: str) -> None:
    with pytest.raises(ValidationError):
        InteractionEvent(
            event_id="e1",
            tenant_id="acme",
            user_id=user,
            session_id="s",
            role="user",
            text="hi",
            ts=TS,
        )


@pytest.mark.parametrize(
    "user",
    ["bob@example.com", "+44 20 7946 0958", "3f2b7c1e-8d4a-4b6e-9f0a-1c2d3e4f5a6b", "王小明"],
)
def test_customer_ids_of_every_usual_kind_are_accepted(user: str) -> None:
    assert normal_user_id(user) == user


def test_tenant_names_are_checked() -> None:
    assert tenant_problem("x" * (MAX_TENANT_CHARS + 1)) is not None
    assert tenant_problem("-acme") is not None
    assert tenant_problem("acme_eu.1") is None


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (None, "no key"),
        (b"\xff\xfe", "not UTF-8"),
        (b"acme", "malformed"),
        (b"acme:eu:bob:x", "malformed"),
        (b"acme:bob", "another user"),
        (b"globex:eu%3Abob", "another tenant"),
    ],
)
def test_a_record_key_that_is_not_its_bodys_user_is_named(key: bytes | None, words: str) -> None:
    owner = user_key("acme", "eu:bob")
    problem = key_problem(key, owner)
    assert problem is not None
    assert words in problem
    assert key_problem(owner.encode(), owner) is None
    assert key_problem(b"acme:eu:bob", owner) is None  # the key a producer wrote before


@settings(max_examples=400, deadline=None, database=None)
@given(a=pairs, b=pairs, keys=st.tuples(st.text(min_size=1), st.text(min_size=1)))
def test_distinct_memories_of_distinct_users_share_no_point_id(
    a: tuple[str, str], b: tuple[str, str], keys: tuple[str, str]
) -> None:
    # A memory key holds ':' ("entity:order:A-1"): the user's part must still end unambiguously.
    if (*a, keys[0]) != (*b, keys[1]):
        assert memory_point_id(*a, keys[0]) != memory_point_id(*b, keys[1])
        assert turn_point_id(*a, keys[0]) != turn_point_id(*b, keys[1])
