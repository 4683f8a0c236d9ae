"""Build the thin client's wheel, ``memstream-client``: ``memstream.client`` and
``memstream.schemas`` only, depending on httpx and pydantic alone.

setuptools builds a project from inside its own folder, so the two packages are staged
beside a ``pyproject.toml`` written from the server's: the same version, the same pins of
httpx and pydantic (one place to bump them). The wheel has no ``memstream/__init__.py``:
``memstream`` is a namespace package where only the client is installed. Install the
client *or* the server, not both in one environment: the server already holds the client.

    python clients/python/build.py OUT_DIR
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("memstream/client", "memstream/schemas")
DEPENDENCIES = ("httpx", "pydantic")
PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "memstream-client"
version = "{version}"
description = "The Python client of memstream's retrieval RPC (httpx and pydantic only)."
readme = "README.md"
requires-python = "{python}"
license = "Apache-2.0"
dependencies = {dependencies}

[tool.setuptools]
packages = {packages}
"""


def pyproject() -> str:
    """The client's project table, from the server's version and pins."""
    server = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [
        dep for dep in server["dependencies"]
        if re.split(r"[\s=<>!~;\[]", dep, maxsplit=1)[0] in DEPENDENCIES
    ]  # fmt: skip
    if len(pins) != len(DEPENDENCIES):
        raise SystemExit(f"the server's pyproject pins {pins}, expected {DEPENDENCIES}")
    return PYPROJECT.format(
        version=server["version"],
        python=server["requires-python"],
        dependencies=_toml_list(pins),
        packages=_toml_list([p.replace("/", ".") for p in PACKAGES]),
    )


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def build(out: Path) -> Path:
    """Build the wheel into ``out``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        for package in PACKAGES:
            # schemas/json is the JSON Schema export for other languages, not Python.
            ignore = shutil.ignore_patterns("__pycache__", "json")
            shutil.copytree(REPO / package, stage / package, ignore=ignore)
        shutil.copy(Path(__file__).with_name("README.md"), stage / "README.md")
        (stage / "pyproject.toml").write_text(pyproject())
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), tmp],
            check=True,
        )
    return max(out.glob("memstream_client-*.whl"), key=lambda p: p.stat().st_mtime)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python clients/python/build.py OUT_DIR")
    print(build(Path(sys.argv[1])))
