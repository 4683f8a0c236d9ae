"""memstream.launch: Settings -> environment -> Settings is the identity, roles have one
spelling, and no caller can slip a MEMSTREAM_* setting past the Settings object."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from memstream.cli import cli
from memstream.launch import (
    Process,
    defaults,
    on_free_port,
    process_env,
    settings_env,
    with_overrides,
)
from memstream.roles import ALL_ROLES, ROLE_SETS, ROLES, Role, parse_roles, roles_arg
from memstream.settings import ENV_PREFIX, Settings, hash_api_key


@pytest.fixture
def no_memstream_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def loaded_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_settings_survive_the_environment(no_memstream_env: pytest.MonkeyPatch) -> None:
    settings = Settings(
        data_dir="/srv/memstream",
        log_level="info",
        metrics_port=9100,
        kafka={"broker": "kafka://k1:9092", "processing_guarantee": "exactly_once"},
        qdrant={"backend": "client", "url": "http://q1:6333", "api_key": "q-secret"},
        encoder={"model_path": "/models/e5.onnx", "spinning": True},
        cluster={"merge_threshold": 0.1 + 0.2},  # a float whose str is its repr
        # A preset fills only what is not set: a value set to the default must travel too.
        recurrence={"preset": "longmemeval", "min_similar": 5},
        llm={"backend": "openai", "api_key": "sk-secret"},
        rpc={"api_keys": {hash_api_key("k1"): "acme", "MixedCase": "t2"}, "port": 8181},
    )
    env = settings_env(settings)
    assert env["MEMSTREAM_QDRANT__API_KEY"] == "q-secret"  # the secret, not '**********'
    assert "**********" not in env.values()
    back = loaded_from(env, no_memstream_env)
    assert back == settings
    assert back.llm.api_key is not None
    assert back.llm.api_key.get_secret_value() == "sk-secret"
    assert back.rpc.api_keys["MixedCase"] == "t2"  # a map's keys keep their case (JSON)
    assert back.recurrence.min_similar == 5
    assert back.recurrence.similarity == 0.6


def test_defaults_need_no_variable(no_memstream_env: pytest.MonkeyPatch) -> None:
    assert settings_env(Settings()) == {}


class _Inner(BaseModel):
    weights: list[float] = []
    names: dict[str, int] = {}


class _Listed(BaseSettings):
    """Lists (top level and in a section) and a secret, under a prefix of its own."""

    model_config = SettingsConfigDict(env_prefix="LAUNCHTEST_", env_nested_delimiter="__")
    tags: list[str] = []
    token: SecretStr | None = None
    inner: _Inner = _Inner()


def test_lists_and_nested_maps_survive_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Listed(
        tags=["a", "b c"], token="t0k", inner={"weights": [0.5, 2.0], "names": {"X": 1}}
    )
    env = settings_env(model)
    assert set(env) == {
        "LAUNCHTEST_TAGS",
        "LAUNCHTEST_TOKEN",
        "LAUNCHTEST_INNER__WEIGHTS",
        "LAUNCHTEST_INNER__NAMES",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _Listed() == model


def test_overrides_merge_sections_and_keep_a_preset() -> None:
    base = defaults({"recurrence": {"preset": "longmemeval"}})
    changed = with_overrides(base, {"kafka": {"partitions": 8}, "log_level": "debug"})
    assert changed.kafka.partitions == 8
    assert changed.kafka.topic_prefix == base.kafka.topic_prefix
    assert (changed.recurrence.min_similar, changed.recurrence.similarity) == (4, 0.6)
    with pytest.raises(ValueError, match="partitions"):
        with_overrides(base, {"kafka": {"partitions": "many"}})


def test_a_child_gets_exactly_its_settings(no_memstream_env: pytest.MonkeyPatch) -> None:
    no_memstream_env.setenv("MEMSTREAM_KAFKA__BROKER", "kafka://from-the-shell:9092")
    no_memstream_env.setenv("MEMSTREAM_API_KEY", "a-client-key")  # not a setting: kept
    settings = defaults({"log_level": "info"})
    assert settings.kafka.broker == ""  # the shell's variables do not reach a Settings made here
    env = process_env(settings, {"COLUMNS": "200"})
    assert "MEMSTREAM_KAFKA__BROKER" not in env
    assert env["MEMSTREAM_API_KEY"] == "a-client-key"
    assert env["MEMSTREAM_LOG_LEVEL"] == "info"
    assert env["COLUMNS"] == "200"
    with pytest.raises(ValueError, match="MEMSTREAM_REDIS__URL"):
        process_env(defaults({}), {"MEMSTREAM_REDIS__URL": "redis://r:6379"})


def test_roles_have_one_spelling_and_the_commands_are_aliases() -> None:
    assert get_args(Role) == ROLES  # one spelling: the type and the table agree
    assert parse_roles("process,consolidate,serve") == ALL_ROLES == parse_roles("up")
    assert parse_roles(" serve , consolidate") == frozenset({"consolidate", "serve"})
    assert parse_roles("worker") == frozenset({"process"}) == ROLE_SETS["worker"]
    assert roles_arg(frozenset({"serve", "consolidate"})) == "consolidate,serve"
    for bad in ("", "proces", "process,nope"):
        with pytest.raises(ValueError, match="roles are process,consolidate,serve"):
            parse_roles(bad)


def test_a_process_is_named_by_its_roles_and_probed_on_its_port(tmp_path: Path) -> None:
    settings = defaults({"data_dir": tmp_path})
    with pytest.raises(ValueError, match="metrics_port"):
        Process(settings, ROLE_SETS["worker"])  # nothing to probe it on
    with pytest.raises(ValueError, match="MEMSTREAM_LOG_LEVEL"):
        Process(settings, env={"MEMSTREAM_LOG_LEVEL": "debug"})
    worker = Process(on_free_port(settings, ROLE_SETS["worker"]), ROLE_SETS["worker"])
    assert worker.command[-4:] == ["memstream", "run", "--roles", "process"]
    assert worker.url == f"http://127.0.0.1:{worker.settings.metrics_port}"
    memory = Process(on_free_port(settings, ALL_ROLES), frozenset({"serve", "consolidate"}))
    assert memory.command[-1] == "consolidate,serve"
    assert memory.url == f"http://127.0.0.1:{memory.settings.rpc.port}"
    assert worker.stop() is None  # never started: nothing to stop


def test_the_cli_names_a_bad_role_in_one_line(no_memstream_env: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["run", "--roles", "process,serv"])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == (
        "unknown role serv: roles are process,consolidate,serve "
        "(or one of up, worker, consolidator, serve)"
    )
    replay = CliRunner().invoke(cli, ["run", "--roles", "worker", "--replay", "x.jsonl"])
    assert replay.exit_code == 1, replay.output
    assert replay.stderr.strip().startswith("--replay needs every role")
