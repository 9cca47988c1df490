"""PySpark users' own Python UDFs named in a real Structured Streaming query on the session's standalone
cluster: the query's three UDFs (tests/workloads/py_udf_split.py, work 50/30/20, each measuring its own CPU
in the Python worker) run on two apps at once, one whose driver and workers are the venv's CPython (3.11)
and one on pyenv's 3.13 (its frame layout read from its own _Py_DebugOffsets; the venv's twice, with
Debian's 3.11, where 3.13 is not installed). One `profiler run` window samples both apps' Python workers
(known_spes.txt's python-worker kinds, tied to their executor); the functions' shares of each app's worker
samples, found by the Python frames on the stacks and by an application profile's tasks, must match the
workers' own CPU.

Statistics: at 199 Hz for 10 s (less the seconds before the worker's preparation, at most 4) each app's
worker (at most half of a 2-core machine, the other app's worker beside it) gets some 400-1,000 samples in
the three functions; for the 50 % function the standard error of its share is then 1.6-2.5 points, so
|z| <= 4 allows 6-10 points. The truth is each function's own time.thread_time, written by the worker every
50 ms and polled by the test every 50 ms (a lag of at most ~0.1 s at each end of what is compared, spread
over the three functions alike since every row runs all three in turn)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.workloads.sparkcluster import LocalSparkCluster, SparkSubmitProcess
from profiler.capture import format as capture
from profiler.capture.read import read_pid_table, read_scope
from tests.fixtures.privileges import requires
from tests.fixtures.window import profile_window

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = REPO / "tests" / "workloads"
APP, UDFS = WORKLOADS / "pyspark_udf_stream.py", WORKLOADS / "py_udf_split.py"
FUNCTIONS = ("parse_alpha", "enrich_beta", "filter_gamma")
TASKS = ("Alpha", "Beta", "Gamma")
PROFILE = "".join(f"{task}: py_udf_split.{function}\n" for task, function in zip(TASKS, FUNCTIONS, strict=True))
# the Python workers only are sampled (no other engine's or test's process prepared or sampled beside
# them); the executor is in the scope, not sampled, so that the workers are tied to it
KNOWN_SPES = (
    "spark managing executor org.apache.spark.executor.CoarseGrainedExecutorBackend\n"
    "spark workload python-worker pyspark.daemon\n"
    "spark workload python-worker pyspark.worker\n"
)
SECONDS, FREQUENCY = 10, 199
POLL = 0.05  # seconds between reads of the truth files
UNNAMED = "(no named Python frame)"
PYTHON_FRAME = re.compile(r"^\S+ \(\S+:\d+\)$")  # module.qualname (file:line)
PYENV_313 = os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python3.13")

pytestmark = requires("root")


def _interpreters() -> tuple[str, str]:
    """The venv's CPython and another: pyenv's 3.13 where installed, else Debian's 3.11 (another build)."""
    for other in (PYENV_313, "/usr/bin/python3.11"):
        if os.path.exists(other) and os.path.realpath(other) != os.path.realpath(sys.executable):
            return sys.executable, other
    pytest.fail("no CPython besides the venv's: scripts/setup.sh installs Debian's python3.11")


class UdfApp:
    """One submitted streaming app, its interpreter and the folder its Python workers write their truth to."""

    def __init__(self, cluster: LocalSparkCluster, python: str, truth: Path) -> None:
        truth.mkdir()
        self.python, self.truth = python, truth
        self.process: SparkSubmitProcess = cluster.submit(
            APP,
            ["--seconds", "240"],
            conf={
                "spark.submit.pyFiles": str(UDFS),
                "spark.executorEnv.UDF_TRUTH_DIR": str(truth),
                "spark.sql.execution.pythonUDF.arrow.enabled": "false",
                "spark.python.worker.reuse": "true",
            },
            name=f"udf-stream-{Path(python).name}",
            env={"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
        )

    def spent(self) -> dict[int, dict[str, float]]:
        """Each worker's running totals (pid -> function -> CPU seconds)."""
        return {int(path.stem): json.loads(path.read_text()) for path in self.truth.glob("*.json")}


@pytest.fixture
def two_apps(spark_cluster: LocalSparkCluster, tmp_path: Path) -> Iterator[list[UdfApp]]:
    """Both apps running rows through their UDFs, each on an executor of its own (a second Worker added for
    the test, removed after)."""
    apps: list[UdfApp] = []
    worker = None
    try:
        for index, python in enumerate(_interpreters()):
            apps.append(UdfApp(spark_cluster, python, tmp_path / f"truth{index}"))
        # the second Worker's JVM starts beside the drivers'
        worker = spark_cluster.add_worker(cores=1, memory="1g", wait=False)
        for app in apps:
            app.process.wait_for_output(r"^READY", timeout=240)
        yield apps
    finally:
        for app in apps:
            spark_cluster.stop_app(app.process)
        if worker is not None:
            spark_cluster.remove_worker(worker)


def _function_of(stack: str) -> str | None:
    """The innermost of the three functions named in a folded stack (root first)."""
    for frame in reversed(stack.split(";")):
        for function in FUNCTIONS:
            if frame.startswith(f"py_udf_split.{function} (py_udf_split.py:"):
                return function
    return None


class TruthPoller:
    """Each app's workers' totals read every POLL seconds from the window's start (unix time, totals), so the
    truth of any part of the window is known."""

    def __init__(self, apps: list[UdfApp]) -> None:
        self.apps = apps
        self.snapshots: list[tuple[float, list[dict[int, dict[str, float]]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.snapshots.append((time.time(), [app.spent() for app in self.apps]))
            self._stop.wait(POLL)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.snapshots.append((time.time(), [app.spent() for app in self.apps]))

    def at(self, when: float, app: int) -> dict[int, dict[str, float]]:
        """The app's totals as last read at or before ``when``."""
        return [totals[app] for taken, totals in self.snapshots if taken <= when][-1]


def test_pyspark_udfs_shares_named_from_python_frames(tmp_path: Path, two_apps: list[UdfApp]) -> None:
    # GIVEN two streaming apps whose workers burn 50/30/20 in three UDFs measuring their own CPU
    profile, spes = tmp_path / "profile.txt", tmp_path / "known_spes.txt"
    profile.write_text(PROFILE)
    spes.write_text(KNOWN_SPES)
    out, status = tmp_path / "cap", tmp_path / "status.json"
    argv = [
        sys.executable, "-m", "profiler", "run", "--duration", str(SECONDS), "--frequency", str(FREQUENCY),
        "--interval", "1", "--out", str(out), "--profile", str(profile), "--host", "testhost",
        "--status-file", str(status), "--known-spes", str(spes),
    ]  # fmt: skip
    truth = TruthPoller(two_apps)

    # WHEN their Python workers are sampled for one window (each worker's truth polled through it)
    profile_window(argv, status, truth.start, truth.stop, start_timeout=180)
    scope = {p.pid: p for p in read_scope(out)}
    window_start = json.loads((out / "meta.json").read_text())["start_time"]
    with open(out / capture.result_file_name("testhost")) as handle:
        task_rows = list(csv.DictReader(handle))
    for index, app in enumerate(two_apps):
        _check_app(app, index, truth, window_start, scope, out, task_rows)


def _check_app(
    app: UdfApp,
    index: int,
    truth: TruthPoller,
    window_start: float,
    scope: dict[int, capture.ProcessInfo],
    out: Path,
    task_rows: list[dict[str, str]],
) -> None:
    where = f"{app.python}: "
    end = truth.snapshots[-1][1][index]
    workers = sorted(end)
    # THEN every worker that ran the UDFs is in the scope as a python-worker serving an executor
    assert workers and all(scope.get(pid) is not None for pid in workers), (where, workers, sorted(scope))
    assert {(scope[pid].kind, scope[pid].role) for pid in workers} == {("python-worker", "workload")}, where
    assert all(scope[pid].serves in scope and scope[scope[pid].serves].kind == "executor" for pid in workers), where
    # AND their stacks carry the Python frames, named module.qualname (file:line): per second of the window
    seconds: dict[int, Counter[str | None]] = defaultdict(Counter)
    for pid in workers:
        table = read_pid_table(out, pid)
        assert table is not None and table.timeline, (where, pid)
        text = table.stack_text(table.frame_texts())
        for interval, stack_id, count in zip(table.intervals, table.stack_ids, table.counts, strict=True):
            stack = text(stack_id)
            named = any(PYTHON_FRAME.match(frame) for frame in stack.split(";"))
            seconds[interval][_function_of(stack) if named else UNNAMED] += count
    whole = sum(seconds.values(), Counter())
    # The samples taken before the worker's preparation (its layout and unwind tables, beside sampling)
    # have native frames only (docs/python-frames.md, limits): the seconds up to the first with a named
    # Python frame are left out, samples and truth alike, and at least SECONDS - 4 s must remain.
    first = min(i for i, counted in seconds.items() if sum(counted.values()) > counted[UNNAMED])
    kept = sum((counted for i, counted in seconds.items() if i > first), Counter())
    assert first + 1 <= 4, (where, "named frames only from second", first, dict(seconds))
    total = sum(kept.values())
    n = sum(kept[f] for f in FUNCTIONS)
    assert n >= 200, (where, kept, dict(seconds))
    # AND at most 5 % of the workers' samples after that have no named Python frame
    assert kept[UNNAMED] <= 0.05 * total, (where, kept, dict(seconds))
    # AND each function's share of the samples in the three matches its share of their CPU within |z| <= 4
    began, ended = truth.at(window_start + first + 1, index), end
    spent = {f: sum(ended[pid][f] - began.get(pid, {}).get(f, 0.0) for pid in ended) for f in FUNCTIONS}
    report = []
    for function in FUNCTIONS:
        p = spent[function] / sum(spent.values())
        z = (kept[function] / n - p) / math.sqrt(p * (1 - p) / n)
        report.append(f"{function} {kept[function] / n:.3f} vs {p:.3f} z={z:+.2f}")
        assert abs(z) <= 4, (where, function, kept, spent, z)
    print(
        f"{where}from second {first + 1}: n={n} samples={total} unnamed={kept[UNNAMED] / total:.2%} "
        f"outside the three={kept[None] / total:.2%}; " + "; ".join(report)
    )
    # AND the profile's tasks (literal patterns on the Python frames) count what the frames say (whole window)
    counted: Counter[str] = Counter()
    for row in task_rows:
        if int(row["pid"]) in workers:
            counted[row["task"]] += int(row["samples"])
    for task, function in zip(TASKS, FUNCTIONS, strict=True):
        assert counted[task] == whole[function], (where, counted, whole)
