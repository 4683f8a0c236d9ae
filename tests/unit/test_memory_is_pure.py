"""``memory/`` is the pure science package: stdlib, numpy and the ``schemas`` contracts only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MEMORY = Path(__file__).resolve().parents[2] / "memory"
ALLOWED_ROOTS = set(sys.stdlib_module_names) | {"numpy", "schemas", "memory"}


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # "from . import x" stays inside memory/
                continue
            # "from .. import x" climbs out of memory/: report it as such.
            roots.add(".." if node.level else (node.module or "").split(".")[0])
    return roots


def test_memory_imports_only_stdlib_numpy_and_schemas() -> None:
    files = sorted(MEMORY.rglob("*.py"))
    assert files, f"no modules found under {MEMORY}"
    offenders = {
        str(path.relative_to(MEMORY.parent)): sorted(
            imported_roots(path.read_text()) - ALLOWED_ROOTS
        )
        for path in files
    }
    assert {path: bad for path, bad in offenders.items() if bad} == {}


def test_the_checker_sees_imports() -> None:
    source = (
        "import os\nimport redis.asyncio\nfrom qdrant_client import X\nfrom . import y\n"
        "from ..stores import z\n"
    )
    assert imported_roots(source) == {"os", "redis", "qdrant_client", ".."}
