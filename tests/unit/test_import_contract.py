"""The layers of both packages as a checked contract: `make import-contract` (part of `make lint`) keeps
the tree as it is and fails on an import that crosses a layer, shown in a temporary copy of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CONTRACT_FILES = ("pyproject.toml", "Makefile")


def run_contract(tree: Path) -> subprocess.CompletedProcess[str]:
    """`make import-contract` in ``tree``, importing that tree's packages (not the installed ones)."""
    if shutil.which("make") is None or not (VENV_BIN / "lint-imports").exists():
        pytest.fail("make or lint-imports is missing: scripts/setup.sh installs them (build-essential, .[dev])")
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        ["make", "-s", "-C", str(tree), "import-contract", f"VENV={VENV_BIN.parent}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for package in ("profiler", "coordinator"):
        shutil.copytree(REPO / package, copy / package, ignore=ignore)
    for name in CONTRACT_FILES:
        shutil.copy2(REPO / name, copy / name)
    return copy


def add_import(module: Path, line: str) -> None:
    text = module.read_text(encoding="utf-8")
    module.write_text(text + f"\n{line}\n", encoding="utf-8")


def test_the_tree_keeps_every_contract() -> None:
    result = run_contract(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_copy_of_the_tree_keeps_every_contract(tree_copy: Path) -> None:
    # the control for the tests below: the copy alone is not what breaks the contract
    result = run_contract(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr


# One import that crosses a layer per contract: (module, the line added to it, the contract it breaks).
FORBIDDEN = [
    # matching imports sampling: the pure rooms import nothing that reads a live host
    ("profiler/matching/matcher.py", "from profiler.sampling import sampler", "profiler-pure-rooms"),
    # a room imports the room above it
    ("profiler/scope/jvm.py", "from profiler.symbols import perfmap", "profiler-layers"),
    # the host agent imports the coordinator
    ("profiler/run/runner.py", "import coordinator.rundir", "profiler-needs-only-bcc-psutil"),
    # the coordinator imports the sampling machinery
    ("coordinator/report/flame.py", "from profiler.sampling import counters", "coordinator-uses-the-capture-side"),
    # a command imported from below the commands
    ("coordinator/analysis/rows.py", "from coordinator.commands import analyze", "coordinator-layers"),
]


def contract_names(pyproject: Path) -> dict[str, str]:
    import tomllib

    contracts = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    return {c["id"]: " ".join(c["name"].split()) for c in contracts}


def test_every_contract_is_tried() -> None:
    assert {contract for _, _, contract in FORBIDDEN} == set(contract_names(REPO / "pyproject.toml"))


def test_a_forbidden_import_breaks_its_contract(tree_copy: Path) -> None:
    # GIVEN a copy of the tree with one import that crosses a layer per contract
    for module, line, _ in FORBIDDEN:
        add_import(tree_copy / module, line + "  # noqa: E402,F401")
    # WHEN the contract runs on the copy
    result = run_contract(tree_copy)
    # THEN it fails, and the report says each contract is broken by the import added for it
    assert result.returncode != 0
    report = " ".join(result.stdout.split())
    for module, _, contract in FORBIDDEN:
        name = contract_names(tree_copy / "pyproject.toml")[contract]
        assert f"{name} BROKEN" in report, (contract, result.stdout)
        assert module[: -len(".py")].replace("/", ".") in report, (module, result.stdout)
