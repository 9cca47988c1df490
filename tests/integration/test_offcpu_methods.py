"""Off-CPU time by the Java methods that waited (issue 50): a JVM without frame pointers, no perf map and
nothing attached, whose worker threads (one name for all) each sleep, wait for a held monitor, read a
loopback socket and park in turn, each inside its own method (tests/workloads/WaitSplit.java). The blocked
stacks are walked at the switch-out by the sampler's walker (offcpu_trace.c compiled into stack_walk.c's
program), so the application profile's four methods split the blocked time as the JVM measured it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.capture.read import read_meta, read_pid_offcpu
from tests.fixtures.jvm import java_home, javac, ready_jvm
from tests.fixtures.window import profile_window
from tests.integration.test_profiler_run import result_rows

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "workloads" / "WaitSplit.java"
MAIN = "com.example.WaitSplit"
# The methods that wait, and the JVM's measurement of each (its report's keys).
METHODS = {"Sleeping": "sleeping_s", "Monitor": "monitor_s", "Socket": "socket_s", "Parked": "parked_s"}
PROFILE = "Sleeping: waitSleeping\nMonitor: waitMonitor\nSocket: waitSocket\nParked: waitParked\n"
KNOWN_SPES = f"# test-only\ntestspe workload waitsplit {MAIN}\n"
WINDOW_S = 9


class WaitingJvm:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def ask(self, command: str) -> str:
        """The answer to ``command``: the next line that is one (RESET, or the report's JSON). The profiler's
        attempt to seed thread names sends SIGQUIT, which a JVM that refuses attach answers with a thread
        dump on its stdout: those lines are skipped."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        while line := self.process.stdout.readline():
            if line.strip() == "RESET" or line.startswith('{"sleeping_s"'):
                return line.strip()
        return ""


@pytest.fixture
def waiting_jvm(tmp_path: Path) -> Iterator[WaitingJvm]:
    home = java_home()
    classes = tmp_path / "classes"
    javac(classes, SOURCE, java=home)
    # no -XX:+PreserveFramePointer (JIT code without frame pointers), and no attach possible: no perf map, no
    # agent, no jcmd (the thread names' seeding asks Thread.print through the attach socket; it gets the kernel's)
    argv = [
        str(home / "bin" / "java"), "-XX:+DisableAttachMechanism", "-Xmx64m", "-XX:+UseSerialGC",
        "-cp", str(classes), MAIN,
    ]  # fmt: skip
    with ready_jvm(argv) as process:
        yield WaitingJvm(process)


def test_blocked_time_splits_by_the_methods_that_waited(tmp_path: Path, waiting_jvm: WaitingJvm) -> None:
    # GIVEN the JVM's two workers waiting four ways in four methods, and a profile naming only the methods
    (tmp_path / "profile.txt").write_text(PROFILE)
    (tmp_path / "spes.txt").write_text(KNOWN_SPES)
    out, status = tmp_path / "cap", tmp_path / "status.json"
    argv = [
        sys.executable, "-m", "profiler", "run", "--duration", str(WINDOW_S), "--out", str(out), "--host", "h",
        "--profile", str(tmp_path / "profile.txt"), "--known-spes", str(tmp_path / "spes.txt"),
        "--status-file", str(status), "--off-cpu",
    ]  # fmt: skip
    pid = waiting_jvm.process.pid

    def reset() -> None:
        assert waiting_jvm.ask("reset") == "RESET"

    # WHEN the window ends (the truth is read as the profiler starts writing)
    truth, stderr = profile_window(argv, status, reset, lambda: json.loads(waiting_jvm.ask("report")))
    # THEN nothing was written into or beside the JVM: no perf map, no attach listener (refused by the JVM)
    assert not Path(f"/tmp/perf-{pid}.map").exists()
    assert not Path(f"/tmp/.java_pid{pid}").exists()
    assert read_meta(out).off_cpu_min_block_ms == 1.0
    rows = {r["task"]: r for r in result_rows(out, "h") if r["pid"] == str(pid)}
    entries = read_pid_offcpu(out, pid)
    assert entries is not None

    # AND each method's share of the four methods' blocked time is the JVM's share within 5 points.
    # Compared without the preempted time (the JVM times the waits, not the scheduler's delays between)
    def waited(task: str) -> float:
        row = rows.get(task)
        return float(row["offcpu_seconds"]) - float(row["offcpu_preempted_seconds"]) if row else 0.0

    blocked = {task: waited(task) for task in METHODS}
    measured = {task: float(truth[key]) for task, key in METHODS.items()}
    total_blocked, total_measured = sum(blocked.values()), sum(measured.values())
    for task in METHODS:  # shown with pytest -s: the figures docs/offcpu.md quotes
        print(f"{task}: blocked {blocked[task]:.2f} s ({blocked[task] / max(total_blocked, 1e-9):.1%}), "
              f"JVM measured {measured[task]:.2f} s ({measured[task] / total_measured:.1%})")
    unmatched = sum(e.blocked_ns for e in entries if e.stack.startswith("waitsplit-worke") and not any(
        f"Worker::{m}" in e.stack for m in ("waitSleeping", "waitMonitor", "waitSocket", "waitParked")
    )) / 1e9
    print(f"workers' blocked time under none of the methods: {unmatched:.2f} s")
    # most of it reaches a method: the stacks before the JVM's unwind tables are ready (prepared beside
    # sampling, a second or two into the window) may stop in glibc and stay unmatched
    assert total_blocked > 0.6 * total_measured, (blocked, measured, [e.stack for e in entries[:5]])
    for task in METHODS:
        share, expected = blocked[task] / total_blocked, measured[task] / total_measured
        assert abs(share - expected) < 0.05, (task, share, expected, blocked, measured)
    # AND the stacks hold the Java frames above the JDK's wait frames, walked without frame pointers (the
    # threads' root is the kernel's 15-byte comm: the JVM refused the attach that seeds full names)
    worker = [e for e in entries if e.stack.startswith("waitsplit-worke")]
    assert any("Worker::run" in e.stack and "Worker::waitParked" in e.stack for e in worker), worker[:5]
