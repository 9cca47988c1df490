"""Java JIT symbols: write /tmp/perf-<pid>.map for a running JVM and read it back.

Two ways to get the map, both through HotSpot's dynamic attach mechanism:
- ``Compiler.perfmap`` (JDK 17+): a one-shot dump of the code cache; repeat it to catch code compiled
  since. Spelling: ``long com.example.CpuSplit.burnAlpha(long, long)``.
- our JVMTI agent (profiler/symbols/agent/perfmap_agent.c, any JDK from 8): loaded once, it appends every
  compiled method and stub as it appears. Spelling (perf-map-agent's): ``Lcom/example/CpuSplit;::burnAlpha``.
symbolize.java_frame_name turns both spellings into ``com.example.CpuSplit::burnAlpha``.

The attach client speaks the protocol directly (about a millisecond of CPU; ``jcmd`` starts a whole JVM,
about 0.25 CPU seconds and seconds of wall time on a busy host): trigger file + SIGQUIT, then
``1\\0<cmd>\\0<arg>\\0<arg>\\0<arg>\\0`` on the ``.java_pid<nspid>`` socket. JDK 9+ accept root as the
peer; a JVM that refuses it (JDK 8 checks for its own uid) is asked by the same client from a child that
entered the JVM's namespaces as its user (profiler.scope.attach). No ``jcmd`` (a target's binary) is run.
"""

from __future__ import annotations

import bisect
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
    """Address lookup over a perf map; where entries overlap (code cache reuse) the later line wins."""

    def __init__(self, entries: Iterable[PerfMapEntry]) -> None:
        self._entries = sorted(entries, key=lambda e: (e.start, e.order))
        self._starts = [e.start for e in self._entries]
        # Largest entry size lets a lookup stop scanning left once no earlier entry can reach addr.
        self._max_size = max((e.size for e in self._entries), default=0)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, addr: int) -> str | None:
        index = bisect.bisect_right(self._starts, addr) - 1
        best: PerfMapEntry | None = None
        while index >= 0:
            entry = self._entries[index]
            if addr - entry.start >= self._max_size:
                break
            if entry.start <= addr < entry.start + entry.size and (best is None or entry.order > best.order):
                best = entry
            index -= 1
        return best.name if best is not None else None


def parse_perf_map(lines: Iterable[str]) -> PerfMap:
    """``START SIZE name`` per line, hexadecimal with or without 0x (perf's jit-interface.txt)."""
    entries = []
    for order, line in enumerate(lines):
        parts = line.rstrip("\n").split(" ", 2)
        if len(parts) != 3:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        if size > 0:
            entries.append(PerfMapEntry(start, size, parts[2], order))
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


def _within_limits(pid: int, root_pid: int, path: str) -> bool:
    try:
        return _read_map(pid, root_pid, path) is not None
    except FileNotFoundError:
        return True
    except OSError:
        return False


def bcc_may_read_perf_maps(pid: int) -> bool:
    """Whether bcc's symbol cache may be given ``pid``: bcc reads the maps itself (the JVM's own and
    /tmp/perf-PID.map of the host, whole, as root, following links, a FIFO blocking it), so both must
    be absent or pass the checks of our own reads (safeio; a refusal is warned once)."""
    return _within_limits(pid, pid, perf_map_file(pid)) and _within_limits(pid, os.getpid(), f"/tmp/perf-{pid}.map")


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
