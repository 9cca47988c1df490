"""The scope analyzer over a fake process table and a fake exec watcher."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from profiler.errors import CapabilityError
from profiler.scope.analyzer import SWEEP_SECONDS, ProcSnapshot, ProcStat, ScopeAnalyzer
from profiler.scope.execwatch import ProcEvents
from profiler.scope.spes import parse_known_spes

KINDS = parse_known_spes(
    "spark workload executor org.apache.spark.executor.CoarseGrainedExecutorBackend\n"
    "spark workload local-driver org.apache.spark.deploy.SparkSubmit master=local|local[[]*\n"
    "spark managing driver org.apache.spark.deploy.SparkSubmit\n"
    "spark managing worker org.apache.spark.deploy.worker.Worker\n"
    "spark managing pyspark-driver parent-of:org.apache.spark.deploy.SparkSubmit arg=pyspark-shell\n"
    "spark workload python-worker pyspark.daemon\n"
    "kafka broker broker kafka.Kafka\n",
    "test",
)
EXECUTOR = ("java", "-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend", "--executor-id", "0")
WORKER = ("java", "-cp", "x", "org.apache.spark.deploy.worker.Worker", "spark://m:7077")


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def mono(self) -> float:
        return self.now - 900.0


@dataclass
class FakeProc:
    clock: FakeClock
    table: dict[int, tuple[int, tuple[str, ...], str, float]] = field(default_factory=dict)  # ppid, argv, user, start
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    jvms: dict[int, tuple[str | None, bool | None]] = field(default_factory=dict)
    reads: int = 0
    stats: int = 0
    exes: int = 0
    listings: int = 0
    kernel: set[int] = field(default_factory=set)  # kernel threads: listed, no command line

    def spawn(self, pid: int, cmdline: tuple[str, ...], ppid: int = 1, age: float = 10.0, user: str = "spark") -> None:
        self.table[pid] = (ppid, cmdline, user, self.clock.now - age)
        if cmdline[0] == "java":
            self.jvms[pid] = ("17.0.15", "-XX:+PreserveFramePointer" in cmdline)

    def exec(self, pid: int, cmdline: tuple[str, ...]) -> None:
        ppid, _, user, start = self.table[pid]
        self.table[pid] = (ppid, cmdline, user, start)

    def kill(self, pid: int) -> None:
        del self.table[pid]

    def pids(self) -> list[int]:
        self.listings += 1
        return [*self.table, *self.kernel]

    def cmdline(self, pid: int) -> tuple[str, ...] | None:
        self.reads += 1
        return self.table[pid][1] if pid in self.table else None

    def executable(self, pid: int) -> str | None:
        self.exes += 1
        if pid not in self.table:
            return None
        return self.table[pid][1][0].rsplit("/", 1)[-1]

    def stat(self, pid: int) -> ProcStat | None:
        self.stats += 1
        if pid not in self.table:
            return None
        ppid, _, _, start = self.table[pid]
        return ProcStat(ppid, int(start * 100), self.clock.now - start)

    def snapshot(self, pid: int) -> ProcSnapshot | None:
        if pid not in self.table:
            return None
        ppid, cmdline, user, start = self.table[pid]
        return ProcSnapshot(pid, ppid, cmdline, user, int(start * 100))

    def environ(self, pid: int) -> dict[str, str]:
        return self.env.get(pid, {})

    def read_text(self, pid: int, path: str) -> str | None:
        return self.files.get(path)

    def jvm(self, pid: int) -> tuple[str | None, bool | None]:
        return self.jvms.get(pid, (None, None))

    def alive(self, pid: int, identity: int) -> bool:
        stat = self.stat(pid)
        return stat is not None and stat.identity == identity

    def close(self) -> None:
        pass


@dataclass
class FakeWatcher:
    """``pending``: exec records; ``forks`` (child, parent) and ``exits`` only count with ``forks_known``
    (False: as an agent in a PID namespace, /proc listed every poll)."""

    pending: list[int] = field(default_factory=list)
    fail: bool = False
    closed: int = 0
    dropped: bool = False
    forks: list[tuple[int, int]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    forks_known: bool = False

    def start(self) -> None:
        if self.fail:
            raise CapabilityError("no tracepoint")

    def drain(self) -> ProcEvents:
        events = ProcEvents(self.pending, self.forks, self.exits, self.dropped, self.forks_known)
        self.pending, self.forks, self.exits, self.dropped = [], [], [], False
        return events

    def close(self) -> None:
        self.closed += 1

    @property
    def prog_ids(self) -> list[int]:
        return []


def make(proc: FakeProc, clock: FakeClock, watcher: FakeWatcher | None = None, **kw: object) -> ScopeAnalyzer:
    w = watcher or FakeWatcher()
    return ScopeAnalyzer(KINDS, proc=proc, watcher_factory=lambda: w, clock=clock, monotonic=clock.mono, **kw)  # type: ignore[arg-type]


@pytest.fixture
def env() -> tuple[FakeClock, FakeProc]:
    clock = FakeClock()
    proc = FakeProc(clock)
    proc.spawn(1, ("/sbin/init",))
    proc.spawn(100, WORKER)
    proc.spawn(101, ("bash", "-l"))
    proc.spawn(102, EXECUTOR + ("-XX:+PreserveFramePointer",), ppid=100)
    return clock, proc


def test_initial_scan_then_new_and_exited(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    watcher = FakeWatcher()
    scope = make(proc, clock, watcher)
    scope.start()
    assert scope.exec_watch_mode == "tracepoint"
    initial = {p.pid: p for p in scope.processes()}
    assert {pid: (p.role, p.kind) for pid, p in initial.items()} == {
        100: ("managing", "worker"),
        102: ("workload", "executor"),
    }
    assert initial[102].jvm_version == "17.0.15" and initial[102].preserve_frame_pointer is True
    assert initial[100].preserve_frame_pointer is False and initial[102].source == "scan"
    assert "CoarseGrainedExecutorBackend" in initial[102].cmdline and initial[102].user == "spark"
    assert scope.poll() == ([], [])  # the initial processes are not reported again

    clock.now += 0.5
    proc.kill(102)
    proc.spawn(103, EXECUTOR, ppid=100, age=0.1)
    watcher.pending = [103]
    new, exited = scope.poll()
    assert [(p.pid, p.source) for p in new] == [(103, "exec")] and exited == [102]
    final = {p.pid: p for p in scope.finish(clock.now + 2)}
    assert final[102].exited and final[102].last_seen == pytest.approx(1000.5)
    assert not final[103].exited and final[103].last_seen == pytest.approx(1002.5)
    assert final[103].first_seen == pytest.approx(1000.5)


def test_exec_event_reinspects_a_pid_that_became_an_executor(env: tuple[FakeClock, FakeProc]) -> None:
    # spark-class is bash until it execs the JVM under the same pid
    clock, proc = env
    watcher = FakeWatcher()
    scope = make(proc, clock, watcher)
    scope.start()
    proc.spawn(200, ("bash", "/opt/spark/bin/spark-class", "org.apache.spark.executor.CoarseGrainedExecutorBackend"))
    assert scope.poll() == ([], [])
    proc.exec(200, EXECUTOR)
    watcher.pending = [200]
    new, _ = scope.poll()
    assert [(p.pid, p.kind, p.source) for p in new] == [(200, "executor", "exec")]
    scope.close()
    scope.close()
    assert watcher.closed == 1


def test_polling_fallback_rechecks_young_processes(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    scope = make(proc, clock, FakeWatcher(fail=True))
    scope.start()
    assert scope.exec_watch_mode == "polling" and "no tracepoint" in (scope.exec_watch_error or "")
    proc.spawn(300, ("bash", "spark-class"), age=0.1)
    assert scope.poll() == ([], [])
    clock.now += 0.5
    proc.exec(300, EXECUTOR)
    new, _ = scope.poll()
    assert [p.pid for p in new] == [300]
    # an old process is not re-read on every poll (only on the periodic full rescan)
    before = proc.reads
    clock.now += 0.5
    scope.poll()
    assert proc.reads == before


def test_polling_files_a_fork_only_after_it_had_the_chance_to_exec(env: tuple[FakeClock, FakeProc]) -> None:
    # the Worker forks: for a moment the child has the Worker's command line
    clock, proc = env
    scope = make(proc, clock, FakeWatcher(fail=True))
    scope.start()
    proc.spawn(400, WORKER, ppid=100, age=0.01)
    assert scope.poll() == ([], [])
    clock.now += 0.2
    proc.exec(400, EXECUTOR)
    clock.now += 0.2
    new, _ = scope.poll()
    assert [(p.pid, p.kind) for p in new] == [(400, "executor")]
    # a fork that never execs (pyspark.daemon's workers) is filed once it has settled
    proc.spawn(500, ("python3", "-m", "pyspark.daemon"), ppid=102, age=5)
    proc.spawn(501, ("python3", "-m", "pyspark.daemon"), ppid=500, age=0.01)
    new, _ = scope.poll()
    assert [p.pid for p in new] == [500]
    clock.now += 0.5
    new, _ = scope.poll()
    assert [(p.pid, p.kind, p.role) for p in new] == [(501, "python-worker", "workload")]


def test_tracepoint_mode_waits_for_the_exec_of_new_pids(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    watcher = FakeWatcher()
    scope = make(proc, clock, watcher)
    scope.start()
    proc.spawn(400, WORKER, ppid=100, age=0.01)  # forked, not exec'd yet
    before = proc.reads
    assert scope.poll() == ([], [])
    assert proc.reads == before  # a new pid costs nothing until it execs or settles
    proc.exec(400, EXECUTOR)
    watcher.pending = [400]
    new, _ = scope.poll()
    assert [(p.pid, p.kind, p.source) for p in new] == [(400, "executor", "exec")]
    proc.spawn(501, ("python3", "-m", "pyspark.daemon"), ppid=102, age=0.01)  # a fork that never execs
    assert scope.poll() == ([], [])
    clock.now += 0.4
    new, _ = scope.poll()
    assert [(p.pid, p.kind, p.source) for p in new] == [(501, "python-worker", "scan")]


def test_manual_pids_and_missing_manual_pid(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    scope = make(proc, clock, manual_pids=[101, 102])
    scope.start()
    by_pid = {p.pid: p for p in scope.processes()}
    assert (by_pid[101].engine, by_pid[101].role, by_pid[101].kind, by_pid[101].source) == (
        "manual",
        "workload",
        "manual",
        "manual",
    )
    assert (by_pid[102].kind, by_pid[102].source) == ("executor", "manual")
    # a --pid gone since the command (start-up takes seconds) is noted, not fatal: the run writes a line
    gone = make(proc, clock, FakeWatcher(), manual_pids=[999, 101])
    gone.start()
    assert gone.manual_gone == [999] and [p.pid for p in gone.processes() if p.source == "manual"] == [101]
    watcher = FakeWatcher()
    broken = make(proc, clock, watcher)
    proc.pids = lambda: (_ for _ in ()).throw(PermissionError("/proc: hidepid"))  # type: ignore[method-assign]
    with pytest.raises(PermissionError):
        broken.start()
    assert watcher.closed == 1  # a failed start leaves no exec tracepoint attached


def test_local_driver_defaults_and_pyspark_parent(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    submit = ("java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--class", "A", "app.jar")
    proc.spawn(600, submit)
    proc.env[600] = {"SPARK_CONF_DIR": "/etc/spark"}
    proc.files["/etc/spark/spark-defaults.conf"] = "spark.master spark://m:7077\n"
    proc.spawn(700, ("python3", "app.py"))
    proc.spawn(
        701,
        ("java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--conf", "spark.master=local[2]", "pyspark-shell"),
        ppid=700,
    )
    scope = make(proc, clock)
    scope.start()
    kinds = {p.pid: (p.role, p.kind) for p in scope.processes()}
    assert kinds[600] == ("managing", "driver")  # spark-defaults.conf names a cluster master
    assert kinds[701] == ("workload", "local-driver")
    assert kinds[700] == ("managing", "pyspark-driver")


def test_dropped_exec_records_trigger_a_full_rescan(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    watcher = FakeWatcher()
    scope = make(proc, clock, watcher)
    scope.start()
    proc.spawn(800, ("bash",), age=60)
    scope.poll()
    proc.exec(800, EXECUTOR)  # the exec record was lost
    watcher.dropped = True
    new, _ = scope.poll()
    assert [p.pid for p in new] == [800]


def test_tracepoint_mode_reads_only_what_changed(env: tuple[FakeClock, FakeProc]) -> None:
    # a busy host: kernel threads and processes that are no engine's are not read again every poll,
    # and a process whose command line holds no known_spes.txt text is not parsed nor stat'ed
    clock, proc = env
    proc.kernel.update(range(2, 40))
    watcher = FakeWatcher()
    scope = make(proc, clock, watcher)
    scope.start()
    reads, stats = proc.reads, proc.stats
    for _ in range(5):
        clock.now += 0.3
        assert scope.poll() == ([], [])
    assert proc.reads == reads and proc.stats - stats == 5 * 2  # the exit checks of 100 and 102
    proc.spawn(900, ("gcc", "-c", "x.c"), age=0.01)
    watcher.pending = [900]
    stats = proc.stats
    assert scope.poll() == ([], [])
    assert proc.stats - stats == 2
    # it may still become an executor: its exec says so
    proc.exec(900, ("java", "-Dx=CoarseGrained", "org.apache.spark.executor.CoarseGrainedExecutorBackend"))
    watcher.pending = [900]
    new, _ = scope.poll()
    assert [(p.pid, p.kind) for p in new] == [(900, "executor")]
    # a command line holding a pattern's text that is not its entry point is parsed and left out
    proc.spawn(901, ("tail", "-f", "org.apache.spark.executor.CoarseGrainedExecutorBackend.log"), age=0.01)
    watcher.pending = [901]
    assert scope.poll() == ([], [])


def test_polling_mode_without_literal_patterns_classifies_everything(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    kinds = parse_known_spes("any workload job *-job\n", "test")
    scope = ScopeAnalyzer(
        kinds, proc=proc, watcher_factory=lambda: FakeWatcher(fail=True), clock=clock, monotonic=clock.mono
    )
    scope.start()
    proc.spawn(950, ("/opt/etl-job", "--once"), age=0.01)
    new, _ = scope.poll()
    assert [(p.pid, p.kind) for p in new] == [(950, "job")]


def test_real_proc_source_tells_exits_from_a_pidfd() -> None:
    import subprocess

    from profiler.scope.analyzer import LiveProcSource

    proc = LiveProcSource()
    child = subprocess.Popen(["sleep", "30"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        stat = proc.stat(child.pid)
        assert stat is not None
        assert not proc.alive(child.pid, stat.identity + 1)  # the pid of another process than tracked
        assert proc.alive(child.pid, stat.identity) and proc.alive(child.pid, stat.identity)
        other_stat = proc.stat(other.pid)
        assert other_stat is not None and proc.alive(other.pid, other_stat.identity)
        child.kill()  # a zombie until waited for: it no longer runs
        deadline = time.monotonic() + 5
        while proc.alive(child.pid, stat.identity) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not proc.alive(child.pid, stat.identity)
        child.wait()
        assert not proc.alive(child.pid, stat.identity)
    finally:
        proc.close()
        for process in (child, other):
            process.kill()
            process.wait()
    assert proc.stat(other.pid) is None


def test_roles_choose_which_lines_put_a_process_in_the_scope(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN a host with a Spark worker, an executor and a Kafka broker
    clock, proc = env
    proc.spawn(103, ("java", "-cp", "libs/*", "kafka.Kafka", "/srv/kafka/server.properties"))
    # WHEN the scope is found with the default roles, with the broker asked for, and with workload only
    found = {}
    for roles in (None, ("workload", "managing", "broker"), ("workload",)):
        scope = make(proc, clock) if roles is None else make(proc, clock, roles=roles)
        scope.start()
        found[roles] = {p.pid: (p.engine, p.role, p.kind) for p in scope.processes()}
        scope.close()
    # THEN the broker is in the scope only when asked for, as role broker, never sampled
    assert found[None] == {100: ("spark", "managing", "worker"), 102: ("spark", "workload", "executor")}
    assert found[("workload", "managing", "broker")] == {**found[None], 103: ("kafka", "broker", "broker")}
    assert found[("workload",)] == {102: ("spark", "workload", "executor")}


def test_a_left_out_role_never_hands_a_process_to_a_weaker_line(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN a local-master driver: its best line is workload, a weaker one (no condition) managing
    clock, proc = env
    proc.spawn(104, ("java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--master", "local[2]", "app.py"))
    # WHEN only managing processes are asked for
    scope = make(proc, clock, roles=("managing",))
    scope.start()
    roles = {p.pid: p.role for p in scope.processes()}
    scope.close()
    # THEN the driver stays out (it is not the "driver" managing line), the Worker is in
    assert roles == {100: "managing"}


@pytest.mark.parametrize("exec_watch", [True, False])
def test_command_lines_are_read_only_for_executables_that_could_be_an_engine(
    env: tuple[FakeClock, FakeProc], exec_watch: bool
) -> None:
    # GIVEN a host where 50 shells and sleeps start after the scope did, and one python that is no engine
    clock, proc = env
    watcher = FakeWatcher(fail=not exec_watch)
    scope = make(proc, clock, watcher)
    scope.start()
    reads = proc.reads
    for pid in range(1000, 1050):
        proc.spawn(pid, ("/usr/bin/sleep", "60") if pid % 2 else ("bash", "-c", "make"), age=0.01)
    proc.spawn(1100, ("python3", "tool.py"), age=0.01)
    watcher.pending = list(range(1000, 1050, 2))
    for _ in range(3):
        assert scope.poll() == ([], [])
        clock.now += 0.4
    # THEN only the python's command line was read (once per look), the others cost a readlink each
    assert 1 <= proc.reads - reads <= 3 and scope.cmdlines_skipped >= 50
    # AND a shell that execs the JVM is still found, by its exec event or (polling) as a young process
    proc.exec(1002, EXECUTOR)
    watcher.pending = [1002]
    new, _ = scope.poll()
    assert [(p.pid, p.kind) for p in new] == [(1002, "executor")]


def test_a_pattern_for_a_program_name_reads_every_command_line(env: tuple[FakeClock, FakeProc]) -> None:
    clock, proc = env
    kinds = parse_known_spes("custom workload tool my-engine-daemon\n", "test")
    scope = ScopeAnalyzer(kinds, proc=proc, watcher_factory=FakeWatcher, clock=clock, monotonic=clock.mono)
    proc.spawn(900, ("/opt/bin/my-engine-daemon", "--serve"))
    scope.start()
    assert [(p.pid, p.kind) for p in scope.processes()] == [(900, "tool")] and scope.cmdlines_skipped == 0


def test_python_workers_serve_their_executor_jvm(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN an executor (102) whose pyspark.daemon forked a worker, a daemon listed before its executor
    # (a smaller pid after a wrap), and a python process under no JVM of the scope
    clock, proc = env
    proc.spawn(500, ("python3", "-m", "pyspark.daemon"), ppid=102)
    proc.spawn(501, ("python3", "-m", "pyspark.daemon"), ppid=500)
    proc.spawn(20, ("python3", "-m", "pyspark.daemon"), ppid=30)
    proc.spawn(30, EXECUTOR, ppid=100)
    proc.spawn(600, ("bash",), ppid=101)
    proc.spawn(601, ("python3", "-m", "pyspark.daemon"), ppid=600)
    scope = make(proc, clock)
    scope.start()
    serves = {p.pid: p.serves for p in scope.processes()}
    # THEN each worker names its executor through its parents, a JVM serves no one, a stray daemon neither
    assert (serves[500], serves[501], serves[20]) == (102, 102, 30)
    assert serves[102] is None and serves[30] is None and serves[601] is None
    # AND a worker forked while the window runs is tied on its first filing
    proc.spawn(502, ("python3", "-m", "pyspark.daemon"), ppid=500, age=0.01)
    assert scope.poll() == ([], [])
    clock.now += 0.5
    new, _ = scope.poll()
    assert [(p.pid, p.serves) for p in new] == [(502, 102)]


def fork(proc: FakeProc, watcher: FakeWatcher, child: int, parent: int) -> None:
    """A fork as the kernel reports it: the child runs its parent's program with its parent's command line."""
    proc.spawn(child, proc.table[parent][1], ppid=parent, age=0.0)
    watcher.forks.append((child, parent))


def test_fork_and_exit_records_replace_the_listing_of_proc(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN the scope in tracepoint mode with fork records, and a shell (101) that runs 40 short commands
    clock, proc = env
    watcher = FakeWatcher(forks_known=True)
    scope = make(proc, clock, watcher)
    scope.start()
    listings, reads, exes = proc.listings, proc.reads, proc.exes
    for pid in range(2100, 2105):  # subshells: forks that never exec
        fork(proc, watcher, pid, 101)
    for pid in range(2000, 2040):
        fork(proc, watcher, pid, 101)
        proc.exec(pid, ("/usr/bin/sleep", "1") if pid % 2 else ("python3", "tool.py"))
        watcher.pending.append(pid)
        if pid % 4 == 0:  # some are gone by the poll
            proc.kill(pid)
            watcher.exits.append(pid)
        clock.now += 0.1
        if pid % 5 == 4:
            assert scope.poll() == ([], [])
    # THEN /proc was not listed; each live exec cost a readlink, a command line read only for the pythons,
    # and the subshells nothing (they run the shell's program, found not to be an engine at the start)
    assert proc.listings == listings
    assert proc.exes - exes == 30 and proc.reads - reads == 10
    # AND exited pids are forgotten, not kept until a listing
    assert not {pid for pid in range(2000, 2040, 4)} & set(scope._state.seen)
    # WHEN one of the shell's children execs the executor, and the worker's executor exits
    proc.exec(2001, EXECUTOR)
    watcher.pending = [2001]
    proc.kill(102)
    watcher.exits = [102]
    new, exited = scope.poll()
    # THEN the exec is found at once and the exit by the tracked process's own check
    assert [(p.pid, p.kind, p.source) for p in new] == [(2001, "executor", "exec")] and exited == [102]
    assert proc.listings == listings


def test_a_fork_of_a_scoped_process_that_never_execs_is_found_once_settled(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN an executor's pyspark.daemon in the scope
    clock, proc = env
    proc.spawn(300, ("python3", "-m", "pyspark.daemon"), ppid=102)
    watcher = FakeWatcher(forks_known=True)
    scope = make(proc, clock, watcher)
    scope.start()
    assert 300 in {p.pid for p in scope.processes()}
    listings = proc.listings
    # WHEN it forks a worker that never execs
    fork(proc, watcher, 301, 300)
    assert scope.poll() == ([], [])  # not yet settled: it could still exec
    clock.now += 0.35
    new, _ = scope.poll()
    # THEN the worker is filed under the daemon's line, serving the executor, with no listing of /proc
    assert [(p.pid, p.kind, p.serves) for p in new] == [(301, "python-worker", 102)]
    assert proc.listings == listings


def test_the_slow_sweep_finds_what_the_records_missed(env: tuple[FakeClock, FakeProc]) -> None:
    # GIVEN tracepoint mode with fork records, and an executor that appears without any record
    clock, proc = env
    watcher = FakeWatcher(forks_known=True)
    scope = make(proc, clock, watcher)
    scope.start()
    proc.spawn(500, EXECUTOR, ppid=100, age=0.0)
    listings = proc.listings
    found: list[int] = []
    waited = 0.0
    while not found and waited < SWEEP_SECONDS + 2:
        clock.now += 0.5
        waited += 0.5
        found += [p.pid for p in scope.poll()[0]]
    # THEN the sweep of /proc finds it after SWEEP_SECONDS (and the fork's settling), having listed /proc
    # about once, not every poll
    assert found == [500] and SWEEP_SECONDS <= waited <= SWEEP_SECONDS + 1
    assert proc.listings - listings <= 2


def test_without_fork_records_proc_is_listed_every_poll(env: tuple[FakeClock, FakeProc]) -> None:
    # an agent in a PID namespace: the fork records carry ids of the initial namespace, not usable
    clock, proc = env
    watcher = FakeWatcher(forks_known=False)
    scope = make(proc, clock, watcher)
    scope.start()
    listings = proc.listings
    proc.spawn(600, ("python3", "-m", "pyspark.daemon"), ppid=102, age=0.0)
    watcher.forks = [(600, 102)]  # ignored: not known to be complete
    scope.poll()
    clock.now += 0.35
    new, _ = scope.poll()
    assert [p.pid for p in new] == [600] and proc.listings - listings == 2
