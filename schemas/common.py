"""Field types shared by the topic and RPC models."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, StringConstraints

# Ids travel in Redis keys and Qdrant payloads: a safe, bounded alphabet keeps them inert.
Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]*$")
]

MAX_TEXT_CHARS = 8000
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC)
MAX_CLOCK_SKEW = timedelta(days=1)


def _no_control_chars(text: str) -> str:
    if any(ord(c) < 32 and c not in "\n\t\r" for c in text):
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
