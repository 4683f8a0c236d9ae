"""What an operator reads: the data-folder lock, the banner, one-line errors and plurals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memstream.cli import banner
from memstream.client import MemstreamError, detail_text
from memstream.ops.replay import forgotten_hint
from memstream.runtime import Backlog
from memstream.settings import DEMO_API_KEY, Settings, hash_api_key
from memstream.stores.embedded import DataDirBusy, DataDirLock, running_stack


def test_a_held_data_folder_names_its_owner_and_frees_on_release(tmp_path: Path) -> None:
    held = DataDirLock(tmp_path).acquire("http://127.0.0.1:8080")
    with pytest.raises(DataDirBusy) as busy:
        DataDirLock(tmp_path).acquire("http://127.0.0.1:8081")
    assert busy.value.pid == os.getpid()
    assert busy.value.url == "http://127.0.0.1:8080"
    assert "MEMSTREAM_DATA_DIR=" in str(busy.value)
    assert "\n" not in str(busy.value)
    held.release()
    DataDirLock(tmp_path).acquire().release()


def test_the_running_stack_is_found_by_its_folder_while_it_holds_it(tmp_path: Path) -> None:
    assert running_stack(tmp_path) is None  # never started
    held = DataDirLock(tmp_path).acquire("http://127.0.0.1:8080")
    held.record(url="http://127.0.0.1:8080", broker="kafka://127.0.0.1:1", redis="redis://x:2")
    assert running_stack(tmp_path) == {
        "pid": os.getpid(),
        "url": "http://127.0.0.1:8080",
        "broker": "kafka://127.0.0.1:1",
        "redis": "redis://x:2",
    }
    held.release()
    assert running_stack(tmp_path) is None  # the file a stopped stack left says nothing


def test_the_banner_offers_the_demo_key_only_when_it_works() -> None:
    assert f"Bearer {DEMO_API_KEY}" in banner(Settings())
    keyed = Settings(rpc={"api_keys": {hash_api_key("k"): "acme"}})
    assert DEMO_API_KEY not in banner(keyed)
    assert "Bearer $MEMSTREAM_API_KEY" in banner(keyed)
    # Where a producer writes, and as which tenant, when the stack's services are known.
    shown = banner(Settings(), "kafka://127.0.0.1:9092", "redis://127.0.0.1:6379")
    assert "broker: kafka://127.0.0.1:9092 (topic memstream.events, tenant 'demo'" in shown
    assert "valkey: redis://127.0.0.1:6379" in shown
    assert "tenant" not in banner(keyed, "kafka://127.0.0.1:9092", "redis://127.0.0.1:6379")


def test_server_details_become_one_short_line() -> None:
    errors = [{"loc": ["body", "user_id"], "msg": "String should match pattern"}] * 5
    assert detail_text(errors) == "; ".join(["user_id: String should match pattern"] * 3) + (
        " (+2 more)"
    )
    assert (
        detail_text("<html>\n<body>gateway\n</body></html>")
        == "<html> <body>gateway </body></html>"
    )
    assert len(detail_text("x" * 1000)) == 200
    assert str(MemstreamError(403, "no")) == "memstream answered 403: no"


def test_forgotten_hints_count_right() -> None:
    assert forgotten_hint(["demo:a"], restored=True) == (
        "restored forgotten 1 user before the replay: demo:a"
    )
    hint = forgotten_hint(["demo:a", "demo:b"], restored=False)
    assert hint.startswith("demo:a, demo:b were forgotten: the replay skips their earlier")
    assert "--restore-forgotten" in hint


def test_backlog_is_pending_until_the_replay_settles() -> None:
    handled = [10.0]
    backlog = Backlog()
    assert backlog.pending() == 0
    backlog.begin(0, lambda: handled[0])
    backlog.expected += 5
    assert backlog.pending() == 5
    handled[0] = 15.0
    assert backlog.pending() == 1  # all handled, triggers may still be consolidating
    backlog.end()
    assert backlog.pending() == 0


@pytest.mark.parametrize("command", ["worker", "consolidator"])
def test_a_role_set_with_no_services_configured_refuses_in_one_line(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from memstream.cli import cli

    for name in [n for n in os.environ if n.upper().startswith("MEMSTREAM_")]:
        monkeypatch.delenv(name)
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(cli, [command], env={"MEMSTREAM_DATA_DIR": str(data_dir)})
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        f"memstream {command} joins a deployment: set MEMSTREAM_KAFKA__BROKER and "
        "MEMSTREAM_REDIS__URL; every role on this machine is `memstream up`"
    ]
    assert not data_dir.exists()  # no embedded stack of its own was started


def test_a_released_lock_leaves_no_file_and_a_stale_handle_is_told_apart(tmp_path: Path) -> None:
    from memstream.stores.embedded import _is_linked

    held = DataDirLock(tmp_path).acquire("http://127.0.0.1:8080")
    stale = held.path.open()  # opened by a second starter before the holder stopped
    held.release()
    assert not held.path.exists()
    assert running_stack(tmp_path) is None
    # The second starter's lock would be on the removed file: acquire sees that and retries.
    assert not _is_linked(stale, held.path)
    stale.close()
    again = DataDirLock(tmp_path).acquire()
    assert _is_linked(again._file, again.path) if again._file else False
    with pytest.raises(DataDirBusy):
        DataDirLock(tmp_path).acquire()
    again.release()
