"""Structured logs: one JSON object per line, with the record's extras (event_id, stage, ...).

``logging_config(level)`` is a ``dictConfig`` used by the CLI and handed to the faust worker,
so that every process, and faust's own loggers, write the same JSON lines to stderr.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extras, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def logging_config(level: str) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }


def event_id_of(value: bytes) -> str | None:
    """The ``event_id`` inside a message (an event, or an encoded event), when there is one."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    found = data.get("event_id") or (data.get("event") or {}).get("event_id")
    return str(found) if found else None
