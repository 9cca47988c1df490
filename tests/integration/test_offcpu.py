"""`profiler run --off-cpu` end to end on a real JVM whose threads block in known ways for measured
times (tests/workloads/BlockedSplit.java): each thread's blocked seconds and their split, the cause the
kernel's and the JVM's view give each (sleep, monitor, wait, park, net), and the on-CPU shares of the
same run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import read_meta, read_pid_offcpu, read_pid_offcpu_timeline
from tests.fixtures.jvm import java_home, javac, ready_jvm, temurin_25
from tests.fixtures.window import profile_window, wait_for_state
from tests.integration.test_profiler_run import result_rows

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "workloads" / "BlockedSplit.java"
MAIN = "com.example.BlockedSplit"
# On-CPU work by method, blocked time by thread (the thread name is the root frame: it decides last).
PROFILE = (
    "Hold: burnHolding\nBetween: burnBetween\n"
    "Sleeper: offcpu-sleeper\nLocker: offcpu-locker\nPiper: offcpu-piper\n"
    "Parker: offcpu-parker\nWaiter: offcpu-waiter\nDozer: offcpu-dozer\nIdler: offcpu-idler\n"
    "SparkTask: Executor task launch worker\n"
)
# The two threads named as Spark task threads: stage, the cause of their waits, their measurement.
STAGES = (("3.0", "sleep", "stage3_s"), ("4.0", "park", "stage4_s"))
KNOWN_SPES = f"# test-only\ntestspe workload blocked {MAIN}\n"
THREADS = {"Sleeper": "sleep_s", "Locker": "lock_s", "Piper": "pipe_s", "Parker": "park_s", "Waiter": "wait_s"}
# The cause each thread's wait must be given: by the kernel (the pipe) or by the JVM (its futex waits).
CAUSE_OF = {"Sleeper": "sleep", "Locker": "monitor", "Piper": "net", "Parker": "park", "Waiter": "wait"}


class BlockedJvm:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()


# The JVM's view of a wait is read through its vmStructs, whose layout moved between releases (JDK 25's
# Thread::_osthread, Thread.sleepNanos0, Object.wait0): the default JDK and the newest one installed.
@pytest.fixture(params=["default-jdk", "temurin-25"])
def blocked_jvm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlockedJvm]:
    home = java_home() if request.param == "default-jdk" else temurin_25()
    classes = tmp_path / "classes"
    javac(classes, SOURCE, java=home)
    argv = [
        str(home / "bin" / "java"), "-XX:+PreserveFramePointer", "-XX:CompileCommand=quiet",
        f"-XX:CompileCommand=dontinline,{MAIN}::*", "-Xmx64m", "-XX:+UseSerialGC", "-cp", str(classes), MAIN,
    ]  # fmt: skip
    with ready_jvm(argv) as process:
        yield BlockedJvm(process)


def off_cpu_argv(tmp_path: Path, out: Path, status: Path, duration: int, checkpoint: int) -> list[str]:
    """`profiler run --off-cpu` of the BlockedSplit JVM's threads, 5 s intervals, its status in ``status``."""
    (tmp_path / "profile.txt").write_text(PROFILE)
    (tmp_path / "spes.txt").write_text(KNOWN_SPES)
    argv = [
        sys.executable, "-m", "profiler", "run", "--duration", str(duration), "--out", str(out), "--host", "h",
        "--profile", str(tmp_path / "profile.txt"), "--known-spes", str(tmp_path / "spes.txt"),
        "--status-file", str(status), "--off-cpu", "--checkpoint", str(checkpoint), "--interval", "5",
    ]  # fmt: skip
    return argv


def test_off_cpu_time_per_thread_and_cause_matches_the_jvms_own_measurement(tmp_path: Path, blocked_jvm) -> None:
    # GIVEN a JVM whose threads sleep, wait for a monitor another thread holds while it spins, read a
    # pipe fed slowly, park and Object.wait with timeouts, each timing its blocking calls
    out, status = tmp_path / "cap", tmp_path / "status.json"
    started: list[float] = []

    def reset() -> None:
        assert blocked_jvm.ask("reset") == "RESET"
        started.append(time.monotonic())

    def read() -> tuple[dict, float, dict]:
        truth = json.loads(blocked_jvm.ask("report"))
        return truth, time.monotonic() - started[0], _threads_by_comm(blocked_jvm.process.pid)

    # WHEN the window ends (the truth is read as the profiler starts writing)
    argv = off_cpu_argv(tmp_path, out, status, duration=15, checkpoint=0)
    (truth, truth_window, started_threads), stderr = profile_window(argv, status, reset, read)
    pid = blocked_jvm.process.pid
    rows = {r["task"]: r for r in result_rows(out, "h") if r["pid"] == str(pid)}
    assert read_meta(out).off_cpu_min_block_ms == 1.0
    # the defaults: one busy switch-out in 10 followed; these threads block < 100 times a second: all followed
    assert read_meta(out).off_cpu_sample_every == 10
    # THEN each thread's blocked seconds is the JVM's measurement (the two windows differ by the status
    # file's polling: a few tenths of a second of ~15 s), and the split among the five within 5 points.
    # Compared without the time the thread was preempted (switched out while runnable): the JVM times
    # only the blocking calls, and the locker also spins between them, which a loaded host preempts for
    # seconds (CPU contention, not its wait)
    def waited(task: str) -> float:
        return float(rows[task]["offcpu_seconds"]) - float(rows[task]["offcpu_preempted_seconds"])

    blocked = {task: waited(task) for task in THREADS}
    measured = {task: truth[key] for task, key in THREADS.items()}
    for task in THREADS:  # shown with pytest -s: the figures docs/offcpu.md quotes
        row = rows[task]
        causes = {c: round(float(row[f"offcpu_{c}_seconds"]), 2) for c in ("preempted", CAUSE_OF[task])}
        print(f"{task}: waited {blocked[task]:.2f} s, JVM measured {measured[task]:.2f} s, {causes}")
    for task in THREADS:
        bound = 0.08 * measured[task] + 0.3
        assert abs(blocked[task] - measured[task]) < bound, (task, blocked, measured, truth_window, rows[task])
    total_blocked, total_measured = sum(blocked.values()), sum(measured.values())
    for task in THREADS:
        share, expected = blocked[task] / total_blocked, measured[task] / total_measured
        assert abs(share - expected) < 0.05, (task, share, expected)
    # AND the cause: the pipe read is a wait for data (net, the kernel's word); the sleep, the monitor, the
    # park and the Object.wait are futex waits the JVM names (its thread state and last Java frame); each
    # with at least 95 % of its thread's blocked time beside what the scheduler took (preempted)
    def cause_share(task: str, cause: str) -> float:
        return float(rows[task][f"offcpu_{cause}_seconds"]) / waited(task)

    for task, cause in CAUSE_OF.items():
        assert cause_share(task, cause) > 0.95, (task, cause, rows[task])
    # AND each cause's share of the five threads' blocked time is the measured one within 5 points
    by_cause = {cause: sum(float(rows[t][f"offcpu_{cause}_seconds"]) for t in THREADS) for cause in CAUSE_OF.values()}
    for task, cause in CAUSE_OF.items():
        share, expected = by_cause[cause] / total_blocked, measured[task] / total_measured
        assert abs(share - expected) < 0.05, (cause, share, expected, by_cause, measured)
    # AND the on-CPU shares of the same run match the threads' CPU time within sampling error
    samples = {task: int(rows[task]["samples"]) for task in ("Hold", "Between")}
    n = sum(samples.values())
    assert n > 100, rows
    expected_hold = truth["holding_s"] / (truth["holding_s"] + truth["between_s"])
    bound = max(0.03, 2.6 * (expected_hold * (1 - expected_hold) / n) ** 0.5)
    assert abs(samples["Hold"] / n - expected_hold) < bound, (samples, truth)
    # AND the per-PID file holds the stacks behind the rows
    entries = read_pid_offcpu(out, pid)
    assert entries is not None and any("pipe_read_[k]" in e.stack and e.cause == "net" for e in entries)
    # with the last Java frame the JVM recorded below the walked frames (JDK 17: Thread.sleep; 21+: sleep0...)
    assert any(e.cause == "sleep" and ";java.lang.Thread::sleep" in e.stack for e in entries), entries[:5]
    assert any(e.cause == "park" and "Unsafe::park" in e.stack for e in entries), entries[:5]
    # AND a thread with no context switch in the window (one Thread.sleep of an hour, one Object.wait
    # without timeout) is blocked all of it: found from /proc (its schedstat did not change), its cause
    # from the JVM's view read at the end, its stack marked as not walked
    window = read_meta(out).duration
    for task, cause in (("Dozer", "sleep"), ("Idler", "wait")):
        seconds = float(rows[task]["offcpu_seconds"])
        print(f"{task}: blocked {seconds:.2f} s of a {window:.2f} s window, {rows[task]}")
        assert abs(seconds - window) < 0.03 * window, (task, seconds, window, rows[task])
        assert float(rows[task][f"offcpu_{cause}_seconds"]) == pytest.approx(seconds), (task, rows[task])
    idle = [e for e in entries if e.stack.startswith(("offcpu-dozer;", "offcpu-idler;"))]
    assert len(idle) == 2 and all(";[blocked all window];" in e.stack and e.switches == 1 for e in idle), idle
    assert any(";java.lang.Object::wait" in e.stack for e in idle), idle
    _check_analysis_and_exports(tmp_path, out, pid, rows, entries)
    _check_wall_seconds_and_stages(tmp_path, out, rows, entries, truth)
    _check_thread_counts(tmp_path, out, pid, entries, started_threads)


def _threads_by_comm(pid: int) -> dict[str, set[int]]:
    """The kernel's view of a process's threads: tids per comm (the first 15 bytes of the name)."""
    threads: dict[str, set[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        threads.setdefault((task / "comm").read_text().rstrip("\n"), set()).add(int(task.name))
    return threads


def _check_thread_counts(
    tmp_path: Path, out: Path, pid: int, entries: list[OffCpuEntry], started: dict[str, set[int]]
) -> None:
    """Distinct threads per task in summary.csv against the threads the JVM started (by their kernel names)."""
    # AND each blocked stack keeps the ids of its threads: the threads the JVM started under that name
    for name in ("offcpu-sleeper", "offcpu-locker", "offcpu-piper", "offcpu-dozer", "offcpu-idler"):
        tids = set().union(*(e.threads or () for e in entries if e.stack.startswith(f"{name};")))
        assert tids == started[name], (name, tids, started)
    # AND summary.csv counts each task's distinct blocked threads: one per thread task, the two Spark task
    # threads (one comm, two threads), each once whatever number of stacks it blocked under
    with open(tmp_path / "analysis" / "summary.csv") as handle:
        summary = {r["task"]: r for r in csv.DictReader(handle) if r["pid"] == str(pid)}
    expected = {task: len(started[f"offcpu-{task.lower()}"]) for task in (*THREADS, "Dozer", "Idler")}
    expected["SparkTask"] = len(started["Executor task l"])
    assert expected["SparkTask"] == 2 and all(expected[task] == 1 for task in THREADS), started
    for task, count in expected.items():
        row = summary[task]
        print(f"{task}: {row['offcpu_threads']} threads blocked, {row['wall_seconds_per_thread']} wall s per thread")
        assert int(row["offcpu_threads"]) == count, (task, row, started)
        wall = float(row["wall_seconds"]) / count
        assert float(row["wall_seconds_per_thread"]) == pytest.approx(wall, rel=1e-4, abs=2e-6), (task, row)
    blocked_any = set().union(*(e.threads or () for e in entries))
    assert int(summary["*"]["offcpu_threads"]) == len(blocked_any)
    assert blocked_any <= set().union(*started.values()), (blocked_any, started)
    # AND `--from 5 --to 10` counts the threads blocked in that sub-window (offcpu_timeline_threads.json)
    with open(tmp_path / "cut" / "summary.csv") as handle:
        cut = {r["task"]: r for r in csv.DictReader(handle) if r["pid"] == str(pid)}
    for task, count in expected.items():
        assert int(cut[task]["offcpu_threads"]) == count, (task, cut[task])
    with open(tmp_path / "stages" / "summary.csv") as handle:
        staged = [r for r in csv.DictReader(handle) if r.get("stage") and r["offcpu_seconds"]]
    assert staged and all(r["offcpu_threads"] == "" for r in staged), staged[:2]  # per stage: not counted
    # AND the report's off-CPU table shows the count (from the summary.csv beside the capture)
    from coordinator.analysis.engines import analyze
    from coordinator.report.render import render_report

    analyze([out], engine="in-process")
    html = render_report(out, tmp_path / "report").read_text(encoding="utf-8")
    start = html.index('<section id="offcpu"')
    section = html[start : html.index("</section>", start)]
    assert ">threads</th>" in section, section[:2000]


def _check_analysis_and_exports(
    tmp_path: Path, out: Path, pid: int, rows: dict[str, dict[str, str]], entries: list[OffCpuEntry]
) -> None:
    """The capture of the test above through `coordinator analyze` (whole window and cut) and the pprof export."""
    # AND `coordinator analyze` gives summary.csv the same off-CPU seconds per task
    from coordinator.analysis.engines import analyze
    from coordinator.analysis.timeline import SubWindow

    analyze([out], out_dir=tmp_path / "analysis", engine="in-process")
    with open(tmp_path / "analysis" / "summary.csv") as handle:
        summary = {r["task"]: r for r in csv.DictReader(handle) if r["pid"] == str(pid)}
    for task in (*THREADS, "Dozer", "Idler", "*"):
        assert float(summary[task]["offcpu_seconds"]) == pytest.approx(float(rows[task]["offcpu_seconds"]), rel=1e-5)
    # AND the pprof export of the capture carries the blocked time: off_cpu nanoseconds per task are the
    # capture's offcpu_seconds (the same matcher and rows), the dozer's with its cause label
    from coordinator.export.files import render
    from coordinator.export.pprof import decode
    from coordinator.export.stacks import load_export_set
    from tests.fixtures.exports import pprof_totals

    profile = decode(render(load_export_set(out), "pprof"))  # type: ignore[arg-type]
    strings = profile.string_table
    assert (strings[profile.sample_type[-1].type], strings[profile.sample_type[-1].unit]) == ("off_cpu", "nanoseconds")
    exported = pprof_totals(profile, len(profile.sample_type) - 1)
    for task in (*THREADS, "Dozer", "Idler"):
        assert exported[("h", pid, task)] / 1e9 == pytest.approx(float(rows[task]["offcpu_seconds"]), rel=1e-5)
    # AND the blocked time per 5 s interval (offcpu_timeline.folded) adds up to the window's, stack by stack
    by_interval = read_pid_offcpu_timeline(out, pid)
    assert by_interval is not None and set(by_interval) == {0, 1, 2}, by_interval and sorted(by_interval)
    summed: dict[tuple[str, str], int] = {}
    for interval_entries in by_interval.values():
        for e in interval_entries:
            summed[e.cause, e.stack] = summed.get((e.cause, e.stack), 0) + e.blocked_ns
    assert summed == {(e.cause, e.stack): e.blocked_ns for e in entries}
    # AND `analyze --from 5 --to 10` cuts it: the sleeper, asleep nearly all the time, was asleep ~5 s of it
    analyze([out], out_dir=tmp_path / "cut", engine="in-process", window=SubWindow(5.0, 10.0))
    with open(tmp_path / "cut" / "summary.csv") as handle:
        cut = {r["task"]: r for r in csv.DictReader(handle) if r["pid"] == str(pid)}
    sleeper_whole = float(rows["Sleeper"]["offcpu_sleep_seconds"])
    assert float(cut["Sleeper"]["offcpu_sleep_seconds"]) == pytest.approx(sleeper_whole / 3, rel=0.15), cut["Sleeper"]
    assert float(cut["*"]["offcpu_seconds"]) < float(rows["*"]["offcpu_seconds"]) * 0.5
    # and the threads blocked all window are split at the interval ends like the walked blocks
    dozer_whole = float(rows["Dozer"]["offcpu_sleep_seconds"])
    assert float(cut["Dozer"]["offcpu_sleep_seconds"]) == pytest.approx(dozer_whole / 3, rel=0.15), cut["Dozer"]


def _check_wall_seconds_and_stages(
    tmp_path: Path, out: Path, rows: dict[str, dict[str, str]], entries: list[OffCpuEntry], truth: dict[str, float]
) -> None:
    """Wall seconds per task row, and the blocked time of the Spark-named threads per stage."""
    from coordinator.analysis.engines import analyze
    from coordinator.analysis.timeline import SubWindow

    # AND every task row's wall seconds are its on-CPU plus its off-CPU seconds (async-profiler's wall view)
    for task, row in rows.items():
        if row["cpu_seconds"]:
            wall = float(row["cpu_seconds"]) + float(row["offcpu_seconds"])
            assert float(row["wall_seconds"]) == pytest.approx(wall, abs=2e-3), (task, row)  # CSV: 6 digits
    # AND the blocked stacks of the Spark-named threads are rooted at their kind, as their samples are
    assert any(e.stack.startswith("Executor task launch worker;") for e in entries), entries[:5]
    assert not any(e.stack.startswith("Executor task l;") for e in entries), entries[:5]
    # AND `analyze --by stage` gives each task thread's blocked time to its stage (the full thread name
    # kept as the block's context), the JVM's measurement within the bound above, with its cause
    def stage_rows(directory: Path) -> dict[tuple[str, str], dict[str, str]]:
        with open(directory / "summary.csv") as handle:
            return {(r["stage"], r["task"]): r for r in csv.DictReader(handle) if r.get("stage")}

    analyze([out], out_dir=tmp_path / "stages", engine="in-process", by="stage")
    staged = stage_rows(tmp_path / "stages")
    for stage, cause, key in STAGES:
        row = staged[(stage, "SparkTask")]
        waited_s = float(row["offcpu_seconds"]) - float(row["offcpu_preempted_seconds"])
        print(f"stage {stage}: waited {waited_s:.2f} s, JVM measured {truth[key]:.2f} s, {cause} "
              f"{float(row[f'offcpu_{cause}_seconds']):.2f} s")
        assert abs(waited_s - truth[key]) < 0.08 * truth[key] + 0.3, (stage, row, truth)
        assert float(row[f"offcpu_{cause}_seconds"]) > 0.95 * waited_s, (stage, row)
        assert float(staged[(stage, "*")]["offcpu_seconds"]) == pytest.approx(float(row["offcpu_seconds"]))
    # and with --from 5 --to 10 a third of it (the intervals of the sub-window)
    analyze([out], out_dir=tmp_path / "stages-cut", engine="in-process", by="stage", window=SubWindow(5.0, 10.0))
    staged_cut = stage_rows(tmp_path / "stages-cut")
    for stage, cause, _key in STAGES:
        whole = float(staged[(stage, "SparkTask")][f"offcpu_{cause}_seconds"])
        part = float(staged_cut[(stage, "SparkTask")][f"offcpu_{cause}_seconds"])
        print(f"stage {stage} with --from 5 --to 10: {cause} {part:.2f} s of {whole:.2f} s")
        assert part == pytest.approx(whole / 3, rel=0.15), (stage, part, whole)


def _offcpu_copy_time(out: Path) -> float:
    """The wall time of the last off-CPU checkpoint copy (0: none yet, or being replaced)."""
    from profiler.capture.checkpoint import checkpoint_dir
    from profiler.capture.offcpucheckpoint import read_offcpu_checkpoint

    try:
        taken = read_offcpu_checkpoint(checkpoint_dir(out))
    except (OSError, ValueError):
        return 0.0
    return taken.time if taken is not None else 0.0


@pytest.mark.parametrize("blocked_jvm", ["default-jdk"], indirect=True)
def test_killed_off_cpu_run_recovers_the_blocked_time_up_to_its_last_checkpoint(tmp_path: Path, blocked_jvm) -> None:
    # GIVEN a 120 s `--off-cpu` run with a checkpoint every 2 s on the JVM whose threads block and time it
    import signal

    from coordinator.analysis.engines import analyze
    from profiler.cli import main as profiler_main

    out, status = tmp_path / "cap", tmp_path / "status.json"
    argv = off_cpu_argv(tmp_path, out, status, duration=120, checkpoint=2)
    profiler = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_state(status, "sampling", profiler, timeout=600)
        assert blocked_jvm.ask("reset") == "RESET"
        reset_at = time.time()
        # WHEN the profiler is killed with SIGKILL right after a checkpoint at least 6 s after the reset,
        # the JVM's own timings read at once (their lag behind the checkpoint is measured and allowed for)
        deadline = time.monotonic() + 120
        while _offcpu_copy_time(out) < reset_at + 6:
            assert time.monotonic() < deadline and profiler.poll() is None, "no off-CPU checkpoint copy"
            time.sleep(0.05)
        truth = json.loads(blocked_jvm.ask("report"))
        lag = time.time() - _offcpu_copy_time(out)
        profiler.send_signal(signal.SIGKILL)
        profiler.wait(30)
    finally:
        if profiler.poll() is None:
            profiler.kill()
        profiler.communicate(timeout=30)
    assert not (out / capture.META_FILE).exists()
    # THEN `profiler recover` writes the off-CPU files, and `coordinator analyze` of the recovered run has
    # each thread's blocked seconds per cause as the JVM measured them up to the checkpoint: within 8 %
    # + 0.3 s as a whole run (test above), plus the time between the reset and the window's start, and
    # the lag of the JVM's reading behind the checkpoint (a thread blocks at most all of it)
    assert profiler_main(["recover", str(out), "--quiet"]) == 0
    meta = read_meta(out)
    assert meta.stopped_by == "recovered" and meta.off_cpu_min_block_ms == 1.0
    pid = blocked_jvm.process.pid
    entries = read_pid_offcpu(out, pid)
    assert entries is not None and any(e.cause == "park" and "Unsafe::park" in e.stack for e in entries), entries
    analyze([out], out_dir=tmp_path / "analysis", engine="in-process")
    with open(tmp_path / "analysis" / "summary.csv") as handle:
        summary = {r["task"]: r for r in csv.DictReader(handle) if r["pid"] == str(pid)}
    early = max(0.0, reset_at - meta.start_time)
    for task, key in THREADS.items():
        cause = CAUSE_OF[task]
        recovered, measured = float(summary[task][f"offcpu_{cause}_seconds"]), truth[key]
        print(f"recovered {task}: {cause} {recovered:.2f} s, JVM measured {measured:.2f} s, lag {lag:.2f} s")
        bound = 0.08 * measured + 0.3 + lag + early
        assert measured > 2.0 and abs(recovered - measured) < bound, (task, recovered, measured, lag, early)
