"""``make demo`` as a newcomer runs it with its output going to a file: every example
question answered in whole tables (nothing cropped to a terminal's width), the stack
stopped cleanly, and not one line of error on the way out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memstream.launch import defaults, process_env
from memstream.stores.embedded import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_answers_every_question_in_whole_tables_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    settings = defaults({"data_dir": data, "rpc": {"port": free_port()}})
    done = subprocess.run(
        [sys.executable, "-m", "memstream", "demo"],
        env=process_env(settings, {"COLUMNS": "80"}),  # as a file gets it
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert "not published" not in out  # e.g. feedback sent after its producer closed
    assert '"level":"error"' not in out
    questions = json.loads((ROOT / "examples" / "demo_questions.json").read_text())
    words = " ".join(done.stdout.split())  # lines wrapped, not cropped: the words all there
    for q in questions:
        assert " ".join(q["question"].split()) in words, q["question"]
    # The source-events column, the table's last, is whole: its ids are not cut short.
    expected = {e for q in questions for e in q["expect_event_ids"]}
    assert any(event_id in done.stdout for event_id in expected)
    assert not list(data.rglob("*.lock"))  # stopped: nothing held, nothing left
