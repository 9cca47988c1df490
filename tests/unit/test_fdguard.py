"""tests/fixtures/fdguard.py on a suite of its own: a test that takes pytest's stderr capture descriptor is
named, and the tests after it still write to stderr (stop 37's CI failed in such victims)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os, sys

def test_takes_the_descriptor():
    read_end, write_end = os.pipe()
    os.dup2(write_end, sys.stderr.fileno())  # a pipe whose reader goes: writes to it raise EPIPE
    os.close(read_end)
    os.close(write_end)

def test_victim_without_capsys():
    print("wrote something", file=sys.stderr)

def test_victim_with_capsys(capsys):
    print("left unread", file=sys.stderr)  # capsys hands it to the global capture at its close
"""


def test_the_taker_is_named_and_later_tests_still_write_to_stderr(tmp_path: Path, repo_root: Path) -> None:
    suite = tmp_path / "test_suite.py"
    suite.write_text(SUITE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fixtures.fdguard",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(suite)],
        cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout and "BrokenPipeError" not in done.stdout
    section = done.stdout.split("descriptors taken", 1)[1]
    assert "test_suite.py::test_takes_the_descriptor: pytest's capture descriptor" in section
    assert "is now pipe:" in section and "victim" not in section
