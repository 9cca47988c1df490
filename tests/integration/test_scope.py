"""The scope analyzer on real processes: exec tracepoint (bcc) and polling fallback."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from coordinator.workloads.sparkcluster import LocalSparkCluster
from profiler.capture.format import ProcessInfo
from profiler.scope.analyzer import SWEEP_SECONDS, LiveProcSource, ScopeAnalyzer
from profiler.scope.spes import default_known_spes_path, load_known_spes, parse_known_spes
from tests.fixtures.jvm import MAIN_CLASS
from tests.fixtures.spark import submit_busy_job

TARGET = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"


@pytest.fixture
def probe_script(tmp_path: Path) -> Path:
    # a unique script name, so nothing else on this shared machine matches the test-only entry
    script = tmp_path / f"spe_probe_{uuid.uuid4().hex[:8]}.py"
    script.write_text(TARGET)
    return script


def _kinds(script: Path) -> tuple:  # type: ignore[type-arg]
    return parse_known_spes(f"testengine workload probe {script.name}\n", "test-known-spes")


def _start(script: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _stop(child: subprocess.Popen[str]) -> None:
    if child.stdin is not None:
        child.stdin.close()
    child.wait(timeout=30)


def _poll_until(scope: ScopeAnalyzer, pid: int, timeout: float) -> tuple[ProcessInfo | None, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new, _ = scope.poll()
        for process in new:
            if process.pid == pid:
                return process, time.time()
        time.sleep(0.1)
    return None, time.time()


@pytest.mark.parametrize("exec_watch", [True, False], ids=["tracepoint", "polling"])
def test_process_started_after_start_is_found_within_a_second(probe_script: Path, exec_watch: bool) -> None:
    before = _start(probe_script)
    scope = ScopeAnalyzer(_kinds(probe_script), exec_watch=exec_watch)
    try:
        scope.start()
        assert scope.exec_watch_mode == ("tracepoint" if exec_watch else "polling"), scope.exec_watch_error
        initial = {p.pid: p for p in scope.processes()}
        assert list(initial) == [before.pid] and initial[before.pid].source == "scan"
        assert (initial[before.pid].engine, initial[before.pid].role) == ("testengine", "workload")

        # WHEN a matching process starts while the analyzer runs (polled every 0.1 s)
        spawned_at = time.time()
        child = subprocess.Popen(
            [sys.executable, str(probe_script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            found, found_at = _poll_until(scope, child.pid, timeout=5.0)
            assert found is not None, "the new process was not found within 5 s"
            assert found_at - spawned_at < 1.0, f"found after {found_at - spawned_at:.2f}s"
            assert found.source == ("exec" if exec_watch else "scan")
            assert found.jvm_version is None and found.preserve_frame_pointer is None
            assert probe_script.name in found.cmdline
        finally:
            _stop(child)
        # THEN its exit is reported, and the final record keeps it with its exit time
        deadline = time.monotonic() + 5
        exited: list[int] = []
        while child.pid not in exited and time.monotonic() < deadline:
            exited += scope.poll()[1]
            time.sleep(0.1)
        assert child.pid in exited
        final = {p.pid: p for p in scope.finish(time.time())}
        assert final[child.pid].exited and not final[before.pid].exited
        assert final[child.pid].first_seen <= final[child.pid].last_seen
    finally:
        scope.close()
        scope.close()
        _stop(before)


def test_jvm_facts_and_manual_pid(tmp_path: Path) -> None:
    # a real JVM with frame pointers, added by hand (no known_spes entry matches it)
    source = tmp_path / "Idle.java"
    source.write_text(
        "public class Idle { public static void main(String[] a) throws Exception {"
        ' System.out.println("ready"); System.out.flush(); System.in.read(); } }\n'
    )
    java = subprocess.Popen(
        ["java", "-XX:+PreserveFramePointer", "-Xmx64m", str(source)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert java.stdout is not None and java.stdout.readline().strip() == "ready"
        scope = ScopeAnalyzer(
            parse_known_spes("x workload y no.such.Main\n", "t"), manual_pids=[java.pid], exec_watch=False
        )
        scope.start()
        (process,) = scope.processes()
        assert (process.pid, process.engine, process.role, process.source) == (java.pid, "manual", "workload", "manual")
        assert process.jvm_version and process.jvm_version.startswith("17")
        assert process.preserve_frame_pointer is True
        scope.close()
    finally:
        _stop(java)  # type: ignore[arg-type]


def test_real_spark_cluster_roles_and_an_executor_started_while_watching(spark_cluster: LocalSparkCluster) -> None:
    ours = set(spark_cluster.all_pids())
    scope = ScopeAnalyzer(load_known_spes(default_known_spes_path()))
    app = None
    try:
        # GIVEN the analyzer runs on a host with a standalone Master and Worker (found by the scan)
        scope.start()
        assert scope.exec_watch_mode == "tracepoint", scope.exec_watch_error
        daemons = {p.pid: p for p in scope.processes() if p.pid in ours}
        master, worker = spark_cluster.daemon_pids()
        assert (daemons[master].role, daemons[master].kind) == ("managing", "master")
        assert (daemons[worker].role, daemons[worker].kind) == ("managing", "worker")

        # WHEN an app is submitted: its driver and then its executor start while we poll
        app = submit_busy_job(spark_cluster, seconds=120, wait=False)
        found: dict[int, tuple[ProcessInfo, float]] = {}
        first_listed: dict[int, float] = {}
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            for process in scope.poll()[0]:
                found[process.pid] = (process, time.monotonic())
            for pid in spark_cluster.executor_pids():
                first_listed.setdefault(pid, time.monotonic())
            if first_listed and all(pid in found for pid in first_listed) and app.pid in found:
                break
            assert app.poll() is None, f"the app exited: {app.stderr_path.read_text()[-2000:]}"
            time.sleep(0.2)

        # THEN the executor is workload (found by the exec watcher within a second of appearing),
        # the driver (SparkSubmit against spark://) managing
        (executor,) = first_listed
        process, found_at = found[executor]
        assert (process.engine, process.role, process.kind, process.source) == ("spark", "workload", "executor", "exec")
        assert found_at - first_listed[executor] < 1.0
        assert process.jvm_version and process.jvm_version.startswith("17")
        assert process.preserve_frame_pointer is True
        driver = found[app.pid][0]
        assert (driver.engine, driver.role, driver.kind) == ("spark", "managing", "driver")
        assert "SparkSubmit" in driver.cmdline

        # WHEN the app stops, THEN its processes are reported exited and keep their records
        spark_cluster.stop_app(app)
        exited: set[int] = set()
        deadline = time.monotonic() + 30
        while not {executor, app.pid} <= exited and time.monotonic() < deadline:
            exited.update(scope.poll()[1])
            time.sleep(0.2)
        assert {executor, app.pid} <= exited
        final = {p.pid: p for p in scope.finish(time.time())}
        assert final[executor].exited and final[app.pid].exited and not final[worker].exited
    finally:
        scope.close()
        if app is not None and app.poll() is None:
            spark_cluster.stop_app(app)


def test_a_command_line_is_read_only_when_the_executable_could_be_an_engine(probe_script: Path) -> None:
    # GIVEN the probe (python) and a `sleep` whose argv[0] is the probe's name: by its command line alone
    # it would be filed as a probe, but its executable runs no Python module or JVM class
    impostor = subprocess.Popen([probe_script.name, "60"], executable="sleep")
    probe = _start(probe_script)
    scope = ScopeAnalyzer(_kinds(probe_script), exec_watch=False)
    try:
        scope.start()
        # THEN only the probe is in the scope, and the sleep's command line was never read
        assert [p.pid for p in scope.processes()] == [probe.pid]
        assert scope.cmdlines_skipped >= 1
        # AND a known_spes.txt with a pattern for a program's own name reads every command line (as before)
        everything = ScopeAnalyzer(parse_known_spes(f"x workload y {probe_script.stem}\n", "t"), exec_watch=False)
        everything.start()
        assert everything.cmdlines_skipped == 0
        everything.close()
    finally:
        scope.close()
        impostor.kill()
        impostor.wait(10)
        _stop(probe)


class CountingProcSource(LiveProcSource):
    """This host's /proc, counting the listings and naming every process whose command line was read."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0
        self.cmdlines_read: set[int] = set()

    def pids(self) -> list[int]:
        self.listings += 1
        return super().pids()

    def cmdline(self, pid: int) -> tuple[str, ...] | None:
        self.cmdlines_read.add(pid)
        return super().cmdline(pid)


def test_process_records_find_a_jvm_started_mid_run_and_never_read_an_unrelated_command_line(
    start_cpu_split_jvm,  # type: ignore[no-untyped-def]
) -> None:
    # GIVEN the scope in tracepoint mode with a line for the test JVM's main class
    proc = CountingProcSource()
    scope = ScopeAnalyzer(parse_known_spes(f"testengine workload probe {MAIN_CLASS}\n", "t"), proc=proc)
    shell = None
    try:
        scope.start()
        assert scope.exec_watch_mode == "tracepoint", scope.exec_watch_error
        assert scope.processes() == []
        listings, began = proc.listings, time.monotonic()
        # WHEN a shell with a 256 KiB command line naming the main class starts and forks a sleep, and a JVM
        # of that class starts, while the scope polls every 0.2 s
        long_args = [MAIN_CLASS, *("x" * (64 << 10) for _ in range(4))]  # one argument is at most 128 KiB
        shell = subprocess.Popen(["sh", "-c", "sleep 60; true", *long_args])
        polls = 0
        for _ in range(5):
            scope.poll()
            polls += 1
            time.sleep(0.2)
        jvm = start_cpu_split_jvm(threads=1, warmup_ms=100)
        found, _ = _poll_until(scope, jvm.pid, timeout=5.0)
        polls += 1
        # THEN the JVM is found by its exec record
        assert found is not None and (found.kind, found.source) == ("probe", "exec")
        # AND neither the shell's command line nor its sleep's was read (their executables run no engine)
        sleeps = [int(pid) for pid in Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()]
        assert sleeps and not ({shell.pid, *sleeps} & proc.cmdlines_read), proc.cmdlines_read
        assert scope.cmdlines_skipped >= 2
        # AND /proc was not listed every poll (the fork records stand in for it; a sweep every 10 s)
        sweeps = int((time.monotonic() - began) // SWEEP_SECONDS)
        assert polls >= 5 and proc.listings - listings <= sweeps, (proc.listings - listings, sweeps)
    finally:
        scope.close()
        if shell is not None:
            shell.kill()
            shell.wait(10)
