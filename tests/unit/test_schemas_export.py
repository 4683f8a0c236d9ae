"""The committed JSON Schema files (for bots in other languages) match the pydantic models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from memstream import schemas

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "memstream" / "schemas" / "json"
MODELS = [
    getattr(schemas, name)
    for name in schemas.__all__
    if isinstance(getattr(schemas, name), type) and issubclass(getattr(schemas, name), BaseModel)
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_committed_schema_is_current(model: type[BaseModel]) -> None:
    committed = json.loads((SCHEMA_DIR / f"{model.__name__}.json").read_text())
    assert committed == model.model_json_schema(), "run `make schemas` and commit the result"


def test_every_topic_value_has_a_schema() -> None:
    for topic in schemas.TOPICS:
        assert (SCHEMA_DIR / f"{topic.value.__name__}.json").exists(), topic.name
