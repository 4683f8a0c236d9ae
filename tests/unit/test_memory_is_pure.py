"""``memstream.memory`` is the pure science package: stdlib, numpy and the ``memstream.schemas``
contracts only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MEMORY = Path(__file__).resolve().parents[2] / "memstream" / "memory"
ALLOWED_ROOTS = set(sys.stdlib_module_names) | {"numpy", "memstream.schemas", "memstream.memory"}


def _root(module: str) -> str:
    """A third-party package by its top name; memstream's own by its package (two names)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "memstream" else parts[0]


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(_root(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # "from . import x" stays inside memory/
                continue
            # "from .. import x" climbs out of memory/: report it as such.
            roots.add(".." if node.level else _root(node.module or ""))
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
        "from ..stores import z\nfrom memstream.stores.short_term import w\n"
    )
    assert imported_roots(source) == {"os", "redis", "qdrant_client", "..", "memstream.stores"}
