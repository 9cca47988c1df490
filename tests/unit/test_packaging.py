"""The wheel holds every package of the tree: a room added under profiler/ or coordinator/ without its line
in setup.py's ``packages`` would be missing from an installed (non-editable) copy."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setup_packages() -> set[str]:
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "packages" and isinstance(node.value, ast.List):
            return {ast.literal_eval(element) for element in node.value.elts}
    raise AssertionError("setup.py has no literal packages=[...] list")


def test_every_package_of_the_tree_is_in_setup_py() -> None:
    tree_packages = {
        ".".join(init.parent.relative_to(REPO).parts)
        for root in ("profiler", "coordinator")
        for init in (REPO / root).rglob("__init__.py")
    }
    missing = tree_packages - _setup_packages()
    assert not missing, f"add to setup.py's packages: {sorted(missing)}"
