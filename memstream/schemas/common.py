"""Field types shared by the topic and RPC models."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

# Event and session ids: a safe, bounded ASCII alphabet keeps them inert in key names.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]*$"
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]

# A tenant is an operator's name for an API key's owner: the same alphabet without ':', so a
# tenant name reads the same in every store (schemas.identity composes ids unambiguously
# whatever they hold; this keeps operators' names plain).
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$"
MAX_TENANT_CHARS = 64
TenantId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TENANT_CHARS, pattern=TENANT_PATTERN)
]


def tenant_problem(name: str) -> str | None:
    """Why ``name`` cannot be a tenant (None: it can); checked when API keys are loaded."""
    if not 1 <= len(name) <= MAX_TENANT_CHARS:
        return f"a tenant name has 1 to {MAX_TENANT_CHARS} characters"
    if not re.fullmatch(TENANT_PATTERN, name):
        return "a tenant name is ASCII letters, digits and _.@+- (no ':'), a letter or digit first"
    return None


MAX_USER_ID_CHARS = 128
USER_ID_RULE = (
    "1-128 characters after Unicode NFC normalisation; letters of any script, digits, "
    "punctuation, symbols and inner spaces; no control or format characters, no '/' or "
    "'\\', not '.' or '..', no leading or trailing whitespace; case-sensitive"
)
# Control (Cc), format (Cf), surrogate (Cs), private-use (Co), unassigned (Cn), line and
# paragraph separators: invisible or unprintable, so two ids that look alike could differ.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def normal_user_id(value: str) -> str:
    """A user id as memstream stores it (NFC), or ValueError saying what is wrong.

    Customer ids are e-mail addresses, UUIDs, phone numbers and names in any script, so the
    alphabet is wide; NFC makes one id of the composed and decomposed spellings of a name.
    Case is kept: ids are the bot's, and ``Bob`` and ``bob`` may be two customers."""
    value = unicodedata.normalize("NFC", value)
    if not 1 <= len(value) <= MAX_USER_ID_CHARS:
        raise ValueError(f"a user id has 1 to {MAX_USER_ID_CHARS} characters")
    if value != value.strip():
        raise ValueError("a user id has no leading or trailing whitespace")
    if "/" in value or "\\" in value or value in {".", ".."}:
        raise ValueError("a user id holds no '/' or '\\' (it is a URL path segment)")
    if any(unicodedata.category(c) in _UNPRINTABLE for c in value):
        raise ValueError("a user id holds no control, format or unassigned characters")
    return value


UserId = Annotated[
    str,
    AfterValidator(normal_user_id),
    Field(description=f"the customer's id: {USER_ID_RULE}"),
]

MAX_TEXT_CHARS = 8000
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC)
MAX_CLOCK_SKEW = timedelta(days=1)


# Searched in C: a Python loop over a 1 MB body's characters held the event loop ~0.1 s.
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _no_control_chars(text: str) -> str:
    if _CONTROL_CHARS.search(text):
        raise ValueError("text contains control characters")
    if not text.strip():
        raise ValueError("text is empty or only whitespace")
    return text


Text = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS),
    AfterValidator(_no_control_chars),
]


def _plausible_time(ts: datetime) -> datetime:
    if ts < EARLIEST_TS:
        raise ValueError(f"timestamp before {EARLIEST_TS.date()} is not plausible")
    if ts > datetime.now(UTC) + MAX_CLOCK_SKEW:
        raise ValueError("timestamp is more than a day in the future")
    return ts


Timestamp = Annotated[AwareDatetime, AfterValidator(_plausible_time)]


class Model(BaseModel):
    """Strict about unknown fields so a typo in a producer fails loudly, not silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)
