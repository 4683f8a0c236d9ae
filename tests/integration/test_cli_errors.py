"""``memstream search`` / ``forget`` / ``top`` against no server, a wrong key and a wrong URL:
one line on stderr that names the problem and the fix, exit 1, never a traceback."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from memstream.cli import cli
from memstream.settings import DEMO_API_KEY, Settings, hash_api_key
from memstream.stores.embedded import free_port
from tests.integration.process import MemstreamProcess, wait_for, with_free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REAL_KEY = "acme-secret-key"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"MEMSTREAM_API_KEY": None})


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_no_server_is_one_line_for_every_command() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    expected = f"no memstream at {url} — is `make run` running? (or pass --url)"
    assert one_error_line(invoke("search", "u1", "hello", "--url", url)) == expected
    assert one_error_line(invoke("forget", "u1", "--url", url)) == expected
    line = one_error_line(invoke("top", "--url", f"{url}/metrics", "--frames", "1"))
    assert line == f"no memstream metrics at {url}/metrics — is `make run` running? (or pass --url)"


def test_refused_keys_wrong_urls_and_plain_output(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    """One memstream with a real key configured (so the demo key gets a 403)."""
    settings = with_free_port(settings_factory(rpc={"api_keys": {hash_api_key(REAL_KEY): "acme"}}))
    keyed = MemstreamProcess(settings, tmp_path / "up.log").start()
    try:
        refusals(keyed.url)
        # The banner offers the demo key only where it works.
        log = keyed.log_path
        wait_for(lambda: "memstream is serving" in log.read_text(), 30, "the banner")
        banner = log.read_text().split("memstream is serving", 1)[1]
        assert DEMO_API_KEY not in banner
        assert "Bearer $MEMSTREAM_API_KEY" in banner
        search_and_forget(keyed.url)
    finally:
        keyed.stop()


def refusals(url: str) -> None:
    fix = "— pass --api-key KEY or set MEMSTREAM_API_KEY"
    line = one_error_line(invoke("search", "u1", "hello", "--url", url))
    assert line.startswith("the API key was refused (403): the demo key is disabled"), line
    assert line.endswith(fix)
    line = one_error_line(invoke("forget", "u1", "--url", url, "--api-key", "nope"))
    assert line == f"the API key was refused (401): unknown API key {fix}"
    line = one_error_line(invoke("search", "u1", "hi", "--url", f"{url}/v1", "--api-key", REAL_KEY))
    assert line == f"memstream answered 404 (Not Found) — is {url}/v1 the RPC's base URL?"
    bad = "bad\tuser"  # a control character: no user id holds one (schemas.common)
    line = one_error_line(invoke("search", bad, "hi", "--url", url, "--api-key", REAL_KEY))
    assert line.startswith("invalid request: user_id: Value error, a user id holds no"), line
    line = one_error_line(invoke("forget", bad, "--url", url, "--api-key", REAL_KEY))
    assert line.startswith("memstream answered 422: path.user_id: Value error, a user id"), line


def search_and_forget(url: str) -> None:
    text = "My parcel tracking number is ZX-4471 and it is stuck in Lyon."
    event = {"user_id": "u-cli", "session_id": "s1", "role": "user", "text": text}
    headers = {"Authorization": f"Bearer {REAL_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        assert http.post("/v1/events", json={"events": [event]}).status_code == 202

        def found() -> bool:
            body = {"user_id": "u-cli", "query": "parcel tracking ZX-4471"}
            return bool(http.post("/v1/retrieve", json=body).json()["items"])

        wait_for(found, 60, "the turn to be retrievable")

    args = ("search", "u-cli", "parcel tracking ZX-4471", "--url", url, "--api-key", REAL_KEY)
    items = invoke(*args)
    assert items.exit_code == 0, items.output
    assert items.stdout.count("ZX-4471") == 1, items.stdout  # the item, not the context again
    assert re.search(r"^1 item; context \d+ tokens in [\d.]+ ms", items.stdout, re.M), items.stdout
    context = invoke(*args, "--context")
    assert context.exit_code == 0, context.output
    assert context.stdout.count("ZX-4471") == 1, context.stdout

    gone = invoke("forget", "u-cli", "--url", url, "--api-key", REAL_KEY)
    assert gone.exit_code == 0, gone.output
    counts = re.search(r"forgot u-cli: (\d+) (Redis keys?), (\d+) (memory|memories)", gone.stdout)
    assert counts is not None, gone.stdout
    assert counts[2] == ("Redis key" if counts[1] == "1" else "Redis keys"), gone.stdout
    assert counts[4] == ("memory" if counts[3] == "1" else "memories"), gone.stdout
