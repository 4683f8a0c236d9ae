"""A MEMSTREAM_* variable that sets no field fails the load, with the closest valid name:
a misspelt or renamed setting must not run silently on its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memstream.cli import cli
from memstream.settings import (
    NOT_SETTINGS_ENV,
    Settings,
    UnknownSettingError,
    check_environment,
    setting_env_names,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in [n for n in os.environ if n.upper().startswith("MEMSTREAM_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_a_typo_names_the_variable_and_the_closest_setting(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MEMSTREAM_LOG_LEVL", "debug")
    with pytest.raises(UnknownSettingError) as raised:
        Settings()
    assert str(raised.value) == (
        "unknown setting MEMSTREAM_LOG_LEVL (did you mean MEMSTREAM_LOG_LEVEL?)"
    )


def test_a_nested_typo_is_caught_before_pydantic_reports_it(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MEMSTREAM_KAFKA__BROKR", "kafka://127.0.0.1:9092")
    with pytest.raises(UnknownSettingError, match=r"did you mean MEMSTREAM_KAFKA__BROKER\?"):
        Settings()


def test_nothing_close_points_at_the_settings_module() -> None:
    with pytest.raises(UnknownSettingError) as raised:
        check_environment({"MEMSTREAM_ZZZ": "1"})
    assert str(raised.value) == (
        "unknown setting MEMSTREAM_ZZZ (see memstream/settings.py for the names)"
    )


def test_every_unknown_variable_is_named_on_one_line() -> None:
    with pytest.raises(UnknownSettingError) as raised:
        check_environment({"MEMSTREAM_RPC__PROT": "1", "MEMSTREAM_LOG_LEVL": "x", "HOME": "/"})
    message = str(raised.value)
    assert "\n" not in message
    assert "MEMSTREAM_LOG_LEVL" in message
    assert "MEMSTREAM_RPC__PROT (did you mean MEMSTREAM_RPC__PORT?)" in message


def test_known_names_sections_maps_and_non_settings_load(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MEMSTREAM_KAFKA__PARTITIONS", "2")
    clean_env.setenv("memstream_log_level", "info")  # pydantic-settings reads names case-blind
    clean_env.setenv("MEMSTREAM_REDIS", '{"prefix": "t1"}')  # a whole section as JSON
    clean_env.setenv("MEMSTREAM_RPC__API_KEYS__abc", "acme")  # one key of a map
    for name in NOT_SETTINGS_ENV:
        clean_env.setenv(name, "x")
    settings = Settings()
    assert settings.kafka.partitions == 2
    assert settings.log_level == "info"
    assert settings.redis.prefix == "t1"
    assert settings.rpc.api_keys == {"abc": "acme"}


def test_every_name_the_project_spells_is_a_setting_or_allow_listed() -> None:
    """The harness and docs spell MEMSTREAM_* names by hand: a rename must fail here."""
    names, maps = setting_env_names()
    spelt: set[str] = set()
    for pattern in ("memstream/**/*.py", "bench/*.py", "reliability/*.py"):
        for path in ROOT.glob(pattern):
            spelt |= set(re.findall(r"MEMSTREAM_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    for page in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        spelt |= set(re.findall(r"MEMSTREAM_[A-Z0-9_]*[A-Z0-9]", page.read_text()))
    unknown = {n for n in spelt if n not in names | NOT_SETTINGS_ENV and not n.startswith(maps)}
    assert not unknown


def test_the_cli_says_it_in_one_line_and_exits_1(clean_env: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["worker"], env={"MEMSTREAM_KAFKA__PARTITONS": "2"})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.strip() == (
        "unknown setting MEMSTREAM_KAFKA__PARTITONS (did you mean MEMSTREAM_KAFKA__PARTITIONS?)"
    )


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        (
            "MEMSTREAM_KAFKA__PARTITIONS",
            "four",
            "invalid setting MEMSTREAM_KAFKA__PARTITIONS: Input should be a valid integer",
        ),
        (
            "MEMSTREAM_RPC__API_KEYS",
            "not json",
            'invalid setting: error parsing value for field "rpc"',
        ),
    ],
)
def test_the_cli_reports_a_bad_value_in_one_line(
    clean_env: pytest.MonkeyPatch, name: str, value: str, line: str
) -> None:
    result = CliRunner().invoke(cli, ["consolidator"], env={name: value})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(line)
