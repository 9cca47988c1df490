"""Software counters of one process read from /proc instead of perf events.

Why: a perf event sits in its thread's perf context, which the kernel switches out and in at every
context switch of that thread, billed to the workload (+2.1 µs per switch for the default software set
on a host without a PMU, docs/benchmarks/overhead.md). Reading /proc costs the workload nothing
between readings; the reading itself is the agent's CPU.

Where each value comes from (all deltas from ``open``, i.e. from when the pid entered the scope):

- task-clock: utime + stime of /proc/PID/stat: the whole process, exited threads included, resolution
  one clock tick (1/SC_CLK_TCK s, 10 ms with the usual USER_HZ 100).
- page-faults, minor-faults, major-faults: minflt / majflt of /proc/PID/stat (whole process, exited
  threads included).
- context-switches: voluntary + nonvoluntary_ctxt_switches of /proc/PID/task/TID/status, and
  cpu-migrations: se.nr_migrations of /proc/PID/task/TID/sched (kernels with CONFIG_SCHED_DEBUG):
  per thread, the kernel has no process total in /proc. Threads are tracked across readings by (tid,
  start time), so a reused tid is a new thread.

What a reading cannot see, exits, comes from the kernel's taskstats exit records (sampling/taskstats.py)
when the caller delivers them: a thread that exits between readings counts its switches up to its exit,
and a process reaped between readings adds what its threads did after its last reading (CPU, faults,
switches) to it, so one that exits within its first interval is measured too. Without them (no
CAP_NET_ADMIN, no CONFIG_TASKSTATS) a thread's switches after its last reading are lost, a reaped process
keeps its last reading, and one reaped before any reading after ``open`` has no values (None, "not
measured"), never 0; the notes say which. Migrations have no exit record: a thread's last ones are lost.
Everything under /proc/PID belongs to the target: reads are size-bounded, never follow a link, and a
vanished thread or process (ENOENT, ESRCH) is normal, never an error.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..capture.format import CounterValue
from ..files import procread, procstat
from ..files.safeio import open_without_links, read_fd
from .taskstats import ThreadExit

TASK_CLOCK = "task-clock"
# event name (perf's names and aliases) -> which /proc value answers it
PROC_EVENTS: dict[str, str] = {
    TASK_CLOCK: "cpu",
    "page-faults": "faults",
    "faults": "faults",
    "minor-faults": "minor_faults",
    "major-faults": "major_faults",
    "context-switches": "switches",
    "cs": "switches",
    "cpu-migrations": "migrations",
    "migrations": "migrations",
}
# While exit records are delivered, a pid's threads (three files each) are read at most this often; its
# totals at every reading (bench/bench_counter_reads.py: the YSB demo's six JVMs, ~800 threads).
THREAD_READINGS_EVERY_S = 30.0
MAX_PROC_FILE = 64 * 1024  # stat < 1 KiB, status ~1.5 KiB, sched ~3 KiB; more is not a /proc file
_VANISHED = (errno.ENOENT, errno.ESRCH)
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ---------------------------------------------------------------- parsing (pure)


@dataclass(frozen=True)
class ProcessTotals:
    """Whole-process values of /proc/PID/stat (exited threads included)."""

    cpu_ticks: int  # utime + stime
    minor_faults: int
    major_faults: int
    start_ticks: int  # tells a reused pid from the process we added


@dataclass(frozen=True)
class ThreadCounts:
    """One thread's cumulative values; None where its file was missing or malformed."""

    start_ticks: int
    switches: int | None
    migrations: int | None
    cpu_ticks: int = 0  # the thread's own utime + stime (what its exit record is compared with)
    minor_faults: int = 0
    major_faults: int = 0


def parse_stat(text: str) -> ProcessTotals | None:
    """The totals of /proc/PID/stat text; None when malformed (``procstat``: fields after the last ')')."""
    line = procstat.split_stat(text)
    if line is None:
        return None
    minflt, majflt, utime, stime, start = (
        line.count(number)
        for number in (procstat.MINFLT, procstat.MAJFLT, procstat.UTIME, procstat.STIME, procstat.STARTTIME)
    )
    if minflt is None or majflt is None or utime is None or stime is None or start is None:
        return None
    return ProcessTotals(utime + stime, minflt, majflt, start)


def _last_value(text: str, key: str, separator: str) -> int | None:
    """The value of the last ``key<separator> value`` line (blanks allowed before the separator): the
    kernel writes its own lines after the comm, so a comm that imitates one cannot win. Searched from the
    end (a reading parses some hundred threads' files)."""
    end = len(text)
    while True:
        at = text.rfind(key, 0, end)
        if at < 0:
            return None
        end = at
        if at > 0 and text[at - 1] != "\n":
            continue  # inside a line, not its start
        line_end = text.find("\n", at)
        rest = text[at + len(key) : line_end if line_end >= 0 else len(text)]
        name_tail, sep, value = rest.partition(separator)
        if sep and not name_tail.strip():
            return procstat.parse_count(value.strip())


def parse_switches(status_text: str) -> int | None:
    """voluntary + nonvoluntary context switches of /proc/PID/task/TID/status text."""
    voluntary = _last_value(status_text, "voluntary_ctxt_switches", ":")
    involuntary = _last_value(status_text, "nonvoluntary_ctxt_switches", ":")
    return None if voluntary is None or involuntary is None else voluntary + involuntary


def parse_migrations(sched_text: str) -> int | None:
    """se.nr_migrations of /proc/PID/task/TID/sched text (its first line carries the comm: skipped)."""
    _, _, body = sched_text.partition("\n")
    return _last_value(body, "se.nr_migrations", ":")


# ---------------------------------------------------------------- reading /proc


class ProcFiles:
    """Bounded, link-free reads under a /proc root (a fake tree in tests, the same code)."""

    def __init__(self, root: str = "/proc", max_bytes: int = MAX_PROC_FILE) -> None:
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes

    def text(self, relative: str) -> str | None:
        """The file's text; None when it is gone, not a regular file, a link or oversized."""
        try:
            fd = open_without_links(f"{self.root}/{relative}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None  # gone (ENOENT/ESRCH), a link (ELOOP), not ours to read: nothing to count
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            raw = read_fd(fd, self.max_bytes + 1)
        except OSError:
            return None  # ESRCH: the task went away between open and read
        finally:
            os.close(fd)
        if len(raw) > self.max_bytes:
            return None
        return raw.decode("utf-8", "replace")

    def tasks(self, pid: int) -> list[int] | None:
        """The thread ids of ``pid``, at most THREADS_MAX (a warning past it); None when the process is gone."""
        return procread.task_ids(pid, root=self.root)

    def process(self, pid: int) -> ProcessTotals | None:
        text = self.text(f"{pid}/stat")
        return parse_stat(text) if text is not None else None

    def thread(self, pid: int, tid: int) -> ThreadCounts | None:
        base = f"{pid}/task/{tid}"
        stat_text = self.text(f"{base}/stat")
        totals = parse_stat(stat_text) if stat_text is not None else None
        if totals is None:
            return None
        status_text = self.text(f"{base}/status")
        sched_text = self.text(f"{base}/sched")
        return ThreadCounts(
            totals.start_ticks,
            parse_switches(status_text) if status_text is not None else None,
            parse_migrations(sched_text) if sched_text is not None else None,
            totals.cpu_ticks,
            totals.minor_faults,
            totals.major_faults,
        )


@dataclass(frozen=True)
class ProcSnapshot:
    """One reading of a process: None totals when it is gone (or its pid now names another process)."""

    totals: ProcessTotals | None
    threads: Mapping[tuple[int, int], ThreadCounts]  # (tid, start ticks) -> counts
    taken_ns: int


def take_snapshot(files: ProcFiles, pid: int, clock_ns: Callable[[], int], with_threads: bool = True) -> ProcSnapshot:
    """The process's totals and, ``with_threads``, every thread's counts (three files per thread: the
    reading's main cost)."""
    taken = clock_ns()
    totals = files.process(pid)
    threads: dict[tuple[int, int], ThreadCounts] = {}
    for tid in (files.tasks(pid) or []) if totals is not None and with_threads else []:
        counts = files.thread(pid, tid)
        if counts is not None:
            threads[(tid, counts.start_ticks)] = counts
    return ProcSnapshot(totals, threads, taken)


# ---------------------------------------------------------------- tracking threads (pure)


@dataclass(frozen=True)
class ThreadLedger:
    """Per thread (tid, start ticks): its counts when first seen in the scope, and when last seen."""

    first: Mapping[tuple[int, int], ThreadCounts] = field(default_factory=dict)
    last: Mapping[tuple[int, int], ThreadCounts] = field(default_factory=dict)
    threads_seen: int = 0

    def start(self, snapshot: ProcSnapshot) -> ThreadLedger:
        """The threads alive when the pid entered the scope: their counts so far are not ours."""
        return ThreadLedger(dict(snapshot.threads), dict(snapshot.threads), len(snapshot.threads))

    def update(self, snapshot: ProcSnapshot) -> ThreadLedger:
        """Threads seen now update their last counts; a thread born since counts from zero (all of it
        happened in the scope); a thread gone keeps its last counts (the loss: its final moments)."""
        first, last = dict(self.first), dict(self.last)
        born = 0
        for key, counts in snapshot.threads.items():
            if key not in first:
                first[key] = ThreadCounts(counts.start_ticks, 0, 0)
                born += 1
            last[key] = counts
        return ThreadLedger(first, last, self.threads_seen + born)

    def total(self, which: str) -> int | None:
        """Sum over tracked threads of ``which`` ("switches" or "migrations"); None if no thread had it."""
        value, any_known = 0, False
        for key, latest in self.last.items():
            now, then = getattr(latest, which), getattr(self.first[key], which)
            if now is None:
                continue
            any_known = True
            value += max(0, now - (then or 0))
        return value if any_known else None

    def with_exits(
        self, exits: Sequence[ThreadExit], previous: Mapping[tuple[int, int], ThreadCounts], alive: Collection[int]
    ) -> ThreadLedger:
        """Threads that exited since the ``previous`` reading count their switches up to their exit: one
        seen then takes its exit record's total; one born and gone since counts it whole. A tid still
        ``alive`` now (a zombie leader, a reused tid) is the snapshot's to tell."""
        first, last = dict(self.first), dict(self.last)
        born = 0
        for record in exits:
            if record.tid in alive:
                continue
            # a thread gone before ``previous`` was read but whose record came after it is an earlier one's
            key = _seen_key(previous, record.tid) or _seen_key(last, record.tid)
            if key is None:
                key = (record.tid, -1 - self.threads_seen - born)  # never a real start time
                first[key] = ThreadCounts(-1, 0, None)
                born += 1
            last[key] = replace(last.get(key, first[key]), switches=record.switches)
        return ThreadLedger(first, last, self.threads_seen + born)


def _seen_key(threads: Mapping[tuple[int, int], ThreadCounts], tid: int) -> tuple[int, int] | None:
    """The key of ``tid`` in a reading (the latest-started one if the tid was reused)."""
    keys = [key for key in threads if key[0] == tid]
    return max(keys, key=lambda key: key[1]) if keys else None


@dataclass(frozen=True)
class ExitTail:
    """What threads did between a process's last reading and their exit, from their exit records."""

    cpu_ns: float = 0.0
    minor_faults: int = 0
    major_faults: int = 0
    threads: int = 0


def exit_tail(previous: Mapping[tuple[int, int], ThreadCounts], exits: Sequence[ThreadExit]) -> ExitTail:
    """The exit records minus each thread's values at the last reading (whole for a thread born since).
    The reading's CPU is in clock ticks of the adjusted utime+stime, the record's the exact runtime:
    a difference below zero is the reading's rounding, counted as zero."""
    cpu_ns, minor, major = 0.0, 0, 0
    for record in exits:
        key = _seen_key(previous, record.tid)
        seen = previous[key] if key is not None else ThreadCounts(0, 0, None)
        cpu_ns += max(0.0, record.cpu_ns - seen.cpu_ticks * 1e9 / CLOCK_TICKS_PER_S)
        minor += max(0, record.minor_faults - seen.minor_faults)
        major += max(0, record.major_faults - seen.major_faults)
    return ExitTail(cpu_ns, minor, major, len(exits))


# ---------------------------------------------------------------- one pid


_SOURCE_NOTES = {
    "cpu": "/proc/PID/stat utime+stime: whole process, exited threads included; resolution {tick} ms (clock ticks)",
    "faults": "/proc/PID/stat minflt+majflt: whole process, exited threads included",
    "minor_faults": "/proc/PID/stat minflt: whole process, exited threads included",
    "major_faults": "/proc/PID/stat majflt: whole process, exited threads included",
    "switches": "/proc/PID/task/*/status per thread",
    "migrations": "/proc/PID/task/*/sched per thread: a thread's migrations after its last reading before it "
    "exited are not counted",
}
_SWITCHES_TO_EXIT = "threads that exited counted up to their exit (taskstats)"
_SWITCHES_LOST = "a thread's switches after its last reading before it exited are not counted"


class PidProcCounters:
    """The /proc-backed events of one pid, as deltas from ``open``; same surface as PidCounterSet.

    Exit records (``record_exits``, from taskstats) fill what the readings miss: what a process did
    between its last reading and its exit, and the switches of threads that exited between readings.
    ``exits_unavailable`` says why there are none (empty when the caller delivers them).

    A reading takes the process's totals (CPU, faults: one file); its threads' files (switches,
    migrations: three per thread, the reading's main cost) only when ``threads_every_ns`` has passed
    since the last full reading, and at ``freeze``. Between full readings the switches and migrations
    read are those of the last full one; the exit records keep the threads that exit meanwhile counted
    (a gone process is the last full reading plus its threads' exit records, which is exact). Only with
    exit records delivered: without them every reading is full, as a thread's switches after its last
    reading would be lost."""

    def __init__(
        self,
        pid: int,
        events: Sequence[str],
        files: ProcFiles | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        exits_unavailable: str = "taskstats not used",
        threads_every_ns: int = 0,
    ) -> None:
        unknown = [name for name in events if name not in PROC_EVENTS]
        if unknown:
            raise ValueError(f"not a /proc counter: {', '.join(unknown)}")
        self.pid = pid
        self.events = tuple(events)
        self._files = files if files is not None else ProcFiles()
        self._clock_ns = clock_ns
        self._exits_unavailable = exits_unavailable
        self._threads_every_ns = threads_every_ns if not exits_unavailable else 0
        self._base: ProcSnapshot | None = None
        self._last: ProcSnapshot | None = None  # the last full reading (threads read)
        self._latest: ProcSnapshot | None = None  # the last reading, full or of the totals alone
        self._ledger = ThreadLedger()
        self._pending: list[ThreadExit] = []  # exits delivered since the last reading
        self._gone = False
        self._readings = 0  # readings after the baseline
        self._frozen: dict[str, CounterValue] | None = None

    open_fds = 0  # no perf event, no fd held between readings

    def open(self) -> None:
        snapshot = take_snapshot(self._files, self.pid, self._clock_ns)
        if snapshot.totals is None:
            return  # exited before it could be counted: every value says so
        self._base = self._last = self._latest = snapshot
        self._ledger = ThreadLedger().start(snapshot)

    def record_exits(self, exits: Sequence[ThreadExit]) -> None:
        """Exit records of this process's threads, delivered in the order the kernel sent them and
        drained before the next reading (so a reading includes every exit delivered before it)."""
        if self._frozen is None and self._base is not None:
            self._pending.extend(record for record in exits if record.tgid == self.pid)

    def _refresh(self, full: bool) -> None:
        if self._base is None or self._last is None or self._gone or self._base.totals is None:
            return
        full = full or self._clock_ns() - self._last.taken_ns >= self._threads_every_ns
        snapshot = take_snapshot(self._files, self.pid, self._clock_ns, with_threads=full)
        if snapshot.totals is None or snapshot.totals.start_ticks != self._base.totals.start_ticks:
            self._gone = True  # reaped (or the pid now names another process): last reading + exit records
            return
        self._latest = snapshot
        self._readings += 1
        if not full:
            return  # exits stay pending until the next full reading: a gone process needs them
        alive = {tid for tid, _ in snapshot.threads}
        self._ledger = self._ledger.update(snapshot).with_exits(self._pending, self._last.threads, alive)
        self._pending.clear()  # their CPU and faults are in the process's totals now
        self._last = snapshot

    def read(self) -> dict[str, CounterValue]:
        if self._frozen is not None:
            return dict(self._frozen)
        self._refresh(full=False)
        return self._values()

    def _values(self) -> dict[str, CounterValue]:
        return {name: self._value(PROC_EVENTS[name]) for name in self.events}

    def _value(self, source: str) -> CounterValue:
        base, last, latest = self._base, self._last, self._latest
        if base is None or base.totals is None or last is None or last.totals is None or latest is None:
            return CounterValue(None, False, note="process exited before counters were opened")
        tail = exit_tail(last.threads, self._pending) if self._gone else ExitTail()
        if self._gone and self._readings == 0 and not tail.threads:  # a zero would claim it did nothing
            why = f"; {self._exits_unavailable}" if self._exits_unavailable else "; no exit record"
            return CounterValue(None, False, note=f"process exited before its first /proc reading: not measured{why}")
        current, value = self._current_value(source, base.totals, last, latest, tail)
        if value is None:
            missing = "sched (needs CONFIG_SCHED_DEBUG)" if source == "migrations" else "status"
            return CounterValue(None, False, note=f"/proc/PID/task/*/{missing} unreadable")
        elapsed = max(0, current.taken_ns - base.taken_ns)
        return CounterValue(value, True, elapsed, elapsed, "; ".join(self._notes(source, tail)))

    def _current_value(
        self, source: str, base: ProcessTotals, last: ProcSnapshot, latest: ProcSnapshot, tail: ExitTail
    ) -> tuple[ProcSnapshot, float | None]:
        """(the reading the value stands on, the value): the latest reading; for a gone process with exit
        records, its last full reading plus them (the records' values start there) when that is more, as
        it is unless records were dropped."""
        assert latest.totals is not None and last.totals is not None  # readings without totals are not kept
        value = self._measure(source, base, latest.totals, ExitTail())
        if not tail.threads:
            return latest, value
        with_exits = self._measure(source, base, last.totals, tail)
        if with_exits is not None and (value is None or with_exits > value):
            return last, with_exits
        return latest, value

    def _measure(self, source: str, first: ProcessTotals, last: ProcessTotals, tail: ExitTail) -> float | None:
        if source == "cpu":
            return (last.cpu_ticks - first.cpu_ticks) * 1e9 / CLOCK_TICKS_PER_S + tail.cpu_ns
        if source in ("faults", "minor_faults", "major_faults"):
            minor = last.minor_faults - first.minor_faults + tail.minor_faults
            major = last.major_faults - first.major_faults + tail.major_faults
            return float({"faults": minor + major, "minor_faults": minor, "major_faults": major}[source])
        ledger = self._ledger
        if self._gone and self._last is not None:
            ledger = ledger.with_exits(self._pending, self._last.threads, ())
        total = ledger.total(source)
        return None if total is None else float(total)

    def _notes(self, source: str, tail: ExitTail) -> list[str]:
        notes = [_SOURCE_NOTES[source].format(tick=round(1000 / CLOCK_TICKS_PER_S))]
        if source == "switches":
            notes.append(_SWITCHES_LOST if self._exits_unavailable else _SWITCHES_TO_EXIT)
        if self._gone and tail.threads:
            notes.append(f"process exited: its last reading plus {tail.threads} thread exit record(s) (taskstats)")
        elif self._gone:
            notes.append("process exited: values as of its last reading before exit")
        if self._gone and self._exits_unavailable:
            notes.append(self._exits_unavailable)
        return notes

    def freeze(self) -> dict[str, CounterValue]:
        """The final values (one last reading if the process is still there); later reads return them."""
        if self._frozen is None:
            self._refresh(full=True)
            self._frozen = self._values()
        return dict(self._frozen)
