"""The scope analyzer: which processes on this host belong to the engine, found from their command
lines (known_spes.txt) at start and, while the window runs, from exec events or polling of /proc.

How new processes are found, cheaply enough for a 0.2-0.5 s poll on a host with much process churn:
- tracepoint mode: the process watcher (execwatch) reports every exec, every new process (fork) and every
  exit, and a poll does only what those records say, without listing /proc:
  - a pid that exec'd is inspected at once; this also catches a known pid that exec'd into an engine
    process (spark-class's bash becoming the JVM);
  - a new process runs its parent's program with its parent's command line until it execs: the child of a
    process found not to be the engine's is filed as its parent was, nothing read; the child of a scoped
    or unknown process is inspected once it is 0.3 s old, so forks that never exec (PySpark's daemon
    forking workers) are found too;
  - an exit drops the pid from the lists; a tracked process's exit is its pidfd's (LiveProcSource.alive);
  - /proc is listed only every 10 s (SWEEP_SECONDS), for what the records missed: the pids new since the
    last listing are inspected as forks are. Without fork records (an agent inside a PID namespace: they
    carry the initial namespace's ids) or after lost records, /proc is listed every poll instead, and
    the pids new since the previous listing (or all, after lost records) are looked at;
- a process's command line (its own to size) is read only if its executable could run an engine
  process: when every known_spes.txt pattern names what a JVM or Python runs (a class, module, jar,
  script: spes.interpreted_entries_only), a process whose /proc/PID/exe is neither java nor python
  costs one readlink and nothing more;
- a process is parsed against known_spes.txt only if its command line holds one of the texts the
  patterns require (spes.required_fragments); the others cost one cmdline read (in tracepoint mode
  nothing more: if one later execs into an engine process, its exec record says so);
- polling mode (no bcc/tracepoint): new pids are inspected at once, young ones (< 5 s) again every
  poll, everything every 10 s. A new process that looks exactly like its parent is a fork that has
  not exec'd yet (a Worker launching an executor): it is filed only after 0.3 s, not mis-filed as a
  second Worker.
A pid keeps the kind it was first filed under, even if it later execs something else.
"""

from __future__ import annotations

import os
import pwd
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..capture.format import ProcessInfo
from ..errors import CapabilityError
from ..files import procread, procstat, safeio
from .execwatch import ExecSource, ExecWatcher, ProcEvents
from .spes import (
    DEFAULT_ROLES,
    SPARK_ENVIRON,
    SpeKind,
    classify,
    classify_parent,
    default_spark_master,
    engine_executable,
    entry_point,
    interpreted_entries_only,
    needs_spark_master,
    required_fragments,
    summarize_cmdline,
)

POLL_YOUNG_SECONDS = 5.0  # polling mode: re-read the command line of processes this young
POLL_FULL_RESCAN_SECONDS = 10.0
FORK_SETTLE_SECONDS = 0.3
SWEEP_SECONDS = 10.0  # tracepoint mode with fork records: /proc listed this often, for what they missed
MANUAL = "manual"
CONFIG_MAX_BYTES = 1 << 20  # a target's spark-defaults.conf
SERVES_HOPS = 4  # parents looked at for the JVM a python worker serves (worker -> daemon -> executor JVM)


@dataclass(frozen=True)
class ProcSnapshot:
    """What /proc says about one process at one moment."""

    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    user: str
    identity: int  # start time in clock ticks since boot: (pid, identity) names one process


@dataclass(frozen=True)
class ProcStat:
    ppid: int
    identity: int
    age: float  # seconds since the process started


class ProcSource(Protocol):
    """Reading processes; ``LiveProcSource`` is the real one, tests use a fake table.

    ``cmdline`` and ``stat`` are the cheap calls made for every exec'd or new pid; the rest only
    for processes that match known_spes.txt.
    """

    def pids(self) -> list[int]: ...

    def cmdline(self, pid: int) -> tuple[str, ...] | None: ...

    def executable(self, pid: int) -> str | None:
        """The last part of the /proc/PID/exe link; None when unknown (gone, a kernel thread, not ours to read)."""
        ...

    def stat(self, pid: int) -> ProcStat | None: ...

    def snapshot(self, pid: int) -> ProcSnapshot | None: ...

    def environ(self, pid: int) -> dict[str, str]: ...

    def read_text(self, pid: int, path: str) -> str | None: ...

    def jvm(self, pid: int) -> tuple[str | None, bool | None]: ...

    def alive(self, pid: int, identity: int) -> bool:
        """Whether the process (``pid``, ``identity``) still runs (asked every poll for each tracked one)."""
        ...

    def close(self) -> None: ...


def _real_uid(pid: int) -> int | None:
    """The real uid of /proc/PID/status (the user a process runs for, setuid or not); None when gone."""
    fields = procread.status(pid)
    ids = (fields or {}).get("Uid", "").split()
    return int(ids[0]) if ids and ids[0].isascii() and ids[0].isdigit() else None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class LiveProcSource:
    """This host's /proc, read through procread's bounded reader (every file is the target's to size: a
    command line of gigabytes costs one capped read and a warning); a process that vanishes mid-read is
    simply not there."""

    def __init__(self) -> None:
        self._pidfds: dict[int, int] = {}  # tracked pid -> a pidfd of that very process

    def pids(self) -> list[int]:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]

    def cmdline(self, pid: int) -> tuple[str, ...] | None:
        line = procread.cmdline(pid)  # None: kernel thread, zombie or gone
        return None if line is None else line.args

    def executable(self, pid: int) -> str | None:
        # readlink(2) reads the link's own text (the kernel bounds it to PATH_MAX), nothing is followed
        try:
            return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return None

    def stat(self, pid: int) -> ProcStat | None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            return None
        line = procstat.split_stat(raw)
        if line is None or line.state in ("Z", "X"):
            return None
        ppid, start_ticks = line.count(procstat.PPID), line.count(procstat.STARTTIME)
        if ppid is None or start_ticks is None:
            return None
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / _CLOCK_TICKS
        return ProcStat(ppid, start_ticks, max(0.0, age))

    def snapshot(self, pid: int) -> ProcSnapshot | None:
        cmdline = self.cmdline(pid)
        stat = self.stat(pid)
        uid = _real_uid(pid)
        if cmdline is None or stat is None or uid is None:
            return None
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        return ProcSnapshot(pid, stat.ppid, cmdline, user, stat.identity)

    def environ(self, pid: int) -> dict[str, str]:
        return procread.environ(pid, SPARK_ENVIRON)

    def alive(self, pid: int, identity: int) -> bool:
        """A pidfd opened at the first call (and checked against ``identity`` then) turns readable when its
        process exits: one poll(2) per call instead of a /proc/PID/stat read, which walks every thread of a
        JVM for its CPU times. Without pidfds (Linux < 5.3) the stat is read every call."""
        fd = self._pidfds.get(pid)
        if fd is not None:
            poller = select.poll()  # not select(): the agent holds thousands of fds
            poller.register(fd, select.POLLIN)
            if not poller.poll(0):
                return True
            os.close(self._pidfds.pop(pid))
            return False
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # gone, or no pidfds here
            fd = None
        stat = self.stat(pid)  # after the open: a pidfd of a pid reused since is not kept
        if stat is None or stat.identity != identity:
            if fd is not None:
                os.close(fd)
            return False
        if fd is not None:
            self._pidfds[pid] = fd
        return True

    def close(self) -> None:
        fds, self._pidfds = list(self._pidfds.values()), {}
        for fd in fds:
            os.close(fd)

    def read_text(self, pid: int, path: str) -> str | None:
        # the file as the process sees it (containers have their own mount namespace), read as safeio
        # reads a target's files: no link out of its root, no FIFO, bounded, and the process's own user's
        # only: a root-owned file named by a tenant (--properties-file /root/x) is not read (an oracle)
        try:
            content = safeio.read_in_root(pid, path, CONFIG_MAX_BYTES, (safeio.owner(pid)[0],))
        except OSError:
            return None
        return content.decode("utf-8", "replace")

    def jvm(self, pid: int) -> tuple[str | None, bool | None]:
        from .jvm import jvm_info

        info = jvm_info(pid)
        if info is None:
            return None, None
        return info.version, info.preserve_frame_pointer


@dataclass
class _Tracked:
    info: ProcessInfo  # last_seen as of its start or exit; alive_at while it runs
    identity: int
    alive_at: float

    def current(self) -> ProcessInfo:
        if self.info.exited or self.info.last_seen == self.alive_at:
            return self.info
        self.info = replace(self.info, last_seen=self.alive_at)
        return self.info


@dataclass
class _Seen:
    """A process inspected and found not to be an engine process (yet)."""

    cmdline: tuple[str, ...]
    born_monotonic: float


@dataclass
class _State:
    tracked: dict[int, _Tracked] = field(default_factory=dict)
    seen: dict[int, _Seen] = field(default_factory=dict)
    new: list[ProcessInfo] = field(default_factory=list)
    exited: list[int] = field(default_factory=list)
    # pid -> monotonic time first listed: new pids not inspected yet (waiting for their exec, or
    # forks that looked like their parent)
    pending: dict[int, float] = field(default_factory=dict)


class ScopeAnalyzer:
    """Finds the engine's processes and keeps their observation times up to date.

    ``start()`` scans and starts the exec watcher; the processes found then are returned by
    ``processes()``. Each ``poll()`` returns the processes found since the previous poll (or since
    start) and the pids that exited; ``finish(end)`` returns the final records.
    """

    def __init__(
        self,
        kinds: Sequence[SpeKind],
        manual_pids: Sequence[int] = (),
        exec_watch: bool = True,
        *,
        proc: ProcSource | None = None,
        watcher_factory: Callable[[], ExecSource] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        roles: Sequence[str] = DEFAULT_ROLES,
    ) -> None:
        self.kinds = tuple(kinds)
        self.roles = frozenset(roles)  # a process whose line has another role stays out of the scope
        self.manual_pids = tuple(dict.fromkeys(manual_pids))
        self._want_exec_watch = exec_watch
        self._proc: ProcSource = proc if proc is not None else LiveProcSource()
        self._watcher_factory = watcher_factory or ExecWatcher
        self._watcher: ExecSource | None = None
        self._clock = clock
        self._monotonic = monotonic
        self._state = _State()
        self._needs_master = needs_spark_master(self.kinds)
        self._fragments = required_fragments(self.kinds)
        self._by_executable = interpreted_entries_only(self.kinds)
        self.cmdlines_skipped = 0  # command lines not read: the executable could not be an engine
        self._listed: set[int] = set()  # the pids of the previous listing of /proc
        self._last_full_scan = 0.0
        self._last_sweep = 0.0  # the last listing of /proc (tracepoint mode with fork records: a fallback)
        self._started = False
        self.exec_watch_mode = "polling"
        self.exec_watch_error: str | None = None
        self.manual_gone: list[int] = []  # --pid processes already gone when the scope started

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        # Watch first, scan second: a process exec'd during the scan is seen by one or the other.
        if self._want_exec_watch:
            watcher = self._watcher_factory()
            try:
                watcher.start()
                self._watcher = watcher
                self.exec_watch_mode = "tracepoint"
            except CapabilityError as exc:
                self.exec_watch_error = str(exc)
        now = self._clock()
        try:
            for pid in self.manual_pids:
                self._add_manual(pid, now)
            self._scan_all(now, source="scan")
            self._link_served()
        except BaseException:
            self.close()  # no exec tracepoint stays attached when start fails (e.g. a bad --pid)
            raise
        # the initial processes are returned by processes(), not by the first poll()
        self._state.new.clear()

    def poll(self) -> tuple[list[ProcessInfo], list[int]]:
        """(processes found since the last poll, pids that exited since the last poll)."""
        if not self._started:
            self.start()
        now = self._clock()
        mono = self._monotonic()
        events = self._watcher.drain() if self._watcher is not None else ProcEvents()
        polling = self._watcher is None
        # /proc is listed every poll only without fork records (polling, or an agent in a PID namespace);
        # with them, every SWEEP_SECONDS for what the tracepoints missed (processes of another namespace)
        listed: set[int] | None = None
        if polling or events.dropped or not events.forks_known or mono - self._last_sweep >= SWEEP_SECONDS:
            listed = set(self._proc.pids())
            self._last_sweep = mono
            if self._watcher is not None:
                # an exec that happened while /proc was listed shows in the listing with its new
                # command line: drain again so it is still attributed to the exec watcher
                _merge(events, self._watcher.drain())
        gone = set(events.exits)
        self._file_forks(events.forks, gone, mono)
        for pid in dict.fromkeys(events.execs):
            if pid not in self._state.tracked and pid not in gone and (listed is None or pid in listed):
                self._state.seen.pop(pid, None)
                self._state.pending.pop(pid, None)
                self._inspect(pid, now, source="exec")
        self._forget(gone)
        if listed is not None:
            self._look_at_listing(listed, polling, events.dropped, now, mono)
        else:
            self._settle_pending(now, mono)
        self._check_exits(listed, now)
        new, exited = self._state.new, self._state.exited
        self._state.new, self._state.exited = [], []
        return new, exited

    def _file_forks(self, forks: Sequence[tuple[int, int]], gone: set[int], mono: float) -> None:
        """A new process runs its parent's program with its parent's command line until it execs (an exec
        record then): the child of a process found not to be the engine's is filed as its parent was, with
        nothing read; any other (the child of a scoped or unknown process: PySpark's daemon forking workers
        that never exec) is inspected once it has settled."""
        state = self._state
        for child, parent in forks:
            if child in gone or child in state.tracked or child in state.seen or child in state.pending:
                continue
            parent_seen = state.seen.get(parent)
            if parent_seen is not None:
                state.seen[child] = _Seen(parent_seen.cmdline, mono)
            else:
                state.pending[child] = mono

    def _forget(self, gone: set[int]) -> None:
        """Exited processes leave the not-an-engine and waiting lists (the tracked ones: _check_exits)."""
        for pid in gone:
            self._state.seen.pop(pid, None)
            self._state.pending.pop(pid, None)

    def _settle_pending(self, now: float, mono: float) -> None:
        state = self._state
        for pid, first_listed in list(state.pending.items()):
            if mono - first_listed >= FORK_SETTLE_SECONDS:
                del state.pending[pid]
                if pid not in state.tracked:
                    self._inspect(pid, now, source="scan", first_listed=first_listed, settled=True)

    def _look_at_listing(self, listed: set[int], polling: bool, rescan: bool, now: float, mono: float) -> None:
        state = self._state
        if rescan or (polling and mono - self._last_full_scan >= POLL_FULL_RESCAN_SECONDS):
            state.seen.clear()
            self._last_full_scan = mono
        # tracepoint mode looks only at what changed: new pids and those waiting to settle (a pid
        # inspected before, or unreadable like a kernel thread, is not read again every poll)
        changed = listed if polling or rescan else (listed - self._listed) | state.pending.keys()
        for pid in sorted(changed):
            if pid in state.tracked:
                continue
            if pid in state.pending:
                if rescan or mono - state.pending[pid] >= FORK_SETTLE_SECONDS:
                    first_listed = state.pending.pop(pid)
                    self._inspect(pid, now, source="scan", first_listed=first_listed, settled=True)
                continue
            seen = state.seen.get(pid)
            if seen is None:
                if polling or rescan:
                    self._inspect(pid, now, source="scan", first_listed=mono)
                else:
                    # the exec watcher reports it if it execs; a fork that never execs (PySpark's
                    # daemon forking workers) is inspected once it has settled
                    state.pending[pid] = mono
            elif polling and mono - seen.born_monotonic < POLL_YOUNG_SECONDS:
                self._inspect(pid, now, source="scan", recheck=seen)
        for pid in [pid for pid in state.pending if pid not in listed]:
            del state.pending[pid]
        for pid in [pid for pid in state.seen if pid not in listed]:
            del state.seen[pid]
        self._listed = listed

    @property
    def watcher(self) -> ExecSource | None:
        return self._watcher

    @property
    def prog_ids(self) -> list[int]:
        """BPF program ids of the exec watcher (for the profiler's own overhead accounting)."""
        return list(self._watcher.prog_ids) if self._watcher is not None else []

    def processes(self) -> list[ProcessInfo]:
        return [tracked.current() for tracked in sorted(self._state.tracked.values(), key=lambda t: t.info.pid)]

    def finish(self, end_time: float) -> list[ProcessInfo]:
        """Final records: a process still running was observed until ``end_time``."""
        listed = set(self._proc.pids())
        self._check_exits(listed, end_time)
        for tracked in self._state.tracked.values():
            if not tracked.info.exited:
                tracked.alive_at = max(end_time, tracked.info.first_seen)
        return self.processes()

    def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()
        self._proc.close()

    def __enter__(self) -> ScopeAnalyzer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ inspection

    def _scan_all(self, now: float, source: str) -> None:
        self._listed = set(self._proc.pids())
        for pid in sorted(self._listed):
            if pid not in self._state.tracked:
                self._inspect(pid, now, source=source)
        self._last_full_scan = self._last_sweep = self._monotonic()

    def _inspect(
        self,
        pid: int,
        now: float,
        source: str,
        recheck: _Seen | None = None,
        first_listed: float | None = None,
        settled: bool = False,
    ) -> None:
        state = self._state
        if pid == os.getpid():
            return
        cmdline = self._proc.cmdline(pid) if self._could_be_engine(pid) else ()
        if cmdline is None:
            state.seen.pop(pid, None)
            return
        if recheck is not None and recheck.cmdline == cmdline:
            return
        candidate = self._candidate(cmdline)
        if not candidate and self._watcher is not None:
            # not an engine process: the exec watcher tells if it becomes one, its age is not needed
            state.seen[pid] = _Seen(cmdline, self._monotonic())
            return
        stat = self._proc.stat(pid)
        if stat is None:
            state.seen.pop(pid, None)
            return
        born = recheck.born_monotonic if recheck is not None else self._monotonic() - stat.age
        state.seen[pid] = _Seen(cmdline, born)
        if not candidate:
            return
        default_master = self._default_master(pid, cmdline)
        kind = self._in_roles(classify(cmdline, self.kinds, default_master))
        parent_kind = self._in_roles(classify_parent(cmdline, self.kinds, default_master))
        if kind is None and parent_kind is None:
            return
        if kind is not None and first_listed is not None and not settled and self._same_as_parent(stat.ppid, cmdline):
            # a fork that has not exec'd yet carries its parent's command line: look again later
            state.pending[pid] = first_listed
            return
        if kind is not None:
            snap = self._proc.snapshot(pid)
            if snap is not None:
                self._track(snap, kind, now, source)
        if parent_kind is not None and stat.ppid > 1 and stat.ppid not in state.tracked:
            parent = self._proc.snapshot(stat.ppid)
            if parent is not None:
                self._track(parent, parent_kind, now, source)

    def _could_be_engine(self, pid: int) -> bool:
        """False when the executable is known and no known_spes.txt line can match what it runs (spes.
        interpreted_entries_only): its command line, the process's own to size, is not read at all. An
        exec into java later is an exec event (or, polling, a young process looked at again)."""
        if not self._by_executable:
            return True
        name = self._proc.executable(pid)
        if name is None or engine_executable(name):
            return True
        self.cmdlines_skipped += 1
        return False

    def _candidate(self, cmdline: tuple[str, ...]) -> bool:
        """Whether ``cmdline`` holds a text some known_spes.txt line needs (required_fragments): the
        others match no line and are not parsed."""
        if self._fragments is None:
            return True
        text = "\0".join(cmdline)
        return any(fragment in text for fragment in self._fragments)

    def _in_roles(self, kind: SpeKind | None) -> SpeKind | None:
        """The line a process matched, if its role is asked for. The role filters after the best line
        is chosen, so leaving a role out never lets a weaker line of another role take the process."""
        return kind if kind is not None and kind.role in self.roles else None

    def _same_as_parent(self, ppid: int, cmdline: tuple[str, ...]) -> bool:
        return ppid > 1 and self._proc.cmdline(ppid) == cmdline

    def _default_master(self, pid: int, cmdline: Sequence[str]) -> str | None:
        if not self._needs_master or entry_point(cmdline).main_class != "org.apache.spark.deploy.SparkSubmit":
            return None
        return default_spark_master(cmdline, self._proc.environ(pid), lambda path: self._proc.read_text(pid, path))

    def _track(self, snap: ProcSnapshot, kind: SpeKind | None, now: float, source: str) -> ProcessInfo:
        state = self._state
        state.seen.pop(snap.pid, None)
        version, preserve_frame_pointer = self._proc.jvm(snap.pid)
        if kind is None:
            engine, role, kind_name = MANUAL, "workload", MANUAL
        else:
            engine, role, kind_name = kind.engine, kind.role, kind.kind
        info = ProcessInfo(
            pid=snap.pid,
            role=role,
            engine=engine,
            kind=kind_name,
            user=snap.user,
            cmdline=summarize_cmdline(snap.cmdline),
            first_seen=now,
            last_seen=now,
            exited=False,
            source=source,
            jvm_version=version,
            preserve_frame_pointer=preserve_frame_pointer,
        )
        if version is None:
            info = replace(info, serves=self._served_jvm(snap.ppid))
        state.tracked[snap.pid] = _Tracked(info, snap.identity, now)
        state.new.append(info)
        return info

    def _served_jvm(self, ppid: int) -> int | None:
        """The JVM of the scope a non-JVM process works for: its nearest ancestor in the scope that is a JVM,
        or the one that ancestor serves (a forked pyspark.worker's parent is pyspark.daemon, whose parent is
        the executor). Only parents' stat lines are read, at most SERVES_HOPS of them."""
        pid = ppid
        for _ in range(SERVES_HOPS):
            if pid <= 1:
                return None
            tracked = self._state.tracked.get(pid)
            if tracked is not None:
                return pid if tracked.info.jvm_version is not None else tracked.info.serves
            stat = self._proc.stat(pid)
            if stat is None:
                return None
            pid = stat.ppid
        return None

    def _link_served(self) -> None:
        """After the first scan: a python worker listed before its JVM (a smaller pid after a wrap) finds it now."""
        for tracked in self._state.tracked.values():
            info = tracked.info
            if info.jvm_version is None and info.serves is None:
                stat = self._proc.stat(info.pid)
                if stat is not None:
                    tracked.info = replace(info, serves=self._served_jvm(stat.ppid))

    def _add_manual(self, pid: int, now: float) -> None:
        snap = self._proc.snapshot(pid)
        if snap is None:
            # gone since the command (start-up takes seconds): the run writes a line for it (run/departures.py)
            # and samples whatever else there is; a pid absent at the command was refused then (runner.py)
            self.manual_gone.append(pid)
            return
        self._track(snap, classify(snap.cmdline, self.kinds, self._default_master(pid, snap.cmdline)), now, MANUAL)

    def _check_exits(self, listed: set[int] | None, now: float) -> None:
        """Each tracked process's pidfd (ProcSource.alive); ``listed``: this poll's listing of /proc, if any."""
        for pid, tracked in self._state.tracked.items():
            if tracked.info.exited:
                continue
            if (listed is None or pid in listed) and self._proc.alive(pid, tracked.identity):
                tracked.alive_at = now
                continue
            tracked.info = replace(tracked.info, last_seen=now, exited=True)
            self._state.exited.append(pid)


def _merge(events: ProcEvents, more: ProcEvents) -> None:
    events.execs += more.execs
    events.forks += more.forks
    events.exits += more.exits
    events.dropped = events.dropped or more.dropped
