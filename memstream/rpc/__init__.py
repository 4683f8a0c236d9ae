"""The retrieval service (HTTP/JSON, OpenAPI) and the small client bots import."""
