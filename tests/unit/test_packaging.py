"""The wheel holds the product only: the harness (bench/, reliability/) and its dependencies stay
in the checkout, behind the ``bench`` extra (issue 13, "the harness ships as product")."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

from memstream.cli import cli

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
HARNESS = {"bench", "reliability"}
HARNESS_ONLY_DEPS = {"aiohttp", "matplotlib", "psutil", "schemathesis"}


def dist_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s=<>!~;\[]", req, maxsplit=1)[0].lower() for req in requirements}


def test_the_wheel_packages_every_product_package_and_no_harness() -> None:
    packaged = set(PYPROJECT["tool"]["setuptools"]["packages"])
    top_level = {init.parent.name for init in REPO.glob("*/__init__.py")}
    assert top_level - packaged == HARNESS
    # One namespace: nothing generic (``schemas``, ``memory``) lands in site-packages.
    assert {name.split(".")[0] for name in packaged} == {"memstream"}


def test_every_subpackage_of_the_product_is_in_the_wheel() -> None:
    # setuptools' explicit list does not take subpackages (memstream.ops) by itself.
    packaged = set(PYPROJECT["tool"]["setuptools"]["packages"])
    nested = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in REPO.glob("*/**/__init__.py")
        if init.parent.relative_to(REPO).parts[0] in packaged
    }
    assert nested - packaged == set()
    assert "memstream.ops" in nested


def test_harness_dependencies_are_only_in_the_bench_extra() -> None:
    runtime = dist_names(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not runtime & HARNESS_ONLY_DEPS
    assert not dist_names(extras["dev"]) & HARNESS_ONLY_DEPS
    assert dist_names(extras["bench"]) == HARNESS_ONLY_DEPS


def test_dist_names_reads_pins_markers_and_extras() -> None:
    reqs = ["psutil==7.2.2", "Foo-Bar>=1; python_version<'3.12'", "uvicorn[standard]==0.54.0"]
    assert dist_names(reqs) == {"psutil", "foo-bar", "uvicorn"}


def test_the_old_bench_command_points_to_make_bench_in_one_line() -> None:
    result = CliRunner().invoke(cli, ["bench", "--quick"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "the benchmarks run from a checkout, not the installed memstream: `make bench`"
    ]
