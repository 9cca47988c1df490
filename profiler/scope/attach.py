"""HotSpot's dynamic attach protocol, spoken directly (about a millisecond of CPU; ``jcmd`` starts a whole
JVM): trigger file + SIGQUIT, then ``1\\0<cmd>\\0<arg>\\0<arg>\\0<arg>\\0`` on the ``.java_pid<nspid>``
socket. Every file of the target's is created, removed and opened through profiler.files.safeio, as the
JVM's user and without following its links (docs/security.md).

A JVM that refuses root as its peer (JDK 8 answers only its own user) is asked again from a forked
child that entered all of the JVM's namespaces (user when it differs, mount and its root, pid, net, ipc,
uts: one ``setns`` on a pidfd) and became the JVM's user with no capabilities and no_new_privs. No
program of the target's (its image's ``jcmd``) is ever run. The whole request, connect to last byte, has
one deadline; the child is killed with its process group at it (profiler.files.subproc).

Used by the symbols room (perf-map dumps, the JVMTI agent) and by the thread watcher (Thread.print).
May import: profiler.files, profiler.errors and the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import stat
import struct
import threading
import time

from ..errors import CapabilityError
from ..files import procread, safeio, subproc
from ..files.procread import namespace_pid

_SIGQUIT_BIT = 1 << (signal.SIGQUIT - 1)
ATTACH_REPLY_MAX_BYTES = 8 << 20  # a thread dump of thousands of threads is a few MB


class AttachError(CapabilityError):
    """The JVM could not be attached to (not ready yet, attach disabled, or credentials refused)."""


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


def _exchange_from_host(pid: int, request: bytes, deadline: float) -> bytes:
    """The JVM's reply to ``request`` sent by root from the host, through its socket under
    /proc/PID/root (at most ATTACH_REPLY_MAX_BYTES: the rest of a flood is never read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.settimeout(_remaining(pid, deadline))
            _connect(conn, pid, _remaining(pid, deadline))
            return _send_and_read(conn, pid, request, deadline)
        except OSError as exc:
            raise AttachError(f"pid {pid}: attach socket {_socket_file(pid)}: {exc}") from None


def _remaining(pid: int, deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"pid {pid}: no complete attach reply before the deadline")
    return remaining


def _send_and_read(conn: socket.socket, pid: int, request: bytes, deadline: float) -> bytes:
    """Send the request and read the reply, every wait bounded by the one deadline of the request. A JVM
    that refuses the peer closes before it reads the request: the reset that follows is an empty reply."""
    reply = bytearray()
    try:
        conn.settimeout(_remaining(pid, deadline))
        conn.sendall(request)
        while len(reply) < ATTACH_REPLY_MAX_BYTES:
            conn.settimeout(_remaining(pid, deadline))
            chunk = conn.recv(min(65536, ATTACH_REPLY_MAX_BYTES - len(reply)))
            if not chunk:
                break
            reply += chunk
    except (ConnectionResetError, BrokenPipeError):
        if reply:
            raise
    return bytes(reply)


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


# ---------------------------------------------------------------- as the JVM's user, in its namespaces

_CLONE_NEWUSER, _CLONE_NEWNS, _CLONE_NEWPID = 0x10000000, 0x00020000, 0x20000000
_CLONE_NEWNET, _CLONE_NEWIPC, _CLONE_NEWUTS = 0x40000000, 0x08000000, 0x04000000
# user first: with it, the others are entered with the rights root has in the JVM's user namespace
_NAMESPACES = (
    ("user", _CLONE_NEWUSER), ("mnt", _CLONE_NEWNS), ("pid", _CLONE_NEWPID), ("net", _CLONE_NEWNET),
    ("ipc", _CLONE_NEWIPC), ("uts", _CLONE_NEWUTS),
)  # fmt: skip
_ID_MAP_MAX_BYTES = 64 << 10
_CAPABILITY_V3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def _owner_uid(pid: int) -> int:
    try:
        return safeio.owner(pid)[0]
    except OSError:
        return 0  # gone: nothing to ask again


def namespaces_to_enter(pid: int) -> int:
    """The CLONE_NEW* flags of every namespace of ``pid`` (of those attach needs) that is not ours."""
    flags = 0
    for name, flag in _NAMESPACES:
        theirs, ours = os.stat(f"/proc/{pid}/ns/{name}"), os.stat(f"/proc/self/ns/{name}")
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            flags |= flag
    return flags


def id_inside(pid: int, kind: str, host_id: int) -> int | None:
    """``host_id`` as the user namespace of ``pid`` sees it (``kind``: "uid" or "gid"); None if unmapped."""
    fd = os.open(f"/proc/{pid}/{kind}_map", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.read(fd, _ID_MAP_MAX_BYTES).decode("ascii", "replace")
    finally:
        os.close(fd)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(field.isdigit() for field in fields):
            inside, outside, count = map(int, fields)
            if outside <= host_id < outside + count:
                return inside + host_id - outside
    return None


def _enter_and_drop(pidfd: int, root_fd: int, flags: int, uid: int, gid: int) -> None:
    """In the forked child: no supplementary group, every namespace in ``flags`` entered at once, the
    JVM's root, then its uid/gid (as its user namespace numbers them), no capability, no_new_privs."""
    os.setgroups([])  # before the user namespace: root's groups must not come along
    if flags and _libc.setns(pidfd, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns into the JVM's namespaces: {os.strerror(code)}")
    os.close(pidfd)
    os.fchdir(root_fd)
    os.chroot(".")
    os.chdir("/")
    os.close(root_fd)
    os.setgid(gid)
    os.setuid(uid)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_V3, 0)
    nothing = (ctypes.c_uint32 * 6)()
    if _libc.capset(header, nothing) != 0:  # setuid keeps them when root of the host is not the namespace's
        code = ctypes.get_errno()
        raise OSError(code, f"dropping capabilities: {os.strerror(code)}")
    if _libc.prctl(safeio.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs refused")


def _exchange_inside(pid: int, uid: int, socket_path: str, request: bytes, deadline: float) -> bytes:
    """In the child, as the JVM's user in its namespaces: its socket (a link or anything but its user's
    socket refused), the request, the reply. What it reaches it reaches with the JVM's user's rights only."""
    fd = os.open(socket_path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(errno.EPERM, f"{socket_path}: a symbolic link, not the JVM's socket")
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid not in (uid, 0):
        raise PermissionError(errno.EPERM, f"{socket_path}: not a socket of the JVM's user")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(_remaining(pid, deadline))
        conn.connect(socket_path)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid = struct.unpack("3i", creds)[0]  # in our pid namespace (the host's: setns moves children only)
        if peer_pid != pid:
            raise PermissionError(errno.EPERM, f"{socket_path} is served by pid {peer_pid}, not the JVM")
        return _send_and_read(conn, pid, request, deadline)


def exchange_as_target(pid: int, request: bytes, deadline: float) -> bytes:
    """The reply to ``request`` from a forked child that entered every namespace of the JVM (user when it
    differs, mount and root, pid, net, ipc, uts) and became its user without capabilities: for a JVM
    that answers only its own user (JDK 8). The JVM's listener is started first if needed (as for root:
    the trigger file made as its user, the socket checked from the host). AttachError (naming why) when
    that cannot be done."""
    try:
        os.close(_start_attach_listener(pid, min(_remaining(pid, deadline), 10.0)))
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise AttachError(f"pid {pid}: {exc.strerror}; not attached") from None
    root_fd = -1
    try:
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        host_uid, host_gid = safeio.owner(pid)
        flags = namespaces_to_enter(pid)
        uid, gid = host_uid, host_gid
        if flags & _CLONE_NEWUSER:
            inside_uid, inside_gid = id_inside(pid, "uid", host_uid), id_inside(pid, "gid", host_gid)
            if inside_uid is None or inside_gid is None:
                raise AttachError(f"pid {pid}: its user namespace maps no id for uid {host_uid}; not attached")
            uid, gid = inside_uid, inside_gid
        signal.pidfd_send_signal(pidfd, 0)  # still the process the fds above were opened for
        socket_path = _socket_file(pid)

        def enter() -> None:
            _enter_and_drop(pidfd, root_fd, flags, uid, gid)

        def exchange() -> bytes:
            return _exchange_inside(pid, uid, socket_path, request, deadline)

        return subproc.fork_call(
            exchange, _remaining(pid, deadline), setup=enter, keep_fds=[pidfd, root_fd],
            max_bytes=ATTACH_REPLY_MAX_BYTES + 64,
        )  # fmt: skip
    except AttachError:
        raise
    except OSError as exc:
        raise AttachError(f"pid {pid}: attach as its user inside its namespaces failed: {str(exc)[:200]}") from None
    finally:
        os.close(pidfd)
        if root_fd >= 0:
            os.close(root_fd)


def attach_command(pid: int, command: str, *args: str, timeout: float = 30.0) -> tuple[int, str]:
    """Send one attach command; returns (status, output). Status 0 means the JVM ran it. The whole of it
    takes at most ``timeout`` seconds; a JVM that closes on root without a word is asked again as its
    own user from inside its namespaces (``exchange_as_target``)."""
    if len(args) > 3:
        raise ValueError("the attach protocol carries at most 3 arguments")
    request = b"1\0" + command.encode() + b"\0" + b"".join(a.encode() + b"\0" for a in (*args, "", "", "")[:3])
    deadline = time.monotonic() + timeout
    reply = _exchange_from_host(pid, request, deadline)
    if not reply and _owner_uid(pid) != 0:
        reply = exchange_as_target(pid, request, deadline)
    return parse_attach_reply(pid, reply)


ATTACH_STATUS_MAX = 11  # bytes of the status line: a 32-bit int and its sign ("0", "-1", "100")


def parse_attach_reply(pid: int, reply: bytes | bytearray) -> tuple[int, str]:
    """(status, output) of a JVM's attach reply: a decimal status line, then the command's output. The
    status line is bounded (an 8 MiB line of digits is no status: int() of it would raise ValueError);
    AttachError for anything that is not a reply."""
    head_bytes, _, body = reply.partition(b"\n")
    head = head_bytes[: ATTACH_STATUS_MAX + 1].decode("ascii", "replace").strip()
    digits = head[1:] if head.startswith("-") else head
    if len(head_bytes) > ATTACH_STATUS_MAX or not (digits.isascii() and digits.isdigit()):
        # The JVM closes the connection without a word when it refuses the peer's credentials.
        raise AttachError(f"pid {pid}: the JVM refused the attach request (peer credentials?)")
    return int(head), body.decode("utf-8", "replace")
