"""`coordinator demo` end to end on real Spark, real eBPF and real Redis: the YSB tasks show up in
summary.csv with the window's events and cycles per event, unmatched stays small, the sink wrote
windows, its exports agree with summary.csv, nothing is left running, and a workload that dies
leaves its logs, named in the error. The default and Continuous Processing demos are the session's
(tests/fixtures/demo.py), shared with test_spark_stages.py; the default one is the first level of the
session's two-rate campaign, which the campaign test reads."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.fixtures.demo import CAMPAIGN_RATE, SHARED_RATE, SHARED_WINDOW, DemoRun, run_demo
from tests.fixtures.exports import assert_exports_agree_with_summary

REPO = Path(__file__).resolve().parents[2]
REQUIRED_TASKS = ("Deserialize", "Filter+Projection+Join", "Window", "Sink")


def _whole_run_shares(summary_csv: Path) -> dict[str, float]:
    """task -> share of the run's workload samples (the host "*", pid "*" rows)."""
    with open(summary_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["pid"] == "*" and r["role"] == "workload"]
    hosts = {r["host"] for r in rows}
    host = "*" if "*" in hosts else hosts.pop()
    return {r["task"]: float(r["share"] or 0.0) for r in rows if r["host"] == host}


def _event_rows(summary_csv: Path) -> list[dict[str, str]]:
    """The workload task rows of the whole run (host "*", pid "*") with their event columns."""
    with open(summary_csv, newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["pid"] == "*" and r["host"] == "*" and r["role"] == "workload"]


def _assert_events_counted(out: Path, source_prefix: str) -> None:
    """events.json has a count from the engine, and summary.csv cycles per event for every task."""
    (events_file,) = out.glob("hosts/*/events.json")
    events = json.loads(events_file.read_text())
    assert events["count"] and events["count"] > 0, events
    assert events["source"].startswith(source_prefix), events
    rows = _event_rows(out / "summary.csv")
    assert rows, "no cluster rows in summary.csv"
    for row in rows:
        assert int(row["events"]) == events["count"], row
        if float(row["cycles"] or 0) > 0:
            assert float(row["cycles_per_event"]) > 0, row


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append((proc.pid, " ".join(proc.info["cmdline"])[:120]))
        except psutil.Error:
            continue
    return found


def _processes_gone(text: str, timeout: float = 10.0) -> list[tuple[int, str]]:
    """The processes still mentioning ``text`` once none are left or ``timeout`` has passed (a JVM the
    demo killed may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout
    while (left := _processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_demo_profiles_ysb_tasks(spark_str_demo: DemoRun) -> None:
    # GIVEN nothing; WHEN the demo runs for a short window (the session's, shared with test_spark_stages)
    spark_str_demo.check_succeeded()
    out, result = spark_str_demo.out, spark_str_demo.result

    # THEN the report and summary exist and every YSB task got CPU, with little left unmatched
    summary = out / "summary.csv"
    assert summary.is_file(), result.stdout
    assert re.search(r"^wrote .*report", result.stdout, re.MULTILINE), result.stdout
    shares = _whole_run_shares(summary)
    for task in REQUIRED_TASKS:
        assert shares.get(task, 0.0) > 0.0, f"{task} has no samples: {shares}"
    assert shares.get("unmatched", 0.0) < 0.20, f"unmatched too large: {shares}"
    # AND the window's events were counted from the driver's REST API: cycles per event per task
    _assert_events_counted(out, "spark-rest:")
    # AND its speedscope, pprof and folded exports agree with summary.csv task by task (docs/exports.md)
    assert_exports_agree_with_summary(out)

    # AND the pipeline really ran: micro-batches processed and window rows written to the sink
    done = re.search(r"demo: (\d+) micro-batches, (\d+) events .* (\d+) window rows in the sink", result.stdout)
    assert done, result.stdout
    batches, events, windows = (int(g) for g in done.groups())
    assert batches >= 1 and events > 0 and windows > 0, done.group(0)

    # AND everything the demo started is gone (its processes were not our children after it exited)
    started = re.search(r"demo: Spark master (spark://[\d.:]+) \(logs (\S+)\)", result.stdout)
    assert started, result.stdout
    assert _processes_mentioning(started.group(2)) == []
    assert _processes_mentioning(started.group(1)) == []


def test_demo_keeps_the_logs_of_a_workload_that_died(tmp_path: Path) -> None:
    # GIVEN a demo whose query is processing (a long warm-up keeps it from profiling; one executor: its
    # first batch's code is generated and JIT-compiled in one cold JVM, not two side by side on two cores)
    out = tmp_path / "demo-died"
    demo = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "demo", "--duration", "20", "--warmup", "600", "--rate", "5000",
         "--campaigns", "100", "--executors", "1", "--out", str(out), "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        master = None
        assert demo.stdout is not None
        for line in demo.stdout:
            found = re.search(r"demo: Spark master (spark://[\d.:]+)", line)
            master = found.group(1) if found else master
            if line.startswith("demo: processing"):
                break
        assert master is not None, "the demo never printed its master"
        # WHEN the driver JVM of the YSB app dies (as it did of OutOfMemoryError)
        drivers = [
            proc.pid for proc in psutil.process_iter(["cmdline"])
            if master in (proc.info["cmdline"] or []) and "org.apache.spark.deploy.SparkSubmit" in proc.info["cmdline"]
        ]
        assert drivers, _processes_mentioning(master)
        for pid in drivers:
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = demo.communicate(timeout=300)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    # THEN the demo fails with one line naming the app's log, which exists in the run directory
    assert demo.returncode not in (0, None), stdout
    named = re.search(r"(\S+/workload/\S+\.err): the YSB app exited", stderr)
    assert named, stderr
    assert Path(named.group(1)).is_file()
    assert Path(named.group(1)).resolve().is_relative_to(out.resolve())
    # AND the other logs (master, worker, executors) are kept beside it, nothing keeps running
    kept = {p.name for p in (out / "workload").rglob("*") if p.is_file()}
    assert {"master.log", "worker1.log", "stderr"} <= kept, kept
    assert _processes_gone(master) == []


def test_demo_on_continuous_processing(spark_cp_demo: DemoRun) -> None:
    # GIVEN nothing; WHEN the demo runs YSB on Spark Continuous Processing (the session's run)
    spark_cp_demo.check_succeeded()
    out, result = spark_cp_demo.out, spark_cp_demo.result
    # THEN the CP profile's tasks got CPU, the sink kept windows in Redis, and the events came from
    # the query's offsets log (a continuous query has no micro-batches for the REST count)
    shares = _whole_run_shares(out / "summary.csv")
    for task in ("Kafka/Source", "Deserialize", "Filter+Projection+Join", "Window"):
        assert shares.get(task, 0.0) > 0.0, f"{task} has no samples: {shares}"
    assert shares.get("unmatched", 0.0) < 0.20, f"unmatched too large: {shares}"
    done = re.search(r"demo: (\d+) epochs, (\d+) events .* (\d+) window rows in the sink", result.stdout)
    assert done and int(done.group(2)) > 0 and int(done.group(3)) > 0, result.stdout
    _assert_events_counted(out, "spark-offsets-log")
    assert json.loads((out / "run.json").read_text())["labels"]["spe"] == "spark-continuous-processing"


def test_demo_campaign_over_two_rates(spark_str_campaign: DemoRun) -> None:
    # GIVEN nothing; WHEN the demo runs a campaign of two profiles on one cluster (the session's: the
    # shared Structured Streaming demo is its first level)
    spark_str_campaign.check_succeeded()
    out, result = spark_str_campaign.out, spark_str_campaign.result

    # THEN one cluster served both rates (one master line), each rate is a run with its rate label
    masters = re.findall(r"demo: Spark master (spark://[\d.:]+) \(logs (\S+)\)", result.stdout)
    assert len(masters) == 1, result.stdout
    assert f"restarting the query at {CAMPAIGN_RATE} events/s on the same cluster" in result.stdout
    for rate in (str(SHARED_RATE), str(CAMPAIGN_RATE)):
        run = json.loads((out / f"spark-str-{rate}" / "run.json").read_text())
        assert run["labels"]["rate"] == rate and run["labels"]["spe"] == "spark-structured-streaming"
        _assert_events_counted(out / f"spark-str-{rate}", "spark-rest:")

    # AND campaign.csv has one row per run and task, with cycles per event and an interval for the tasks
    with open(out / "campaign" / "campaign.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    runs = {r["run"] for r in rows}
    assert len(runs) == 2 and {r["rate"] for r in rows} == {str(SHARED_RATE), str(CAMPAIGN_RATE)}
    tasks = [r["task"] for r in rows if r["run"] == min(runs)]
    assert len(rows) == 2 * len(tasks) and len(set(tasks)) == len(tasks)
    for task in REQUIRED_TASKS:
        for row in (r for r in rows if r["task"] == task):
            assert float(row["cycles_per_event"]) > 0 and float(row["cycles_per_event_ci95"]) > 0, row
    assert (out / "campaign" / "report" / "index.html").is_file()
    assert re.search(r"^wrote .*campaign/report/index.html", result.stdout, re.MULTILINE), result.stdout
    assert _processes_mentioning(masters[0][0]) == []


def _executor_stats(out: Path) -> tuple[int, int, int, int]:
    """(samples, unwalkable, Java frames, Java frames unnamed) over the run's workload processes."""
    from profiler.capture.read import read_capture

    totals = [0, 0, 0, 0]
    for capture_dir in (out / "hosts").iterdir():
        capture = read_capture(capture_dir)
        for process in capture.processes:
            stats = capture.sampler.get(process.pid)
            if process.role != "workload" or stats is None:
                continue
            unnamed = sum(stats.compiled_unnamed.values()) + sum(stats.interpreted_unnamed.values())
            for index, value in enumerate((stats.samples, stats.java_unwalkable, stats.java_frames, unnamed)):
                totals[index] += value
    return totals[0], totals[1], totals[2], totals[3]


def test_spark_executors_without_frame_pointers_give_the_shares_of_a_run_with_them(
    spark_str_demo: DemoRun, tmp_path: Path
) -> None:
    # GIVEN the YSB Structured Streaming query on a standalone cluster, run twice: its JVMs started as
    # production clusters run (no -XX:+PreserveFramePointer), then with the flag (the demo's default: the
    # session's run); both SHARED_WINDOW (the same warm-up, window and rate): the comparison's n is the
    # smaller run's, so a longer window without the flag bought nothing, and samples > 500 needs 34 a second
    # over the 15 s (two busy 1-core executors give up to 598 at 299 Hz)
    shares, counted = {}, {}
    for flag in ("--no-frame-pointers", "--frame-pointers"):
        if flag == "--frame-pointers":
            spark_str_demo.check_succeeded()
            out = spark_str_demo.out
        else:
            out = tmp_path / flag.strip("-")
            result = run_demo(out, *SHARED_WINDOW, "--rate", str(SHARED_RATE), flag)
            assert result.returncode == 0, f"demo {flag} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        shares[flag] = _whole_run_shares(out / "summary.csv")
        samples, unwalkable, java_frames, unnamed = _executor_stats(out)
        counted[flag] = samples * sum(_java_tasks(shares[flag]).values())  # the samples the comparison rests on
        if flag == "--no-frame-pointers":
            # THEN without the flag, nearly every executor sample is walked and its Java frames named
            assert samples > 500 and unwalkable <= 0.02 * samples, (samples, unwalkable)
            assert java_frames > 0 and unnamed <= 0.01 * java_frames, (java_frames, unnamed)
    # AND every task's share of the query's own work is within 3 percentage points of the run with frame
    # pointers (the JIT compiler's and GC's native threads are walked alike either way, and their share
    # depends on how far the JIT got in each run's warm-up, not on the walk)
    # (or within 4 standard errors of two independent samplings, when a short window has too few samples for
    # 3 pp to exceed the sampling error itself; n is the smaller run's, so the bound is at least 4 standard
    # errors of the difference however the two windows' lengths differ: p(1-p)(1/n1 + 1/n2) <= p(1-p) 2/n)
    without, with_flag = (_java_shares(shares[flag]) for flag in ("--no-frame-pointers", "--frame-pointers"))
    n = min(counted.values())
    for task in sorted(set(without) | set(with_flag)):
        p = (without.get(task, 0.0) + with_flag.get(task, 0.0)) / 2
        allowed = max(0.03, 4 * math.sqrt(p * (1 - p) * 2 / n))
        assert abs(without.get(task, 0.0) - with_flag.get(task, 0.0)) <= allowed, (task, n, without, with_flag)


def _java_tasks(shares: dict[str, float]) -> dict[str, float]:
    return {task: share for task, share in shares.items() if task not in ("*", "JIT compiler", "GC")}


def _java_shares(shares: dict[str, float]) -> dict[str, float]:
    kept = _java_tasks(shares)
    total = sum(kept.values()) or 1.0
    return {task: share / total for task, share in kept.items()}
