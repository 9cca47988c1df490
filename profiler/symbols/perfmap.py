"""Java JIT symbols: write /tmp/perf-<pid>.map for a running JVM and read it back.

Two ways to get the map, both through HotSpot's dynamic attach mechanism:
- ``Compiler.perfmap`` (JDK 17+): a one-shot dump of the code cache; repeat it to catch code compiled
  since. Spelling: ``long com.example.CpuSplit.burnAlpha(long, long)``.
- our JVMTI agent (profiler/symbols/agent/perfmap_agent.c, any JDK from 8): loaded once, it appends every
  compiled method and stub as it appears. Spelling (perf-map-agent's): ``Lcom/example/CpuSplit;::burnAlpha``.
frames.java_frame_name turns both spellings into ``com.example.CpuSplit::burnAlpha``.

The attach client speaks the protocol directly (about a millisecond of CPU; ``jcmd`` starts a whole JVM,
about 0.25 CPU seconds and seconds of wall time on a busy host): trigger file + SIGQUIT, then
``1\\0<cmd>\\0<arg>\\0<arg>\\0<arg>\\0`` on the ``.java_pid<nspid>`` socket. JDK 9+ accept root as the
peer; a JVM that refuses it (JDK 8 checks for its own uid) is asked by the same client from a child that
entered the JVM's namespaces as its user (profiler.scope.attach). No ``jcmd`` (a target's binary) is run.
"""

from __future__ import annotations

import bisect
import heapq
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import CapabilityError
from ..files import safeio, subproc
from ..scope.attach import AttachError, attach_command, namespace_pid

AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_NAME = "libperfmap_agent.so"
AGENT_BUILD_TIMEOUT = 120.0


# ---------------------------------------------------------------- reading maps (pure)


@dataclass(frozen=True)
class PerfMapEntry:
    start: int
    size: int
    name: str
    order: int  # line number: a later line describes newer code at that address


class PerfMapLike(Protocol):
    def __len__(self) -> int: ...
    def lookup(self, addr: int) -> str | None: ...


class PerfMap:
    """Address lookup over a perf map; where entries overlap (code cache reuse) the later line wins.

    The entries are cut once into disjoint ranges, each with its winner (a sweep: O(n log n)), so a
    lookup is one binary search whatever the map holds (a crafted entry covering the whole address
    space made every lookup scan every entry before it: 60 ms each with 400 k lines)."""

    def __init__(self, entries: Iterable[PerfMapEntry]) -> None:
        ordered = sorted(entries, key=lambda e: e.start)
        self._count = len(ordered)
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._names: list[str] = []
        ends = sorted(e.start + e.size for e in ordered)
        live: list[tuple[int, int, int]] = []  # (-order, end, index in ordered): the latest line on top
        taken = ended = 0
        while (point := self._next_point(ordered, taken, ends, ended)) is not None:
            while taken < len(ordered) and ordered[taken].start == point:
                entry = ordered[taken]
                heapq.heappush(live, (-entry.order, entry.start + entry.size, taken))
                taken += 1
            while ended < len(ends) and ends[ended] <= point:
                ended += 1
            while live and live[0][1] <= point:
                heapq.heappop(live)  # ended (lazily: an ended entry below the top waits until it surfaces)
            following = self._next_point(ordered, taken, ends, ended)
            if live and following is not None:  # a live entry's end is still ahead: following exists
                self._add(point, following, ordered[live[0][2]].name)

    @staticmethod
    def _next_point(ordered: list[PerfMapEntry], taken: int, ends: list[int], ended: int) -> int | None:
        """The next start or end of an entry not passed yet (None: none left)."""
        next_start = ordered[taken].start if taken < len(ordered) else None
        next_end = ends[ended] if ended < len(ends) else None
        if next_start is None or next_end is None:
            return next_end if next_start is None else next_start
        return min(next_start, next_end)

    def _add(self, start: int, end: int, name: str) -> None:
        if self._ends and self._ends[-1] == start and self._names[-1] is name:
            self._ends[-1] = end
        else:
            self._starts.append(start)
            self._ends.append(end)
            self._names.append(name)

    def __len__(self) -> int:
        return self._count

    def lookup(self, addr: int) -> str | None:
        index = bisect.bisect_right(self._starts, addr) - 1
        if index >= 0 and addr < self._ends[index]:
            return self._names[index]
        return None


def parse_perf_map(lines: Iterable[str]) -> PerfMap:
    """``START SIZE name`` per line, hexadecimal with or without 0x (perf's jit-interface.txt); lines
    longer than PERF_MAP_MAX_LINE are skipped and at most PERF_MAP_MAX_LINES entries kept (the readers
    refuse bigger files first: this holds for every caller)."""
    entries = []
    for order, line in enumerate(lines):
        if len(line) > PERF_MAP_MAX_LINE + 1:
            continue
        parts = line.rstrip("\n").split(" ", 2)
        if len(parts) != 3:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        if size > 0 and start >= 0:
            entries.append(PerfMapEntry(start, size, parts[2], order))
            if len(entries) >= PERF_MAP_MAX_LINES:
                break
    return PerfMap(entries)


PERF_MAP_MAX_BYTES = 32 << 20  # a busy JVM's map is a few MB; more is a crafted file or a runaway writer
PERF_MAP_MAX_LINES = 400_000  # parsed, about 60 MB of the agent's 200 MB budget
PERF_MAP_MAX_LINE = 4096


def perf_map_file(pid: int) -> str:
    """Where the JVM writes its map, as the JVM sees it (its own /tmp, its own pid namespace)."""
    return f"/tmp/perf-{namespace_pid(pid)}.map"


def read_perf_map_bytes(pid: int) -> bytes | None:
    """The JVM's perf map, read under its root without following links; None when absent or refused
    with a warning (a link, FIFO, a file of another owner, over PERF_MAP_MAX_BYTES or _LINES): a crafted
    process must not cost the agent its memory budget."""
    try:
        return _read_map(pid, pid, perf_map_file(pid))
    except OSError:
        return None


def _read_map(pid: int, root_pid: int, path: str) -> bytes | None:
    """``path`` under ``root_pid``'s root as a perf map of ``pid`` (its user's file); None when refused
    (warned, naming ``pid``); FileNotFoundError when there is none."""
    try:
        content = safeio.read_in_root(root_pid, path, PERF_MAP_MAX_BYTES, (safeio.owner(pid)[0],), subject=pid)
    except FileNotFoundError:
        raise
    except OSError:
        return None
    lines = content.count(b"\n")
    if lines > PERF_MAP_MAX_LINES:
        shown = f"/proc/{root_pid}/root{path}"
        safeio.warn(pid, shown, f"pid {pid}: {shown}: {lines} lines, over the limit of {PERF_MAP_MAX_LINES}; not read")
        return None
    return content


def read_perf_map(pid: int) -> PerfMap | None:
    """The JVM's perf map (see read_perf_map_bytes), lines longer than PERF_MAP_MAX_LINE skipped."""
    content = read_perf_map_bytes(pid)
    if content is None:
        return None
    return parse_perf_map(
        line for line in content.decode("utf-8", "replace").splitlines() if len(line) <= PERF_MAP_MAX_LINE
    )


# ---------------------------------------------------------------- dumping and the agent


@dataclass(frozen=True)
class PerfMapResult:
    """What one attempt to produce a perf map did."""

    pid: int
    ok: bool
    method: str  # "attach" (Compiler.perfmap), "agent"
    detail: str = ""
    seconds: float = 0.0


def dump_perf_map(pid: int, timeout: float = 30.0) -> PerfMapResult:
    """``Compiler.perfmap`` (JDK 17+) through the attach socket (as the JVM's user from inside its
    namespaces when it refuses root: profiler.scope.attach); no program is run."""
    began = time.monotonic()
    try:
        status, output = attach_command(pid, "jcmd", "Compiler.perfmap", timeout=timeout)
    except AttachError as exc:
        return PerfMapResult(pid, False, "attach", exc.message, time.monotonic() - began)
    ok = status == 0 and not re.search(r"Unknown diagnostic command|Exception|[Ee]rror", output[:500])
    return PerfMapResult(pid, ok, "attach", output.strip()[:300], time.monotonic() - began)


def agent_path() -> Path:
    return AGENT_DIR / AGENT_NAME


def build_agent(java_home: str | None = None) -> Path:
    """Build the JVMTI agent with gcc against the JDK's jvmti.h (scripts/setup.sh does this at install)."""
    env = dict(os.environ)
    if java_home:
        env["JAVA_HOME"] = java_home
    try:
        done = subproc.run(["make", "-s", "-C", str(AGENT_DIR)], AGENT_BUILD_TIMEOUT, env=env)
        failure = done.stderr.strip()[:200] if done.returncode != 0 else ""
    except (OSError, subprocess.SubprocessError) as exc:
        failure = str(exc)[:200]
    if failure or not agent_path().exists():
        raise CapabilityError(
            f"{AGENT_DIR}/Makefile: building the perf-map agent failed ({failure}); "
            "install build-essential and a JDK (openjdk-17-jdk-headless), then run make -C profiler/symbols/agent"
        )
    return agent_path()


def _copy_agent_into(pid: int, agent: Path) -> tuple[Path, str]:
    """Copy the agent into the JVM's /tmp, created as the JVM's user (O_CREAT|O_EXCL|O_NOFOLLOW, 0600:
    the JVM runs as that user) so that its mount namespace can open it.

    Returns (host path, path as the JVM sees it); remove it with ``_remove_agent_copy``.
    """
    jvm_path = f"/tmp/.spe-perfmap-agent-{os.getpid()}-{secrets.token_hex(6)}.so"
    shown = safeio.create_as_target(pid, "root", jvm_path, agent.read_bytes())
    return Path(shown), jvm_path


def _remove_agent_copy(pid: int, jvm_path: str) -> None:
    try:
        safeio.remove_as_target(pid, "root", jvm_path)
    except OSError:
        pass  # the process is gone, or its /tmp with it


def load_agent(pid: int, agent: Path | None = None, options: str = "", timeout: float = 30.0) -> PerfMapResult:
    """Load the perf-map agent into a running JVM (JDK 8+); the agent then keeps the map current."""
    began = time.monotonic()
    agent = agent or agent_path()
    if not agent.exists():
        raise CapabilityError(f"{agent}: perf-map agent not built; run make -C {AGENT_DIR}")
    try:
        _host_path, jvm_path = _copy_agent_into(pid, agent)
    except OSError as exc:
        return PerfMapResult(
            pid, False, "agent", f"copying the agent into its /tmp failed: {exc}", time.monotonic() - began
        )
    try:
        try:
            status, output = attach_command(pid, "load", jvm_path, "true", options, timeout=timeout)
        except AttachError as exc:
            return PerfMapResult(pid, False, "agent", exc.message, time.monotonic() - began)
    finally:
        _remove_agent_copy(pid, jvm_path)  # the JVM has it mapped (or failed); nothing else needs the copy
    # JDK 9+ answer "0\nreturn code: N"; JDK 8 answers "0\nN" with the agent's return value.
    match = re.search(r"return code:\s*(-?\d+)", output) or re.match(r"\s*(-?\d+)", output)
    agent_status = int(match.group(1)) if match else status
    ok = status == 0 and agent_status == 0
    return PerfMapResult(pid, ok, "agent", f"attach: {output.strip()[:200]}", time.monotonic() - began)


def _main(argv: list[str]) -> int:
    """``python -m profiler.symbols.perfmap PID COMMAND [ARG...]``: one attach request, printed as status, output."""
    pid, command, *args = argv
    try:
        status, output = attach_command(int(pid), command, *args)
    except AttachError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    print(status)
    print(output, end="")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
