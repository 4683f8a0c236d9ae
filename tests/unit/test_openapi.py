"""The committed OpenAPI document is the app's, and every route documents its errors."""

from __future__ import annotations

import json

from memstream.rpc.openapi import COMMITTED, openapi_document, render


def test_committed_openapi_document_is_current() -> None:
    assert COMMITTED.read_text() == render(openapi_document()), (
        "run `make schemas` (or `memstream schemas openapi`) and commit docs/openapi.json"
    )


def test_every_v1_route_documents_auth_and_validation_errors() -> None:
    paths = json.loads(render(openapi_document()))["paths"]
    routes = [
        (p, m, op) for p, ops in paths.items() if p.startswith("/v1/") for m, op in ops.items()
    ]
    assert {(p, m) for p, m, _ in routes} >= {
        ("/v1/retrieve", "post"),
        ("/v1/events", "post"),
        ("/v1/users/{user_id}/memories", "get"),
        ("/v1/memories/{memory_id}", "get"),
        ("/v1/users/{user_id}", "delete"),
    }
    for path, method, op in routes:
        assert {"401", "422"} <= set(op["responses"]), (path, method)
    assert "404" in paths["/v1/memories/{memory_id}"]["get"]["responses"]
