"""Java JIT symbols: write /tmp/perf-<pid>.map for a running JVM and read it back.

Two ways to get the map, both through HotSpot's dynamic attach mechanism:
- ``Compiler.perfmap`` (JDK 17+): a one-shot dump of the code cache; repeat it to catch code compiled
  since. Spelling: ``long com.example.CpuSplit.burnAlpha(long, long)``.
- our JVMTI agent (profiler/agent/perfmap_agent.c, any JDK from 8): loaded once, it appends every
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
import errno
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import jvm, safeio
from .errors import CapabilityError

AGENT_DIR = Path(__file__).resolve().parent / "agent"
AGENT_NAME = "libperfmap_agent.so"
_SIGQUIT_BIT = 1 << (signal.SIGQUIT - 1)
ATTACH_REPLY_MAX_BYTES = 8 << 20  # a thread dump of thousands of threads is a few MB


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
    return f"/tmp/perf-{_namespace_pid(pid)}.map"


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


def _socket_file(pid: int) -> str:
    return f"/tmp/.java_pid{_namespace_pid(pid)}"


def _open_socket(pid: int) -> int | None:
    """An O_PATH fd of the JVM's attach socket, None while there is none; AttachError when what is there
    is not the JVM's socket (a link planted by the process's user, a FIFO)."""
    try:
        return safeio.socket_in_root(pid, _socket_file(pid))
    except FileNotFoundError:
        return None
    except safeio.UnsafeFile as exc:
        raise AttachError(str(exc)) from None
    except OSError as exc:
        raise AttachError(f"pid {pid}: {_socket_file(pid)}: {exc.strerror}") from None


def _create_trigger(pid: int) -> tuple[str, str] | None:
    """The trigger file, created as the JVM's user (JDK 8 honours only its own user's), in its working
    directory, else its /tmp (HotSpot looks in both). Returns (where, path) for its removal, or None
    when one exists already (the user's own, or whatever the user put there: HotSpot judges it)."""
    trigger = f".attach_pid{_namespace_pid(pid)}"
    failures, exists = [], False
    for where, path in (("cwd", trigger), ("root", f"/tmp/{trigger}")):
        try:
            safeio.create_as_target(pid, where, path, b"")
            return where, path
        except OSError as exc:
            exists = exists or exc.errno == errno.EEXIST
            failures.append(f"{where}: {exc}")
    if exists:
        return None
    raise AttachError(f"pid {pid}: cannot create the attach trigger file ({'; '.join(failures)[:300]})")


_listener_locks: dict[int, threading.Lock] = {}
_listener_locks_guard = threading.Lock()


def _start_attach_listener(pid: int, timeout: float) -> int:
    """The fd of the JVM's attach socket, asking the JVM to open it (trigger file + SIGQUIT) if needed.

    One thread at a time per JVM (the perf-map worker and the thread-name seeder attach at once): a
    second SIGQUIT after the listener started would make the JVM print a thread dump to its stdout."""
    with _listener_locks_guard:
        lock = _listener_locks.setdefault(pid, threading.Lock())
    with lock:
        return _start_attach_listener_alone(pid, timeout)


def _start_attach_listener_alone(pid: int, timeout: float) -> int:
    sock = _open_socket(pid)
    if sock is not None:
        return sock
    if not _catches_sigquit(pid):
        raise AttachError(f"pid {pid}: the JVM does not handle SIGQUIT yet (starting, or run with -Xrs); retry later")
    created = _create_trigger(pid)
    try:
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while (sock := _open_socket(pid)) is None:
            if time.monotonic() > deadline:
                raise AttachError(f"pid {pid}: no attach socket after {timeout:.0f} s (-XX:+DisableAttachMechanism?)")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    finally:
        try:
            if created is not None:
                safeio.remove_as_target(pid, *created)
        except OSError:
            pass
    return sock


def _connect(conn: socket.socket, pid: int, timeout: float) -> None:
    """Connect to the JVM's socket, whose peer must be the JVM itself (SO_PEERCRED)."""
    sock = _start_attach_listener(pid, min(timeout, 10.0))
    try:
        try:
            conn.connect(f"/proc/self/fd/{sock}")
        except ConnectionRefusedError:
            # Nobody listens: the file of a JVM killed before it could remove it, whose pid this one
            # reuses. Removed (as the JVM's user), the JVM is asked to start its listener like the first time.
            os.close(sock)
            sock = -1
            safeio.remove_as_target(pid, "root", _socket_file(pid))
            sock = _start_attach_listener(pid, min(timeout, 10.0))
            conn.connect(f"/proc/self/fd/{sock}")
    finally:
        if sock >= 0:
            os.close(sock)
    peer_pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    if peer_pid != pid:
        raise AttachError(f"pid {pid}: {_socket_file(pid)} is served by pid {peer_pid}, not the JVM; not attached")


def attach_command(pid: int, command: str, *args: str, timeout: float = 30.0) -> tuple[int, str]:
    """Send one attach command; returns (status, output). Status 0 means the JVM ran it."""
    if len(args) > 3:
        raise ValueError("the attach protocol carries at most 3 arguments")
    request = b"1\0" + command.encode() + b"\0" + b"".join(a.encode() + b"\0" for a in (*args, "", "", "")[:3])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            _connect(conn, pid, timeout)
            conn.sendall(request)
            reply = bytearray()  # at most ATTACH_REPLY_MAX_BYTES: the rest of a flood is never read
            while len(reply) < ATTACH_REPLY_MAX_BYTES and (
                chunk := conn.recv(min(65536, ATTACH_REPLY_MAX_BYTES - len(reply)))
            ):
                reply += chunk
        except OSError as exc:
            raise AttachError(f"pid {pid}: attach socket {_socket_file(pid)}: {exc}") from None
    head_bytes, _, body = reply.partition(b"\n")
    del reply
    head, output = head_bytes.decode("ascii", "replace"), body.decode("utf-8", "replace")
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
            "install build-essential and a JDK (openjdk-17-jdk-headless), then run make -C profiler/agent"
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
            method = "attach"
        except AttachError as exc:
            if not os.path.exists(f"/proc/{pid}") or "SIGQUIT" in exc.message:
                return PerfMapResult(pid, False, "agent", exc.message, time.monotonic() - began)
            status, output = _attach_as_owner(pid, "load", [jvm_path, "true", options], timeout)
            method = "attach-as-owner"
    finally:
        _remove_agent_copy(pid, jvm_path)  # the JVM has it mapped (or failed); nothing else needs the copy
    # JDK 9+ answer "0\nreturn code: N"; JDK 8 answers "0\nN" with the agent's return value.
    match = re.search(r"return code:\s*(-?\d+)", output) or re.match(r"\s*(-?\d+)", output)
    agent_status = int(match.group(1)) if match else status
    ok = status == 0 and agent_status == 0
    return PerfMapResult(pid, ok, "agent", f"{method}: {output.strip()[:200]}", time.monotonic() - began)


def _attach_as_owner(pid: int, command: str, args: list[str], timeout: float) -> tuple[int, str]:
    """Send the request as the JVM's user (JDK 8 refuses any other peer, root included), from a forked
    child switched to that user (safeio.run_as): no program has to be executable by that user."""

    def work() -> bytes:
        status, output = attach_command(pid, command, *args, timeout=timeout)
        return f"{status}\n{output}".encode()

    try:
        uid, gid = safeio.owner(pid)
        answer = safeio.run_as(uid, gid, work, timeout + 5).decode("utf-8", "replace")
    except OSError as exc:
        raise AttachError(f"pid {pid}: attach as the JVM's user failed: {str(exc)[:200]}") from None
    head, _, output = answer.partition("\n")
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
