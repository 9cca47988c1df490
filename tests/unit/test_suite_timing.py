"""tests/fixtures/suite_timing.py on suites of their own: the slowest modules are listed with the sum of their
tests' phases, every module's seconds are written to the cache directory's JSON file, a failing suite keeps
pytest's exit status, and a run that collects nothing still fails (5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.suite_timing import MODULE_SECONDS_FILE, module_seconds_payload, slowest_modules_lines

SLOW = """
import time

import pytest


@pytest.fixture
def slow_setup():
    time.sleep(0.3)
    yield
    time.sleep(0.2)


def test_slow(slow_setup):
    time.sleep(0.1)
"""

FAST_AND_FAILING = """
def test_fast():
    pass


def test_fails():
    assert 1 == 2
"""


def _pytest(
    tmp_path: Path, repo_root: Path, *args: str | Path, cache: str = "no:cacheprovider"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", cache, "-p", "tests.fixtures.suite_timing",
         "-c", os.devnull, "--rootdir", str(tmp_path), *map(str, args)],
        cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_slowest_module_first_with_its_phases_summed_and_the_exit_status_kept(tmp_path: Path, repo_root: Path) -> None:
    (tmp_path / "test_slow.py").write_text(SLOW)
    (tmp_path / "test_fast.py").write_text(FAST_AND_FAILING)
    done = _pytest(tmp_path, repo_root, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    section = done.stdout.split("2 slowest modules (set-up + call + teardown)", 1)[1].splitlines()
    slow, fast = section[1].split(), section[2].split()
    assert slow[-1] == "test_slow.py" and slow[2] == "1" and 0.6 <= float(slow[0]) < 5, section
    assert fast[-1] == "test_fast.py" and fast[2] == "2" and float(fast[0]) < float(slow[0]), section
    assert "outside the modules" in section[3] and "of the 40-minute budget" in section[4]
    assert "every module's seconds" not in done.stdout  # no cache directory: nothing written


def test_every_module_s_seconds_go_to_the_cache_directory(tmp_path: Path, repo_root: Path) -> None:
    # GIVEN two modules and a cache directory of the run's own; WHEN run with the cache on
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow.py").write_text(SLOW)
    (suite / "test_fast.py").write_text(FAST_AND_FAILING)
    cache_dir = tmp_path / "cache"
    done = _pytest(tmp_path, repo_root, suite, "-o", f"cache_dir={cache_dir}", cache="cacheprovider")
    # THEN the JSON file holds every module with its seconds and tests, slowest first, and the summary names it
    written = cache_dir / MODULE_SECONDS_FILE
    assert done.returncode == 1 and f"every module's seconds: {written}" in done.stdout, done.stdout + done.stderr
    payload = json.loads(written.read_text())
    slow, fast = payload["modules"]
    assert (slow["module"], slow["tests"]) == ("suite/test_slow.py", 1) and 0.6 <= slow["seconds"] < 5
    assert (fast["module"], fast["tests"]) == ("suite/test_fast.py", 2) and fast["seconds"] < slow["seconds"]
    assert payload["wall_seconds"] >= slow["seconds"] + fast["seconds"] and payload["budget_seconds"] == 2400


def test_the_payload_keeps_every_module_not_only_the_slowest_shown() -> None:
    seconds = {f"tests/test_{i:02d}.py": float(i) for i in range(15)}
    tests = {module: {module + "::a", module + "::b"} for module in seconds}
    payload = module_seconds_payload(seconds, tests, wall_seconds=200.0)
    assert [m["module"] for m in payload["modules"]] == [f"tests/test_{i:02d}.py" for i in reversed(range(15))]
    assert payload["modules"][-1] == {"module": "tests/test_00.py", "seconds": 0.0, "tests": 2}
    assert payload["wall_seconds"] == 200.0


def test_a_run_that_collects_nothing_fails(tmp_path: Path, repo_root: Path) -> None:
    (tmp_path / "test_empty.py").write_text("X = 1\n")
    done = _pytest(tmp_path, repo_root, tmp_path)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "slowest modules" not in done.stdout


def test_the_rest_are_one_line_after_the_slowest() -> None:
    seconds = {f"tests/test_{i:02d}.py": float(i) for i in range(12)}
    tests = {module: {module + "::t"} for module in seconds}
    lines = slowest_modules_lines(seconds, tests, wall_seconds=100.0)
    assert lines[0].split()[-1] == "tests/test_11.py" and lines[9].split()[-1] == "tests/test_02.py"
    assert lines[10].split()[:4] == ["1.0", "s", "2", "other"]  # test_00 (0 s) and test_01 (1 s)
    assert lines[11].startswith("    34.0 s  outside")  # 100 s less the 66 s in the modules
    assert "4% of the 40-minute budget" in lines[12]
