"""The API's OpenAPI document, built from the app without any store or broker.

``docs/openapi.json`` is this document, committed (``memstream schemas openapi`` / ``make
schemas`` writes it; a test checks the committed file matches the app). The served copy is
``GET /openapi.json`` of a running RPC.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from memstream.metrics import Metrics
from memstream.rpc.server import ApiDeps, create_api
from memstream.settings import KafkaSettings, RPCSettings

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def openapi_document() -> dict[str, Any]:
    # Building the routes reads only the settings and the metrics: the stores are never
    # touched, so none are opened.
    deps = ApiDeps(
        rpc=RPCSettings(),
        kafka=KafkaSettings(),
        retriever=cast(Any, None),
        publisher=cast(Any, None),
        metrics=Metrics(CollectorRegistry()),
    )
    return create_api(deps).openapi()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(path: Path = COMMITTED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(openapi_document()))
    return path
