"""Every command's --help shows its whole text, examples included, not only a summary line (a class
docstring left beside ``__doc__ = __doc__`` once hid `profiler match`'s examples)."""

from __future__ import annotations

import importlib

import pytest

from profiler.cli import discover_commands

COMMANDS = [(package, name) for package in ("profiler", "coordinator") for name in discover_commands(package, ())]


@pytest.mark.parametrize(("package", "name"), COMMANDS, ids=[f"{p}-{n}" for p, n in COMMANDS])
def test_help_has_examples(package: str, name: str) -> None:
    command_class = importlib.import_module(f"{package}.commands.{name}").COMMAND
    text = (command_class.__doc__ or "").strip()
    assert "examples:" in text, f"{package} {name} --help shows no examples"
    assert len(text.splitlines()) > 3
