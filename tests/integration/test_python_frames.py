"""CPython's own frames in `profiler run --pid`: a python process burning CPU in three functions of measured
work (tests/workloads/py_split.py) is sampled by our BPF walker, its frames named `module.qualname (file:line)`
from its code objects (profiler/unwind/cpython.py), and an application profile naming the functions gets
their shares right; on the venv's CPython, on the system's when that is another build, and on 3.13 (its
layout from its own _Py_DebugOffsets) where pyenv installed it."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.read import read_scope
from tests.fixtures.captures import folded_text
from tests.fixtures.privileges import requires
from tests.fixtures.window import profile_window

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "tests" / "workloads" / "py_split.py"
FUNCTIONS = ("parse_alpha", "enrich_beta", "filter_gamma")
PROFILE = "Alpha: py_split.parse_alpha\nBeta: py_split.enrich_beta\nGamma: py_split.filter_gamma\n"
SECONDS = 8
# only the --pid: no other engine's process on this host (another test's JVMs) is prepared or sampled
KNOWN_SPES = "test workload none org.example.NeverRunsHere\n"

pytestmark = requires("root")


def _interpreters() -> list[str]:
    """The venv's CPython, the system's when it is another binary, and pyenv's 3.13 where installed."""
    found = [os.path.realpath(sys.executable)]
    for other in ("/usr/bin/python3.11", os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python3.13")):
        if os.path.exists(other) and os.path.realpath(other) not in found:
            found.append(os.path.realpath(other))
    return found


class Workload:
    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, "-u", str(WORKLOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "ready"

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()


@pytest.fixture(params=_interpreters())
def workload(request: pytest.FixtureRequest) -> Iterator[Workload]:
    running = Workload(request.param)
    try:
        yield running
    finally:
        running.process.kill()
        running.process.wait(30)


def _leaf_function(stack: str) -> str | None:
    """The innermost of the three functions named in a folded stack (root first)."""
    for frame in reversed(stack.split(";")):
        for function in FUNCTIONS:
            if frame.startswith(f"py_split.{function} (py_split.py:"):
                return function
    return None


def test_python_functions_named_from_cpython_with_their_shares(tmp_path: Path, workload: Workload) -> None:
    # GIVEN a CPython process burning 50/30/20 in three functions that measure their own CPU
    profile = tmp_path / "profile.txt"
    profile.write_text(PROFILE)
    spes = tmp_path / "known_spes.txt"
    spes.write_text(KNOWN_SPES)
    out, status = tmp_path / "cap", tmp_path / "status.json"
    argv = [
        sys.executable, "-m", "profiler", "run", "--pid", str(workload.process.pid), "--duration", str(SECONDS),
        "--out", str(out), "--profile", str(profile), "--host", "testhost", "--status-file", str(status),
        "--known-spes", str(spes),
    ]  # fmt: skip

    def reset() -> None:
        assert workload.ask("reset") == "reset"

    # WHEN it is sampled for the window (the truth reset as the window starts, read as it ends)
    truth, stderr = profile_window(argv, status, reset, lambda: json.loads(workload.ask("shares")), start_timeout=120)
    # THEN its stacks carry the Python frames, named module.qualname (file:line)
    assert [(p.pid, p.kind, p.serves) for p in read_scope(out)] == [(workload.process.pid, "manual", None)]
    folded = Counter()
    for line in folded_text(out, workload.process.pid).splitlines():
        stack, _, count = line.rpartition(" ")
        folded[stack] += int(count)
    by_function = Counter()
    for stack, count in folded.items():
        by_function[_leaf_function(stack)] += count
    total = sum(folded.values())
    n = sum(by_function[f] for f in FUNCTIONS)
    assert n >= 300, (by_function, total, folded.most_common(5))
    # AND at most 5 % of the samples name none of the three (the loop between them is a few bytecodes)
    assert by_function[None] <= 0.05 * total, (by_function, folded.most_common(8))
    # AND the shares match the functions' own CPU within |z| <= 4
    spent = sum(truth[f] for f in FUNCTIONS)
    for function in FUNCTIONS:
        p = truth[function] / spent
        z = (by_function[function] / n - p) / math.sqrt(p * (1 - p) / n)
        assert abs(z) <= 4, (function, by_function, truth, z)
    # AND the profile's tasks (literal patterns on the Python frames) count what the frames say
    with open(out / capture.result_file_name("testhost")) as handle:
        rows = {r["task"]: int(r["samples"]) for r in csv.DictReader(handle) if r["pid"] == str(workload.process.pid)}
    for task, function in zip(("Alpha", "Beta", "Gamma"), FUNCTIONS, strict=True):
        assert rows.get(task) == by_function[function], (rows, by_function)
