"""The API's HTTP server: standalone (``memstream serve``) or inside a faust worker
(``memstream up``). The API it serves is built by ``memstream.wiring.ServiceBuilder``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from memstream.settings import RPCSettings


class GuestServer(uvicorn.Server):
    """uvicorn in a process whose signals belong to its host (the faust worker)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def make_server(api: FastAPI, rpc: RPCSettings, *, guest: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        api,
        host=rpc.host,
        port=rpc.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    return GuestServer(config) if guest else uvicorn.Server(config)
