"""HotSpot's dynamic attach protocol, spoken directly (about a millisecond of CPU; ``jcmd`` starts a whole
JVM): trigger file + SIGQUIT, then ``1\\0<cmd>\\0<arg>\\0<arg>\\0<arg>\\0`` on the ``.java_pid<nspid>``
socket. Every file of the target's is created, removed and opened through profiler.files.safeio, as the
JVM's user and without following its links (docs/security.md).

Used by the symbols room (perf-map dumps, the JVMTI agent) and by the thread watcher (Thread.print).
May import: profiler.files, profiler.errors and the standard library.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import threading
import time

from ..errors import CapabilityError
from ..files import procread, safeio

_SIGQUIT_BIT = 1 << (signal.SIGQUIT - 1)
ATTACH_REPLY_MAX_BYTES = 8 << 20  # a thread dump of thousands of threads is a few MB


class AttachError(CapabilityError):
    """The JVM could not be attached to (not ready yet, attach disabled, or credentials refused)."""


def namespace_pid(pid: int) -> int:
    nspids = (procread.status_field(pid, "NSpid") or "").split()
    return int(nspids[-1]) if nspids and nspids[-1].isascii() and nspids[-1].isdigit() else pid


def _catches_sigquit(pid: int) -> bool:
    """SIGQUIT would kill a JVM that has no handler yet (starting) or never installs one (-Xrs)."""
    try:
        return bool(int(procread.status_field(pid, "SigCgt") or "0", 16) & _SIGQUIT_BIT)
    except ValueError:
        return False


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``, opened before the checks that judge it: the signal later goes to that very
    process, not to whoever holds the pid by then. None without pidfds (Linux < 5.3)."""
    try:
        return os.pidfd_open(pid)
    except AttributeError:
        return None
    except ProcessLookupError:
        raise AttachError(f"pid {pid}: the process is gone") from None
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return None
        raise AttachError(f"pid {pid}: pidfd_open: {exc.strerror}") from None


def _send_sigquit(pid: int, pidfd: int | None) -> None:
    """SIGQUIT to the process the checks were made on (its pidfd): a process that exited since, its pid
    perhaps reused, gets nothing (AttachError)."""
    try:
        if pidfd is None:
            os.kill(pid, signal.SIGQUIT)
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGQUIT)
    except ProcessLookupError:
        raise AttachError(f"pid {pid}: the process exited before SIGQUIT; not signalled") from None


def _socket_file(pid: int) -> str:
    return f"/tmp/.java_pid{namespace_pid(pid)}"


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
    trigger = f".attach_pid{namespace_pid(pid)}"
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
    pidfd = _open_pidfd(pid)  # before the SigCgt check: the process checked is the one signalled
    try:
        return _signal_listener(pid, pidfd, timeout)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _signal_listener(pid: int, pidfd: int | None, timeout: float) -> int:
    if not _catches_sigquit(pid):
        raise AttachError(f"pid {pid}: the JVM does not handle SIGQUIT yet (starting, or run with -Xrs); retry later")
    created = _create_trigger(pid)
    try:
        _send_sigquit(pid, pidfd)
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
