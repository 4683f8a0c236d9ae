"""The one way to start a memstream process from another: a handle built from a ``Settings``.

The CLI, the benchmarks, the reliability suite and the tests all start their long-running
processes here, as ``python -m memstream run --roles ...``. The child's settings are
exactly the ``Settings`` object it was built from: the environment is the caller's less
every ``MEMSTREAM_*`` setting, plus ``settings_env(settings)``, so nothing is spelt by
hand and nothing leaks in from the caller's shell. Roles have one spelling,
``process,consolidate,serve``; ``up``, ``worker``, ``consolidator`` and ``serve`` are
aliases of role sets (``ROLE_SETS``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from memstream.roles import ALL_ROLES, Role, roles_arg
from memstream.settings import ENV_NESTED, ENV_PREFIX, NOT_SETTINGS_ENV, Settings
from memstream.stores.embedded import free_port

T = TypeVar("T")


def settings_env(settings: BaseSettings) -> dict[str, str]:
    """The ``MEMSTREAM_*`` variables that give a child process these settings.

    Every field that differs from its default (or was set explicitly), named as
    ``settings.py`` reads it (``MEMSTREAM_LOG_LEVEL``, ``MEMSTREAM_KAFKA__BROKER``):
    secrets with their real value, lists, maps and deeper models as JSON (which
    pydantic-settings decodes for such fields).
    """
    config = type(settings).model_config  # a subclass may have its own prefix (tests)
    prefix, nested = config.get("env_prefix", ENV_PREFIX), config.get("env_nested_delimiter")
    env: dict[str, str] = {}
    for name, value, default in _changed(settings):
        if isinstance(value, BaseModel):  # a section: one variable per changed field
            for sub, sub_value, _ in _changed(value, default):
                env[f"{prefix}{name}{nested or ENV_NESTED}{sub}".upper()] = _env_value(sub_value)
        else:
            env[f"{prefix}{name}".upper()] = _env_value(value)
    return env


def _changed(model: BaseModel, defaults: Any = None) -> list[tuple[str, Any, Any]]:
    """(name, value, default) of each field of ``model`` that differs from its default
    (``defaults``: the enclosing default, whose own values count as the defaults) or was
    set explicitly: a preset (recurrence) fills what was not, so "set to the default"
    must travel too."""
    out = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if defaults is not None:
            default = getattr(defaults, name)
        else:
            default = field.get_default(call_default_factory=True)
        explicit = name in model.model_fields_set and value is not None
        if value != default or explicit:
            out.append((name, value, default))
    return out


def _env_value(value: object) -> str:
    if value is None:  # pydantic-settings would read any string as a value, never as None
        raise ValueError("a setting whose default is not None cannot be set to None by env")
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool | list | tuple | dict | BaseModel) or dataclasses.is_dataclass(value):
        return json.dumps(_plain(value))
    return str(value)  # str, int, float (repr round-trips), Path, a Literal's str


def _plain(value: object) -> object:
    """JSON-ready: models and dataclasses as dicts, secrets revealed, paths as strings."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def process_env(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's whole environment: the caller's without its ``MEMSTREAM_*`` settings, these
    settings, and ``extra`` (variables that are not settings; a ``MEMSTREAM_*`` setting
    there is refused: build it into the ``Settings``)."""
    spelt = [k for k in extra or {} if _is_setting(k)]
    if spelt:
        raise ValueError(f"{', '.join(spelt)}: pass settings in the Settings, not by name")
    inherited = {k: v for k, v in os.environ.items() if not _is_setting(k)}
    return {**inherited, **settings_env(settings), **(extra or {})}


def _is_setting(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(ENV_PREFIX) and upper not in NOT_SETTINGS_ENV


def with_overrides(settings: Settings, *layers: Mapping[str, Any]) -> Settings:
    """``settings`` with the ``layers`` of overrides (``{"kafka": {"broker": ...},
    "log_level": ...}``; later layers win, sections merge field by field) applied and
    validated, the environment not read again."""
    # What was set only (a preset fills the rest again); python mode: secrets stay SecretStr.
    given = _GivenOnly(**merge_overrides(settings.model_dump(exclude_unset=True), *layers))
    return Settings.model_construct(given.model_fields_set, **dict(given))  # validated above


def merge_overrides(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """One layer of settings overrides from several: later ones win, sections merge."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for name, value in layer.items():
            current = merged.get(name)
            if isinstance(current, Mapping) and isinstance(value, Mapping):
                value = {**current, **value}
            merged[name] = value
    return merged


def defaults(overrides: Mapping[str, Any] | None = None) -> Settings:
    """The defaults with ``overrides``, whatever ``MEMSTREAM_*`` the caller's shell has."""
    return with_overrides(Settings.model_construct(), overrides or {})


class _GivenOnly(Settings):
    """Settings validated from the values given alone: pydantic-settings reads the
    environment even in ``model_validate``, and a caller's shell must not leak in here."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def on_free_port(settings: Settings, roles: frozenset[Role]) -> Settings:
    """``settings`` with a free port for the process's HTTP listener: the RPC's when it
    serves, else the ``/metrics`` + probes listener of a worker or consolidator."""
    if "serve" in roles:
        return with_overrides(settings, {"rpc": {"port": free_port()}})
    return with_overrides(settings, {"metrics_port": free_port()})


class Samples:
    """One scrape of a ``/metrics`` page: sums of the samples that match some labels."""

    def __init__(self, text: str) -> None:
        # A plain line parser: the full prometheus parser costs the caller ~20 ms a scrape,
        # CPU taken from the process being measured on a small machine.
        self.rows: list[tuple[str, dict[str, str], float]] = []
        for line in text.splitlines():
            if not line.startswith("memstream_"):
                continue
            head, _, value = line.rpartition(" ")
            name, _, labels = head.partition("{")
            pairs = (p.split("=", 1) for p in labels.rstrip("}").split(",") if "=" in p)
            self.rows.append((name, {k: v.strip('"') for k, v in pairs}, float(value)))

    def get(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = labels.items()
        return sum(
            v for n, lab, v in self.rows if n == name and all(lab.get(k) == x for k, x in wanted)
        )


# How long a hung process gets to write each stack dump before the next signal.
STACK_DUMP_WAIT_S = 2.0


class Process:
    """One memstream process: ``python -m <entry> run --roles ...`` with ``settings``.

    ``start()`` spawns it and waits until its HTTP listener answers ``/healthz`` (the RPC's
    port when it serves, else ``metrics_port``); ``spawn()`` and ``ready()`` are the two
    halves. ``stop()`` sends SIGTERM (the drain a pod gets), then SIGKILL after the timeout,
    and kills the children (embedded broker, Valkey) of a process that had to be killed.
    As a context manager it is started on entry and stopped on exit.

    ``entry`` is the module run with ``-m``; it must take ``run --roles R [args]`` as
    ``memstream`` does (``reliability.roles`` adds its fault injection that way). ``env``
    holds variables that are not settings; ``new_session`` starts it in its own process
    group, as a terminal does (so ``signal_group`` is a Ctrl-C).
    """

    def __init__(
        self,
        settings: Settings,
        roles: frozenset[Role] = ALL_ROLES,
        *,
        log_path: Path | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        entry: str = "memstream",
        cwd: Path | None = None,
        new_session: bool = False,
    ) -> None:
        if not roles:
            raise ValueError("a process plays at least one role")
        if "serve" not in roles and not settings.metrics_port:
            raise ValueError("a process that does not serve needs a metrics_port to be probed")
        self.settings = settings
        self.roles = roles
        self.log_path = log_path or settings.data_dir / f"memstream-{roles_arg(roles)}.log"
        self.args = tuple(args)
        self.env = process_env(settings, env)  # refuses MEMSTREAM_* settings spelt in env
        self.entry = entry
        self.cwd = cwd
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self.settings.rpc.port if "serve" in self.roles else self.settings.metrics_port

    @property
    def url(self) -> str:
        host = self.settings.rpc.host if "serve" in self.roles else self.settings.metrics_host
        return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", self.entry, "run", "--roles", roles_arg(self.roles)]

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError("the process was not started")
        return self.proc

    def spawn(self) -> Self:
        """Start the process and return at once (a sampler can watch its start-up)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:  # the child holds its own copy of the file
            self.proc = subprocess.Popen(
                [*self.command, *self.args],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.new_session,
            )
        return self

    def ready(self, timeout_s: float = 120.0, path: str = "/healthz") -> Self:
        """Wait until ``path`` answers 200; raise with the log's tail if the process exits."""
        wait_for(lambda: self._answers(path), timeout_s, f"{self.describe()} to answer {path}")
        return self

    def start(self, timeout_s: float = 120.0) -> Self:
        return self.spawn().ready(timeout_s)

    def describe(self) -> str:
        return f"memstream --roles {roles_arg(self.roles)} (log: {self.log_path})"

    def _answers(self, path: str) -> bool:
        code = self._proc.poll()
        if code is not None:
            raise RuntimeError(f"{self.describe()} exited {code}: {self.output()[-3000:]}")
        try:
            return httpx.get(f"{self.url}{path}", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def scrape(self, timeout_s: float = 60.0) -> str:
        """The ``/metrics`` page. Generous by default: a process busy with a replay on two
        cores can take seconds to answer."""
        return httpx.get(self.metrics_url, timeout=timeout_s).text

    def metrics(self, timeout_s: float = 60.0) -> Samples:
        return Samples(self.scrape(timeout_s))

    def send(self, sig: signal.Signals) -> None:
        self._proc.send_signal(sig)

    def signal_group(self, sig: signal.Signals) -> None:
        """``sig`` to the process's whole group (``new_session``): what a terminal sends."""
        os.killpg(self._proc.pid, sig)

    def wait(self, timeout_s: float | None = None) -> int:
        return self._proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL it and its children: no drain, no commit — the crash a power cut is."""
        if not self.running():
            return
        children = child_pids(self._proc.pid)
        self._proc.kill()
        self._proc.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (None: never started).

        Before the SIGKILL, the process writes to its log where it hangs: SIGQUIT, every
        thread's stack (``process_exit.dump_stacks_on_sigquit``); then SIGUSR1, the faust
        worker's asyncio tasks, if its loop still runs.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                for dump in (signal.SIGQUIT, signal.SIGUSR1):
                    if self.proc.poll() is None:
                        self.proc.send_signal(dump)
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            self.proc.wait(STACK_DUMP_WAIT_S)
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def wait_for(check: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.25) -> T:
    """Poll ``check`` until it returns something true, and return that; TimeoutError after."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


def child_pids(parent: int) -> list[int]:
    """Pids of the processes whose parent is ``parent`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return found
