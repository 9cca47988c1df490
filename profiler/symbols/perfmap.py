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
peer; when a JVM refuses (JDK 8 checks for its own uid), we fall back to ``jcmd`` as the JVM's user
(profiler.jvm.run_jcmd) or, for agent loading, to the same client in a child switched to the JVM's user.
"""

from __future__ import annotations

import bisect
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import CapabilityError
from ..scope import jvm

AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_NAME = "libperfmap_agent.so"
_SIGQUIT_BIT = 1 << (signal.SIGQUIT - 1)


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


def perf_map_paths(pid: int) -> list[Path]:
    """Where the map of ``pid`` can be: the JVM's own /tmp (its mount namespace), then ours."""
    ns_pid = _namespace_pid(pid)
    paths = [Path(f"/proc/{pid}/root/tmp/perf-{ns_pid}.map"), Path(f"/tmp/perf-{pid}.map")]
    return paths


def read_perf_map(pid: int) -> PerfMap | None:
    for path in perf_map_paths(pid):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return parse_perf_map(handle)
        except OSError:
            continue
    return None


# ---------------------------------------------------------------- the attach protocol


class AttachError(CapabilityError):
    """The JVM could not be attached to (not ready yet, attach disabled, or credentials refused)."""


def _namespace_pid(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid


def _catches_sigquit(pid: int) -> bool:
    """SIGQUIT would kill a JVM that has no handler yet (starting) or never installs one (-Xrs)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & _SIGQUIT_BIT)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _socket_path(pid: int) -> Path:
    return Path(f"/proc/{pid}/root/tmp/.java_pid{_namespace_pid(pid)}")


def _start_attach_listener(pid: int, timeout: float) -> Path:
    sock = _socket_path(pid)
    if sock.exists():
        return sock
    if not _catches_sigquit(pid):
        raise AttachError(f"pid {pid}: the JVM does not handle SIGQUIT yet (starting, or run with -Xrs); retry later")
    stat = os.stat(f"/proc/{pid}")
    ns_pid = _namespace_pid(pid)
    trigger = None
    for candidate in (Path(f"/proc/{pid}/cwd/.attach_pid{ns_pid}"), Path(f"/proc/{pid}/root/tmp/.attach_pid{ns_pid}")):
        try:
            candidate.touch(mode=0o600)
            os.chown(candidate, stat.st_uid, stat.st_gid)  # JDK 8 only honours its own user's trigger file
            trigger = candidate
            break
        except OSError:
            continue
    if trigger is None:
        raise AttachError(f"pid {pid}: cannot create the attach trigger file in its working directory or /tmp")
    try:
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while not sock.exists():
            if time.monotonic() > deadline:
                raise AttachError(f"pid {pid}: no attach socket after {timeout:.0f} s (-XX:+DisableAttachMechanism?)")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    finally:
        try:
            trigger.unlink()
        except OSError:
            pass
    return sock


def attach_command(pid: int, command: str, *args: str, timeout: float = 30.0) -> tuple[int, str]:
    """Send one attach command; returns (status, output). Status 0 means the JVM ran it."""
    if len(args) > 3:
        raise ValueError("the attach protocol carries at most 3 arguments")
    sock_path = _start_attach_listener(pid, min(timeout, 10.0))
    request = b"1\0" + command.encode() + b"\0" + b"".join(a.encode() + b"\0" for a in (*args, "", "", "")[:3])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            try:
                conn.connect(str(sock_path))
            except ConnectionRefusedError:
                # Nobody listens: the file of a JVM killed before it could remove it, whose pid this one
                # reuses. Removed, the JVM is asked to start its listener like the first time.
                sock_path.unlink(missing_ok=True)
                sock_path = _start_attach_listener(pid, min(timeout, 10.0))
                conn.connect(str(sock_path))
            conn.sendall(request)
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise AttachError(f"pid {pid}: attach socket {sock_path}: {exc}") from None
    reply = b"".join(chunks).decode("utf-8", "replace")
    head, _, output = reply.partition("\n")
    if not head.strip().lstrip("-").isdigit():
        # The JVM closes the connection without a word when it refuses the peer's credentials.
        raise AttachError(f"pid {pid}: the JVM refused the attach request (peer credentials?)")
    return int(head), output


# ---------------------------------------------------------------- dumping and the agent


@dataclass(frozen=True)
class PerfMapResult:
    """What one attempt to produce a perf map did."""

    pid: int
    ok: bool
    method: str  # "attach", "jcmd", "agent"
    detail: str = ""
    seconds: float = 0.0


def dump_perf_map(pid: int, timeout: float = 30.0) -> PerfMapResult:
    """``Compiler.perfmap`` (JDK 17+): attach client first, ``jcmd`` as the JVM's user if refused."""
    began = time.monotonic()
    try:
        status, output = attach_command(pid, "jcmd", "Compiler.perfmap", timeout=timeout)
        ok = status == 0 and not re.search(r"Unknown diagnostic command|Exception|[Ee]rror", output[:500])
        return PerfMapResult(pid, ok, "attach", output.strip()[:300], time.monotonic() - began)
    except AttachError as exc:
        if not os.path.exists(f"/proc/{pid}") or "SIGQUIT" in exc.message:
            return PerfMapResult(pid, False, "attach", exc.message, time.monotonic() - began)
        attach_failure = exc.message
    try:
        done = jvm.run_jcmd(pid, "Compiler.perfmap", timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return PerfMapResult(pid, False, "jcmd", f"{attach_failure}; jcmd: {exc}", time.monotonic() - began)
    output = (done.stdout + done.stderr).strip()
    ok = done.returncode == 0 and "Command executed successfully" in output
    return PerfMapResult(pid, ok, "jcmd", output[:200], time.monotonic() - began)


def agent_path() -> Path:
    return AGENT_DIR / AGENT_NAME


def build_agent(java_home: str | None = None) -> Path:
    """Build the JVMTI agent with gcc against the JDK's jvmti.h (scripts/setup.sh does this at install)."""
    env = dict(os.environ)
    if java_home:
        env["JAVA_HOME"] = java_home
    done = subprocess.run(["make", "-s", "-C", str(AGENT_DIR)], capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0 or not agent_path().exists():
        raise CapabilityError(
            f"{AGENT_DIR}/Makefile: building the perf-map agent failed ({done.stderr.strip()[:200]}); "
            "install build-essential and a JDK (openjdk-17-jdk-headless), then run make -C profiler/symbols/agent"
        )
    return agent_path()


def _copy_agent_into(pid: int, agent: Path) -> tuple[Path, str]:
    """Copy the agent into the JVM's /tmp so its user and mount namespace can open it.

    Returns (host path, path as the JVM sees it).
    """
    tmp_dir = Path(f"/proc/{pid}/root/tmp")
    fd, host_path = tempfile.mkstemp(prefix=".spe-perfmap-agent-", suffix=".so", dir=tmp_dir)
    with os.fdopen(fd, "wb") as out, open(agent, "rb") as src:
        shutil.copyfileobj(src, out)
    os.chmod(host_path, 0o644)
    return Path(host_path), "/tmp/" + Path(host_path).name


def load_agent(pid: int, agent: Path | None = None, options: str = "", timeout: float = 30.0) -> PerfMapResult:
    """Load the perf-map agent into a running JVM (JDK 8+); the agent then keeps the map current."""
    began = time.monotonic()
    agent = agent or agent_path()
    if not agent.exists():
        raise CapabilityError(f"{agent}: perf-map agent not built; run make -C {AGENT_DIR}")
    host_path, jvm_path = _copy_agent_into(pid, agent)
    try:
        try:
            status, output = attach_command(pid, "load", jvm_path, "true", options, timeout=timeout)
            method = "attach"
        except AttachError as exc:
            if not os.path.exists(f"/proc/{pid}") or "SIGQUIT" in exc.message:
                return PerfMapResult(pid, False, "agent", exc.message, time.monotonic() - began)
            status, output = _attach_as_owner(pid, "load", [jvm_path, "true", options], timeout)
            method = "attach-as-owner"
    finally:
        try:
            host_path.unlink()  # the JVM has it mapped (or failed); nothing else needs the copy
        except OSError:
            pass
    # JDK 9+ answer "0\nreturn code: N"; JDK 8 answers "0\nN" with the agent's return value.
    match = re.search(r"return code:\s*(-?\d+)", output) or re.match(r"\s*(-?\d+)", output)
    agent_status = int(match.group(1)) if match else status
    ok = status == 0 and agent_status == 0
    return PerfMapResult(pid, ok, "agent", f"{method}: {output.strip()[:200]}", time.monotonic() - began)


def _attach_as_owner(pid: int, command: str, args: list[str], timeout: float) -> tuple[int, str]:
    """Send the request as the JVM's user (JDK 8 refuses any other peer, root included).

    A forked child switches to the JVM's uid/gid, talks to the socket and reports through a pipe: no
    program has to be executable by that user, and the parent's credentials never change (setuid in a
    threaded process would change them for every thread).
    """
    stat = os.stat(f"/proc/{pid}")
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(stat.st_gid)
            os.setuid(stat.st_uid)
            status, output = attach_command(pid, command, *args, timeout=timeout)
            payload, code = f"{status}\n{output}".encode(), 0
        except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
            payload = f"error\n{exc}".encode()
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view):]
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + timeout + 5
    try:
        with os.fdopen(read_fd, "rb") as pipe:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([pipe], [], [], 0.5)
                if ready:
                    chunk = os.read(pipe.fileno(), 65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
    finally:
        if not chunks or time.monotonic() >= deadline:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(child, 0)
    head, _, output = b"".join(chunks).decode("utf-8", "replace").partition("\n")
    if not head.strip().lstrip("-").isdigit():
        raise AttachError(f"pid {pid}: attach as uid {stat.st_uid} failed: {output.strip()[:200] or 'no answer'}")
    return int(head), output


def _main(argv: list[str]) -> int:
    """``python -m profiler.perfmap PID COMMAND [ARG...]``: one attach request, printed as status, output."""
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
