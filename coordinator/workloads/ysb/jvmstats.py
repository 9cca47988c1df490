"""Health of a running JVM from outside: CPU of its JIT compiler threads (/proc), heap in use and loaded
classes (jstat). Used by the soak benchmark to tell a steady state from a JIT or heap that never settles."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from coordinator.report.health import is_compiler_thread
from profiler.files import procstat

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ThreadCpu:
    """CPU seconds of one process so far: each live JIT compiler thread's, and the whole process's."""

    compiler: Mapping[int, float]  # thread id -> CPU seconds
    total_seconds: float  # the process (/proc/<pid>/stat: includes threads that have exited)

    @property
    def compiler_seconds(self) -> float:
        return sum(self.compiler.values())


def parse_task_stat(text: str) -> tuple[str, float]:
    """(comm, utime + stime in clock ticks) of one /proc/<pid>[/task/<tid>]/stat line; comm may hold
    spaces and parentheses, so the fields are read after the last ')'."""
    line = procstat.split_stat(text)
    utime = line.count(procstat.UTIME) if line is not None else None
    stime = line.count(procstat.STIME) if line is not None else None
    if line is None or utime is None or stime is None:
        raise ValueError(f"not a /proc stat line: {text[:80]!r}")
    return line.comm, float(utime + stime)


def thread_cpu(pid: int, proc: Path = Path("/proc")) -> ThreadCpu:
    """Compiler-thread and whole-process CPU seconds of ``pid`` so far."""
    _, total = parse_task_stat((proc / str(pid) / "stat").read_text())
    compiler: dict[int, float] = {}
    for task in (proc / str(pid) / "task").iterdir():
        try:
            comm, ticks = parse_task_stat((task / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if is_compiler_thread(comm):
            compiler[int(task.name)] = ticks / CLOCK_TICKS
    return ThreadCpu(compiler, total / CLOCK_TICKS)


def process_cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """User + system CPU seconds ``pid`` has used since it started (None once it has exited)."""
    try:
        return parse_task_stat((proc / str(pid) / "stat").read_text())[1] / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def cpu_short_of(used: Mapping[int, float | None], goal: float) -> float:
    """CPU seconds the least-run of ``used``'s processes still lacks to reach ``goal`` (0: all have);
    processes that have exited (None) are left out, and with none left the whole goal is lacking."""
    running = [seconds for seconds in used.values() if seconds is not None]
    if not running:
        return goal
    return max(0.0, goal - min(running))


def compiler_seconds_between(before: ThreadCpu, after: ThreadCpu) -> float:
    """Compiler-thread CPU between two readings. HotSpot starts and retires compiler threads on demand:
    a thread seen only in ``after`` counts from zero, a retired one's last interval is lost (under-count)."""
    return sum(max(0.0, seconds - before.compiler.get(tid, 0.0)) for tid, seconds in after.compiler.items())


def jit_share(before: ThreadCpu, after: ThreadCpu) -> float | None:
    """Share of the process's CPU between two readings spent in compiler threads (None when idle)."""
    spent = after.total_seconds - before.total_seconds
    if spent <= 0:
        return None
    return min(1.0, compiler_seconds_between(before, after) / spent)


def parse_jstat(text: str) -> dict[str, float]:
    """The two lines of ``jstat -<option> PID`` (header, values) as a dict; '-' becomes 0."""
    lines = [line.split() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or len(lines[0]) != len(lines[-1]):
        raise ValueError(f"unexpected jstat output: {text.strip()[:200]!r}")
    return {name: 0.0 if value == "-" else float(value) for name, value in zip(lines[0], lines[-1])}


def heap_used_mb(gc: dict[str, float]) -> float:
    """Heap in use from ``jstat -gc`` (survivors + eden + old, KB) in MB."""
    return sum(gc.get(column, 0.0) for column in ("S0U", "S1U", "EU", "OU")) / 1024.0


def _jstat(option: str, pid: int) -> dict[str, float] | None:
    jstat = shutil.which("jstat")
    if jstat is None:
        return None
    try:
        result = subprocess.run([jstat, option, str(pid)], capture_output=True, text=True, timeout=30)
        return parse_jstat(result.stdout) if result.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


@dataclass(frozen=True)
class HeapReading:
    heap_used_mb: float
    old_used_mb: float
    full_gcs: int
    loaded_classes: int


def heap_reading(pid: int) -> HeapReading | None:
    """Heap, old generation, full GC count and loaded classes of a HotSpot JVM (None if jstat fails)."""
    gc = _jstat("-gc", pid)
    classes = _jstat("-class", pid)
    if gc is None:
        return None
    return HeapReading(
        heap_used_mb=heap_used_mb(gc),
        old_used_mb=gc.get("OU", 0.0) / 1024.0,
        full_gcs=int(gc.get("FGC", 0.0)),
        loaded_classes=int(classes.get("Loaded", 0.0)) if classes else 0,
    )
