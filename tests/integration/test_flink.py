"""Flink for real: the scope analyzer on a real Flink 2.3 standalone cluster, and `coordinator demo
--spe flink` end to end (real TaskManagers and JobManager, real eBPF, real Redis): roles, every YSB
task sampled, events counted from the REST API and checked against the job's own count."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

from coordinator.workloads.flinkcluster import LocalFlinkCluster
from profiler.scope import ScopeAnalyzer
from profiler.spes import default_known_spes_path, load_known_spes

REPO = Path(__file__).resolve().parents[2]
YSB_TASKS = ("Kafka/Source", "Deserialize", "Filter+Projection", "Join", "Enrich", "Window", "Sink")


def test_scope_finds_the_jobmanager_managing_and_the_taskmanagers_workload(flink_cluster: LocalFlinkCluster) -> None:
    # GIVEN a running Flink 2.3 cluster; WHEN the scope analyzer scans with the shipped known_spes
    scope = ScopeAnalyzer(load_known_spes(default_known_spes_path()), exec_watch=False)
    try:
        scope.start()
        found = {p.pid: p for p in scope.processes()}
    finally:
        scope.close()
    # THEN the JobManager is managing and both TaskManagers are workload, all JVMs with frame pointers
    jobmanager = found[flink_cluster.jobmanager_pid() or -1]
    assert (jobmanager.engine, jobmanager.role, jobmanager.kind) == ("flink", "managing", "jobmanager")
    taskmanagers = flink_cluster.taskmanager_pids()
    assert len(taskmanagers) == 2
    for pid in taskmanagers:
        assert (found[pid].engine, found[pid].role, found[pid].kind) == ("flink", "workload", "taskmanager")
        assert found[pid].preserve_frame_pointer is True
        assert found[pid].jvm_version and found[pid].jvm_version.startswith("17")
    assert jobmanager.preserve_frame_pointer is True


def test_scope_sees_a_taskmanager_that_starts_while_it_watches(flink_cluster: LocalFlinkCluster) -> None:
    scope = ScopeAnalyzer(load_known_spes(default_known_spes_path()))
    worker = None
    try:
        # GIVEN the analyzer watches exec events; WHEN a third TaskManager starts
        scope.start()
        assert scope.exec_watch_mode == "tracepoint", scope.exec_watch_error
        worker = flink_cluster.add_taskmanager(wait=False)
        found = None
        deadline = time.monotonic() + 60
        while found is None and time.monotonic() < deadline:
            found = next((p for p in scope.poll()[0] if p.pid == worker.process.pid), None)
            time.sleep(0.2)
        # THEN it is found by the exec watcher (the script execs into the JVM) as workload
        assert found is not None, "the new TaskManager was not found within 60 s"
        assert (found.engine, found.role, found.kind, found.source) == ("flink", "workload", "taskmanager", "exec")
        assert "TaskManagerRunner" in found.cmdline
        flink_cluster.wait_for_taskmanagers(3)
    finally:
        scope.close()
        if worker is not None:
            flink_cluster.remove_taskmanager(worker)


def _rows(summary_csv: Path) -> list[dict[str, str]]:
    with open(summary_csv, newline="") as handle:
        return list(csv.DictReader(handle))


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_demo_flink_profiles_every_ysb_task_and_counts_events(tmp_path: Path) -> None:
    # GIVEN nothing; WHEN the Flink demo runs for a short window
    out = tmp_path / "demo-flink"
    duration = 30
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--spe", "flink", "--duration", str(duration),
         "--rate", "10000", "--warmup", "20", "--out", str(out), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert time.monotonic() - started < 600

    # THEN summary.csv has the two TaskManagers as workload and the JobManager as managing
    rows = _rows(out / "summary.csv")
    pid_rows = [r for r in rows if r["pid"] not in ("*", "")]
    workload = {r["pid"] for r in pid_rows if r["role"] == "workload"}
    managing = {r["pid"] for r in pid_rows if r["role"] == "managing"}
    assert len(workload) == 2 and len(managing) == 1, (workload, managing)
    assert {r["engine"] for r in pid_rows} == {"flink"}

    # AND every YSB task was sampled, with little left unmatched
    whole = {r["task"]: r for r in rows if r["host"] == "*" and r["pid"] == "*" and r["role"] == "workload"}
    shares = {task: float(row["share"] or 0.0) for task, row in whole.items()}
    for task in YSB_TASKS:
        assert shares.get(task, 0.0) > 0.0, f"{task} has no samples: {shares}"
    assert shares.get("unmatched", 1.0) < 0.10, f"unmatched too large: {shares}"

    # AND events come from the REST API, about the offered load, and agree with the job's own count
    (events_json,) = (out / "hosts").glob("*/events.json")
    counted = json.loads(events_json.read_text())
    assert counted["source"].startswith("flink-rest:"), counted
    rest = int(counted["count"])
    done = re.search(r"demo: \d+ 10 s windows, (\d+) events in the \d+ s window; .*; (\d+) window rows in the sink",
                     result.stdout)
    assert done, result.stdout
    own, windows = (int(g) for g in done.groups())
    assert windows > 0
    assert abs(rest - own) <= 0.05 * own, (rest, own)
    assert 0.5 * 10_000 * duration <= rest <= 1.1 * 10_000 * duration, rest
    assert {int(row["events"]) for row in whole.values()} == {rest}
    assert float(whole["Deserialize"]["cycles_per_event"]) > 0.0

    # AND everything the demo started is gone
    logs = re.search(r"\(logs (\S+)\)", result.stdout)
    assert logs, result.stdout
    assert _processes_mentioning(logs.group(1)) == []
