"""``/docs`` and ``/redoc`` of a running ``memstream up`` render with no network at all.

A headless Chromium (Debian's ``chromium``) whose resolver answers nothing but 127.0.0.1
loads the pages, so an asset still fetched from a CDN leaves Swagger UI blank and fails
here. The rendered DOM must hold the operation list, grouped by tag, and the Authorize
button; the screenshot must not be blank.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.process import MemstreamProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("chromium") is None,
        reason="chromium not installed (root: apt-get update; apt-get install -y chromium)",
    ),
]

OPERATIONS = ("/v1/retrieve", "/v1/events", "/v1/users/{user_id}/memories", "/v1/users/{user_id}")
TAGS = ("memory", "events", "users", "operations")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            # Offline: every host name but the server's fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--window-size=1280,1600",
            "--virtual-time-budget=15000",  # let the page's scripts fetch and render
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_docs_and_redoc_render_offline(running: MemstreamProcess, tmp_path: Path) -> None:
    page = f"{running.url}/docs"
    with running.client() as http:
        html = http.get("/docs").text
    assert "cdn." not in html
    assert "/static-offline-docs/swagger-ui-bundle.js" in html

    dom = chromium(tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for path in OPERATIONS:
        assert f'data-path="{path}"' in dom.stdout, f"{path} missing from the rendered /docs"
    for tag in TAGS:
        assert f'data-tag="{tag}"' in dom.stdout, f"tag {tag} missing from the rendered /docs"
    assert "btn authorize" in dom.stdout  # the bearer-key security scheme is declared
    # A lock on each of the five /v1 operations: "Try it out" sends the key entered under
    # Authorize (probes have none).
    assert dom.stdout.count('aria-label="authorization button unlocked"') == 5

    shot = tmp_path / "docs.png"
    taken = chromium(tmp_path / "profile-shot", f"--screenshot={shot}", page)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.exists()
    with Image.open(shot) as image:
        gray = image.convert("L")
        width, height = gray.size
        histogram = gray.histogram()
        colours = len(set(image.convert("RGB").getdata()))
    dark = sum(histogram[:160])  # text, buttons, method badges; a blank page has none
    assert (width, height) == (1280, 1600)
    assert dark > 0.01 * width * height, f"/docs screenshot looks blank ({dark} dark pixels)"
    assert colours > 50, "the /docs screenshot has no coloured badges or text"

    # One process for both pages: a `memstream up` costs more than the two renderings.
    redoc = chromium(tmp_path / "profile-redoc", "--dump-dom", f"{running.url}/redoc")
    assert redoc.returncode == 0, redoc.stderr[-2000:]
    assert "/v1/retrieve" in redoc.stdout
    assert "bearerKey" in redoc.stdout
