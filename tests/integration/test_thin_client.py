"""``memstream-client`` alone: its wheel, installed in a clean venv with nothing but its own
dependencies, adds and reads back through a real server."""

from __future__ import annotations

import json
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

from clients.python.build import build
from memstream.settings import DEMO_API_KEY
from tests.integration.process import MemstreamProcess

pytestmark = pytest.mark.integration

# What the bot's venv may hold: the client, httpx and pydantic with their own dependencies.
ALLOWED = {
    "memstream-client", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio",
    "pydantic", "pydantic-core", "annotated-types", "typing-extensions", "typing-inspection",
    "pip", "setuptools",
}  # fmt: skip

BOT = """
import importlib.util, json, sys
from memstream.client import MemoryClient

url, key = sys.argv[1], sys.argv[2]
with MemoryClient(url, key, timeout_s=10) as memory:
    added = memory.add("thin-ana", "Please deliver to 4 Elm Street from now on.", session_id="s1")
    answer = memory.retrieve(
        "thin-ana", "where do we deliver?", after_event_id=added.event_ids[0]
    )
server_parts = [m for m in ("memstream.rpc", "memstream.stores", "faust", "onnxruntime")
                if importlib.util.find_spec(m) is not None]
print(json.dumps({"memorized": answer.after_event_memorized, "context": answer.context,
                  "server_parts": server_parts}))
"""


def _run(args: list[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def test_the_thin_client_installs_alone_and_talks_to_a_real_server(
    running: MemstreamProcess, tmp_path: Path
) -> None:
    wheel = build(tmp_path / "dist")
    env_dir = tmp_path / "bot-venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)])

    installed = {
        d["name"].lower().replace("_", "-")
        for d in json.loads(_run([python, "-m", "pip", "list", "--format=json"]))
    }
    assert "memstream-client" in installed
    assert installed <= ALLOWED, installed - ALLOWED

    bot = tmp_path / "bot.py"
    bot.write_text(BOT)
    result = json.loads(_run([python, str(bot), running.url, DEMO_API_KEY]))
    assert result["server_parts"] == []
    assert result["memorized"] is True
    assert "4 Elm Street" in result["context"]


def test_the_client_wheel_holds_the_client_and_the_models_only(tmp_path: Path) -> None:
    with zipfile.ZipFile(build(tmp_path / "dist")) as wheel:
        packages = {
            "/".join(name.split("/")[:2]) for name in wheel.namelist() if name.endswith(".py")
        }
    assert packages == {"memstream/client", "memstream/schemas"}
