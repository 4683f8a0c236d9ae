"""The kernel (memstream.settings, metrics, logs) imports nothing of the project: every layer
imports it, so importing it must not load the product (import-linter checks the statements;
this checks what a fresh interpreter actually loads)."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from memstream.metrics import TRIGGER_REASONS
from memstream.schemas.memories import TriggerReason

PROJECT = ("bench", "reliability")  # the product itself is memstream.*
KERNEL = ("memstream", "memstream.logs", "memstream.metrics", "memstream.settings")


def test_importing_the_kernel_loads_nothing_else_of_the_project() -> None:
    probe = (
        "import sys\n"
        "import memstream.settings, memstream.metrics, memstream.logs\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {PROJECT!r}"
        f" or (m.startswith('memstream') and m not in {KERNEL!r})))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_the_trigger_metric_labels_are_the_schema_reasons() -> None:
    # Spelt out in memstream.metrics (the kernel may not import schemas): kept equal here.
    assert get_args(TriggerReason) == TRIGGER_REASONS
