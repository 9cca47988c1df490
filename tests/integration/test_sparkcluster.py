"""LocalSparkCluster on real Spark: the cluster starts, a job runs on an executor JVM, a Worker added
mid-run gets an executor, and stopping (also by Ctrl-C) leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from coordinator.workloads.sparkcluster import EXECUTOR_MAIN_CLASS, LocalSparkCluster
from tests.fixtures.spark import BUSY_JOB, submit_busy_job

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cluster_runs_job_on_executor_and_adds_worker(spark_cluster: LocalSparkCluster) -> None:
    # GIVEN a started cluster: the Master lists one ALIVE worker (besides the DEAD entries of workers that
    # earlier users of the session's cluster added and removed, e.g. test_pyspark_udfs': the Master keeps them)
    state = spark_cluster.master_state()
    workers: list[dict[str, str]] = state["workers"]  # type: ignore[assignment]
    assert [w["state"] for w in workers if w["state"] != "DEAD"] == ["ALIVE"], workers
    assert all(_alive(pid) for pid in spark_cluster.daemon_pids())

    # WHEN an app that wants two 1-core executors runs on the 1-core worker
    app = submit_busy_job(spark_cluster, seconds=120, conf={"spark.cores.max": "2"})
    try:
        # THEN it runs on one executor JVM, a descendant of our Worker, with frame pointers on
        (executor,) = spark_cluster.executor_pids()
        proc = psutil.Process(executor)
        assert EXECUTOR_MAIN_CLASS in proc.cmdline()
        assert "-XX:+PreserveFramePointer" in proc.cmdline()
        assert proc.exe().endswith("/java")
        assert executor in {c.pid for c in psutil.Process(spark_cluster.workers[0].process.pid).children(True)}
        assert os.getpgid(executor) == spark_cluster.workers[0].process.pid
        app.wait_for_output(r"^ITERATION 2", timeout=60)

        # WHEN a second worker joins mid-run, THEN the app gets a second executor there
        second = spark_cluster.add_worker(cores=1, memory="1g")
        try:
            pids = spark_cluster.wait_for_executors(2, timeout=90)
            assert executor in pids and len(pids) == 2
            added = (set(pids) - {executor}).pop()
            assert os.getpgid(added) == second.process.pid
        finally:
            # The cluster outlives this test: the worker added here must go with it.
            spark_cluster.remove_worker(second)
        assert not _alive(added)
        assert spark_cluster.executor_pids() == [executor]
    finally:
        spark_cluster.stop_app(app)
    assert app.poll() is not None
    deadline = time.monotonic() + 30
    while spark_cluster.executor_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spark_cluster.executor_pids() == []


_CTRL_C_SCRIPT = """
import json, sys, time
sys.path.insert(0, {repo!r})
from coordinator.workloads.sparkcluster import LocalSparkCluster
with LocalSparkCluster() as cluster:
    cluster.submit({job!r}, ["--seconds", "120"])
    cluster.wait_for_executors(1, timeout=180)  # the app's whole tree is up; its first job adds no process
    print(json.dumps({{"pids": cluster.all_pids(), "executors": cluster.executor_pids(),
                      "tmp": str(cluster.tmp_dir)}}), flush=True)
    time.sleep(600)
"""


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    # GIVEN a script holding a cluster with a running app (master, worker, driver, executor), from the
    # moment its executor JVM is there
    script = tmp_path / "hold_cluster.py"
    script.write_text(_CTRL_C_SCRIPT.format(repo=str(REPO), job=str(BUSY_JOB)))
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, "holder script died before the app was ready"
        started = json.loads(line)
        assert len(started["executors"]) == 1
        assert len(started["pids"]) >= 5  # master, worker, spark-submit JVM, python driver, executor
        assert all(_alive(pid) for pid in started["pids"])

        # WHEN it gets Ctrl-C
        holder.send_signal(signal.SIGINT)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()

    # THEN every process it started is gone and the temporary directory removed
    assert [pid for pid in started["pids"] if _alive(pid)] == []
    assert not Path(started["tmp"]).exists()
