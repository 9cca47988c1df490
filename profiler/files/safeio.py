"""Root's only ways into another user's process: reads that a tenant cannot redirect, files created and
commands run with the tenant's own rights. Every module that touches a target's files goes through here.

The rules (docs/security.md): a path under ``/proc/PID/root`` is resolved inside that root (``openat2``
``RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS``), its last component is never a link, the file must be a
regular file of an expected owner and size, and nothing blocks (``O_NONBLOCK``: a FIFO is refused, never
waited on). Files placed in a target's directories are created by a forked child that switched to the
target's uid/gid (``O_CREAT|O_EXCL|O_NOFOLLOW``); nothing is chowned or chmodded by path. A refusal is
an ``UnsafeFile`` (an OSError, so callers that skip unreadable files skip it too) and a one-line warning
naming the PID and path that the run collects with ``take_warnings``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import subproc

SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall tables were unified)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
PR_SET_NO_NEW_PRIVS = 38
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_MAX_WARNINGS = 200


class UnsafeFile(OSError):
    """A target's file refused: a link, FIFO, device, socket, directory, a foreign owner or too large."""

    def __init__(self, pid: int, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"pid {pid}: {path}: {reason}; not read")
        self.pid, self.path, self.reason = pid, path, reason

    def __str__(self) -> str:
        return str(self.strerror)


class TargetError(OSError):
    """Work done as a target's user failed (the child's own error, or it did not answer in time)."""

    def __str__(self) -> str:
        return str(self.strerror)


# ---------------------------------------------------------------- warnings of the run

_warnings: list[str] = []
_warned: set[tuple[int, str]] = set()
_warnings_lock = threading.Lock()


def warn(pid: int, path: str, message: str) -> None:
    """Record one warning per (PID, path) for the run's end (bounded: a crafted host cannot flood it)."""
    with _warnings_lock:
        if (pid, path) in _warned or len(_warned) >= _MAX_WARNINGS:
            return
        _warned.add((pid, path))
        _warnings.append(message)


def take_warnings() -> list[str]:
    """The warnings recorded since the last call."""
    with _warnings_lock:
        taken = list(_warnings)
        _warnings.clear()
        _warned.clear()
    return taken


def _refuse(pid: int, path: str, reason: str) -> UnsafeFile:
    refusal = UnsafeFile(pid, path, reason)
    warn(pid, path, str(refusal))
    return refusal


# ---------------------------------------------------------------- openat2


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_missing = False


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2) through ctypes; OSError(ENOSYS) on kernels before 5.6."""
    how = _OpenHow(flags, mode if flags & os.O_CREAT else 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )  # fmt: skip
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def open_beneath(root_fd: int, root_path: str, path: str, flags: int, mode: int = 0) -> int:
    """``path`` (as the target sees it) opened inside the root ``root_fd``: links in the middle stay in
    that root, ``/proc`` magic links are refused. Without openat2 (kernels before 5.6), the path is
    opened through ``root_path`` with only the last component protected (``O_NOFOLLOW``)."""
    global _openat2_missing
    relative = path.lstrip("/") or "."
    if not _openat2_missing:
        try:
            return openat2(root_fd, relative, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _openat2_missing = True
    return os.open(f"{root_path}/{relative}", flags, mode)


def open_without_links(path: str, flags: int) -> int:
    """An absolute ``path`` opened with no symbolic link anywhere on it (RESOLVE_NO_SYMLINKS): for paths
    the kernel once gave us already resolved (a saved /proc/PID/maps), where a link found now was
    planted since. Without openat2 (kernels before 5.6) only the last component is protected."""
    global _openat2_missing
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    if not _openat2_missing:
        try:
            return openat2(_AT_FDCWD, path, flags | os.O_NOFOLLOW, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            _openat2_missing = True
    return os.open(path, flags | os.O_NOFOLLOW)


_AT_FDCWD = -100


def _root_fd(pid: int) -> int:
    return os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def owner(pid: int) -> tuple[int, int]:
    """(real uid, real gid) of a process: the rights everything done on its behalf gets. Not the owner of
    /proc/PID (the effective uid: a setuid-root program with a java-looking argv would pass for a root
    JVM); a process whose real and effective ids differ is refused (UnsafeFile, see procread.owner)."""
    from .procread import owner as real_owner  # procread builds on this module

    return real_owner(pid)


# ---------------------------------------------------------------- reads


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def check_regular(pid: int, path: str, fd: int, max_size: int, owners: Iterable[int] | None) -> os.stat_result:
    """fstat checks of an opened target file: a regular file, at most ``max_size`` bytes, owned by one of
    ``owners`` (None: any owner, for files the process itself has mapped). UnsafeFile otherwise."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "a directory or link")
        raise _refuse(pid, path, f"{kind}, not a regular file")
    if info.st_size > max_size:
        raise _refuse(pid, path, f"{info.st_size} bytes, over the limit of {max_size}")
    allowed = None if owners is None else set(owners)
    if allowed is not None and info.st_uid not in allowed:
        raise _refuse(pid, path, f"owned by uid {info.st_uid}, not by the process's user")
    return info


def open_in_root(
    pid: int, path: str, max_size: int, owners: Iterable[int] | None = None, subject: int | None = None
) -> int:
    """An fd of ``path`` under ``pid``'s root, checked (see ``check_regular``); the caller closes it.
    ``owners`` defaults to the process's own uid (what the process writes itself); ``subject`` is the
    PID a refusal names (default ``pid``: another when the file is read under our own root)."""
    shown = f"/proc/{pid}/root{path}"
    allowed = list(owners) if owners is not None else [owner(pid)[0]]
    named = pid if subject is None else subject
    try:
        fd = _open_under_root(pid, path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(named, shown, "a symbolic link (or leads through /proc)") from None
        if exc.errno == errno.EXDEV:
            raise _refuse(named, shown, "leads out of the process's root") from None
        raise
    return _checked(named, shown, fd, max_size, allowed)


def _open_under_root(pid: int, path: str, flags: int) -> int:
    root_fd = _root_fd(pid)
    try:
        return open_beneath(root_fd, f"/proc/{pid}/root", path, flags)
    finally:
        os.close(root_fd)


def _checked(pid: int, shown: str, fd: int, max_size: int, owners: Iterable[int] | None) -> int:
    """``fd`` once ``check_regular`` accepts it; closed otherwise."""
    try:
        check_regular(pid, shown, fd, max_size, owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir_in_root(pid: int, path: str) -> int:
    """An fd of the directory ``path`` under ``pid``'s root (for os.listdir), resolved inside that root."""
    return _open_under_root(pid, path, _READ_FLAGS | os.O_DIRECTORY)


def read_fd(fd: int, max_size: int) -> bytes:
    """At most ``max_size`` bytes from the start of ``fd`` (a file may grow after its fstat)."""
    chunks, total = [], 0
    while total < max_size:
        chunk = os.pread(fd, min(1 << 20, max_size - total), total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_in_root(
    pid: int, path: str, max_size: int, owners: Iterable[int] | None = None, subject: int | None = None
) -> bytes:
    """The content of ``path`` under ``pid``'s root, through ``open_in_root``'s checks."""
    fd = open_in_root(pid, path, max_size, owners, subject)
    try:
        return read_fd(fd, max_size)
    finally:
        os.close(fd)


ELF_MAX_BYTES = 2 << 30  # the largest shared object we parse headers of (libjvm.so: about 25 MB)


# A mapped file on a file system served by a process (FUSE: any user with fusermount can make one) can hold
# a stat, an open or any read for as long as its server likes, in the kernel, where no timeout reaches.
# So every touch of a mapped file (stat, open, fstat, fstatfs) runs in a worker thread the caller waits
# for at most MAP_FILE_DEADLINE; a worker still waiting then is left behind (a daemon thread; the kernel
# ends its wait when the agent exits), the file refused with one warning, and the process (and the
# mapping's device, when the caller knows it) marked slow: its other mapped files are refused at once.
# A file that did answer but lives on FUSE is refused too: its reads come later, on the caller's thread,
# without a deadline. Past MAP_FILE_STUCK_MAX workers left behind, no mapped file is touched any more.
MAP_FILE_DEADLINE = 2.0  # seconds; a local file answers in microseconds, a cold disk in milliseconds
MAP_FILE_STUCK_MAX = 16  # workers left waiting on a file system that never answered
FUSE_SUPER_MAGIC = 0x65735546  # statfs(2): fuse and fuseblk
_slow_pids: set[int] = set()
_slow_devices: set[str] = set()
_stuck = 0
_slow_lock = threading.Lock()


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 112)]  # struct statfs: 120 bytes


def _fs_type(fd: int) -> int | None:
    """statfs's f_type of an open file (None when the call fails)."""
    buffer = _StatFs()
    if ctypes.CDLL(None, use_errno=True).fstatfs(fd, ctypes.byref(buffer)) != 0:
        return None
    return int(buffer.f_type) & 0xFFFFFFFF


def _stat(path: str) -> os.stat_result:  # the calls a worker makes, one place (tests replace them)
    return os.stat(path)


def _open(path: str, flags: int) -> int:
    return os.open(path, flags)


def _within_deadline(pid: int, shown: str, device: str | None, work: Callable[[], object]) -> object:
    """``work()``'s result, done in a worker thread within MAP_FILE_DEADLINE; UnsafeFile when the process
    or device is already known slow or the worker did not answer in time. An fd the worker opens after
    the caller gave up is closed by the worker."""
    global _stuck
    with _slow_lock:
        if _stuck >= MAP_FILE_STUCK_MAX:
            raise _refuse(pid, shown, f"{_stuck} mapped files of the host never answered (MAP_FILE_STUCK_MAX)")
        if pid in _slow_pids or (device is not None and device in _slow_devices):
            raise _refuse(pid, shown, "a mapped file of this process or device did not answer before")
    answer: list[tuple[bool, object]] = []
    done = threading.Event()
    lock = threading.Lock()
    abandoned = False

    def run() -> None:
        try:
            outcome: tuple[bool, object] = (True, work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome = (False, exc)
        with lock:
            if abandoned and outcome[0] and isinstance(outcome[1], tuple) and isinstance(outcome[1][0], int):
                os.close(outcome[1][0])  # the caller is gone: nobody else will close it
            answer.append(outcome)
        done.set()

    threading.Thread(target=run, name=f"map-file-{pid}", daemon=True).start()
    done.wait(MAP_FILE_DEADLINE)
    with lock:
        if not answer:
            abandoned = True
    if abandoned:
        with _slow_lock:
            _stuck += 1
            _slow_pids.add(pid)
            if device is not None:
                _slow_devices.add(device)
        raise _refuse(pid, shown, f"no answer within {MAP_FILE_DEADLINE:g} s (a file system that blocks: FUSE?)")
    ok, value = answer[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value


def _not_fuse(pid: int, shown: str, fd: int) -> None:
    if _fs_type(fd) == FUSE_SUPER_MAGIC:
        os.close(fd)
        raise _refuse(pid, shown, "on a FUSE file system (its server may hold every read)")


def stat_map_file(pid: int, start: int, end: int, device: str | None = None) -> os.stat_result:
    """stat of the file ``pid`` maps at [start, end) through /proc/PID/map_files, within MAP_FILE_DEADLINE
    (``device``: the maps line's major:minor, to refuse at once the next file of a device that blocked)."""
    shown = f"/proc/{pid}/map_files/{start:x}-{end:x}"
    found = _within_deadline(pid, shown, device, lambda: _stat(shown))
    assert isinstance(found, os.stat_result)
    return found


def open_mapped(pid: int, start: int, end: int, path: str, max_size: int = ELF_MAX_BYTES) -> int:
    """The file ``pid`` maps at [start, end): through /proc/PID/map_files (the mapped inode itself,
    whatever its path now leads to), else through its path under the process's root (owner: anyone,
    the file is the process's own mapping). Within MAP_FILE_DEADLINE, never on FUSE."""
    shown = f"/proc/{pid}/map_files/{start:x}-{end:x}"

    def work() -> tuple[int, str]:
        try:
            fd, opened = _open(shown, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), shown
        except OSError:
            fd, opened = _open_under_root(pid, path, _READ_FLAGS), f"/proc/{pid}/root{path}"
        _not_fuse(pid, opened, fd)
        return fd, opened

    found = _within_deadline(pid, shown, None, work)
    assert isinstance(found, tuple)
    fd, opened = found
    return _checked(pid, opened, fd, max_size, None)


def open_map_file(
    pid: int, start: int, end: int, max_size: int = ELF_MAX_BYTES, device: str | None = None
) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the file ``pid`` maps at [start, end), through /proc/PID/map_files only: the kernel's
    link to the mapped inode itself, whatever its path says now (deleted, replaced by a FIFO, an absolute
    link inside a container). Never by path. The inode is stat'ed before it is opened, so a device is never
    opened; a regular file of at most ``max_size`` bytes (``check_regular``), opened non-blocking, not on
    FUSE; the whole within MAP_FILE_DEADLINE (``device`` as for ``stat_map_file``)."""
    shown = f"/proc/{pid}/map_files/{start:x}-{end:x}"

    def work() -> tuple[int, os.stat_result]:
        before = _stat(shown)
        if not stat.S_ISREG(before.st_mode):
            kind = _KINDS.get(stat.S_IFMT(before.st_mode), "a directory or link")
            raise _refuse(pid, shown, f"{kind}, not a regular file")
        fd = _open(shown, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            info = check_regular(pid, shown, fd, max_size, None)
            if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
                raise _refuse(pid, shown, "another file than the one mapped")
        except BaseException:
            os.close(fd)
            raise
        _not_fuse(pid, shown, fd)
        return fd, info

    found = _within_deadline(pid, shown, device, work)
    assert isinstance(found, tuple)
    return found


def forget_slow_files() -> None:
    """A new run: the processes and devices found slow by the last one are tried again (workers still
    left waiting keep counting towards MAP_FILE_STUCK_MAX)."""
    with _slow_lock:
        _slow_pids.clear()
        _slow_devices.clear()


@dataclass
class BoundedReader:
    """Reads of a file at offsets that must lie inside it, each at most ``max_read`` bytes: a crafted
    header (a section of 2**60 bytes) raises ValueError instead of allocating its size."""

    fd: int
    size: int
    max_read: int = 64 << 20

    @classmethod
    def of(cls, fd: int) -> BoundedReader:
        return cls(fd, os.fstat(fd).st_size)

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or size > self.max_read or offset + size > self.size:
            raise ValueError(f"read of {size} bytes at {offset} outside the file ({self.size} bytes)")
        return os.pread(self.fd, size, offset)


# ---------------------------------------------------------------- as the target's user


def _drop_to(uid: int, gid: int) -> None:
    """In a child: the target's uid/gid, no supplementary groups, no capabilities (setuid from root to
    another uid clears them), and no way back through a setuid binary. A child of a child that already
    is that user (the JDK 8 route attaches as the JVM's user) keeps its credentials."""
    if os.geteuid() != 0 and (os.geteuid(), os.getegid()) == (uid, gid):
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def no_new_privs() -> None:
    """A ``preexec_fn``: no program started from here gains rights through setuid bits or file caps."""
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def demote_to(uid: int, gid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that runs a program with the target's rights (see ``_drop_to``)."""
    return lambda: _drop_to(uid, gid)


def run_as(uid: int, gid: int, work: Callable[[], bytes], timeout: float) -> bytes:
    """``work()`` in a forked child switched to ``uid``/``gid``; its bytes come back through a pipe.

    The parent's credentials never change (setuid in a threaded process would change them for every
    thread); the child has its own process group, a parent-death signal, and is killed at ``timeout``
    (subproc.fork_call). TargetError on failure."""
    try:
        return subproc.fork_call(work, timeout, setup=lambda: _drop_to(uid, gid))
    except subproc.ChildError as exc:
        raise TargetError(exc.errno or errno.EPERM, f"as uid {uid}: {exc.strerror}") from None


def _dir_fd(pid: int, where: str) -> tuple[int, str]:
    """(O_PATH fd, shown path) of the process's working directory or root, opened by root: the kernel's
    record of them, which no link of the tenant's can redirect."""
    name = "cwd" if where == "cwd" else "root"
    return os.open(f"/proc/{pid}/{name}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), f"/proc/{pid}/{name}"


def _in_directory(dir_fd: int, path: str, action: Callable[[int, str], None]) -> None:
    """``action(parent_fd, leaf)`` for ``path`` under ``dir_fd`` (parents resolved inside it)."""
    parent, _, leaf = path.strip("/").rpartition("/")
    parent_fd = openat2(
        dir_fd, parent or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
    )
    try:
        action(parent_fd, leaf)
    finally:
        os.close(parent_fd)


def create_as_target(pid: int, where: str, path: str, content: bytes, mode: int = 0o600, timeout: float = 10.0) -> str:
    """Create ``path`` (relative to the process's ``cwd`` or ``root``) as the process's user, with
    ``O_CREAT|O_EXCL|O_NOFOLLOW``: an existing file or link there is an error, never followed.
    Returns the path as shown in messages."""
    uid, gid = owner(pid)
    dir_fd, shown = _dir_fd(pid, where)

    def create(parent_fd: int, leaf: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(leaf, flags, mode, dir_fd=parent_fd)
        try:
            subproc.write_all(fd, content)
        finally:
            os.close(fd)

    def work() -> bytes:
        _in_directory(dir_fd, path, create)
        return b""

    try:
        run_as(uid, gid, work, timeout)
    finally:
        os.close(dir_fd)
    return f"{shown}/{path.strip('/')}"


def remove_as_target(pid: int, where: str, path: str, timeout: float = 10.0) -> None:
    """Unlink ``path`` (relative to the process's ``cwd`` or ``root``) as the process's user."""
    uid, gid = owner(pid)
    dir_fd, _ = _dir_fd(pid, where)

    def work() -> bytes:
        _in_directory(dir_fd, path, lambda parent_fd, leaf: os.unlink(leaf, dir_fd=parent_fd))
        return b""

    try:
        run_as(uid, gid, work, timeout)
    finally:
        os.close(dir_fd)


def socket_in_root(pid: int, path: str) -> int:
    """An O_PATH fd of the UNIX socket ``path`` under ``pid``'s root, owned by the process's user (or
    root); connect to ``/proc/self/fd/<fd>``. A link or anything but a socket is an UnsafeFile."""
    shown = f"/proc/{pid}/root{path}"
    fd = _open_under_root(pid, path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    uid = owner(pid)[0]
    reason = None
    if stat.S_ISLNK(info.st_mode):
        reason = "a symbolic link, not the JVM's socket"
    elif not stat.S_ISSOCK(info.st_mode):
        reason = "not a socket"
    elif info.st_uid not in (uid, 0):
        reason = f"owned by uid {info.st_uid}, not by the process's user"
    if reason is not None:
        os.close(fd)
        raise _refuse(pid, shown, reason)
    return fd
