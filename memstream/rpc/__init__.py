"""The retrieval service (HTTP/JSON, OpenAPI): admission, ingest backpressure, the intake
journal and retrieval. The client bots import is ``memstream.client``."""
