"""The one bounded reader of a target's /proc files: cmdline, environ, status, comm, maps and task lists.

Every one of these is the target's to size: any local user can make its command line or environment
gigabytes (PR_SET_MM_MAP), its maps tens of thousands of lines, its thread count tens of thousands. So
each file has a byte cap and, where it is a list, a line or entry cap (the constants below, sized for
real JVMs); long files are streamed, never read whole; nothing is opened through a link. A cap reached
is never a larger allocation: the caller gets what fits and a flag (``capped``), and the run gets one
warning line per process and file naming the cap (``safeio.warn``, collected with ``take_warnings``).
A process that vanishes mid-read is simply not there (None or empty), never an error.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from . import safeio

# A Spark executor's command line is 30-100 KB (its classpath); its environment about the same.
CMDLINE_MAX_BYTES = 1 << 20
ENVIRON_MAX_BYTES = 1 << 20
# status is ~1.5 KiB; a line longer than this (Groups of a user in thousands of groups) is skipped
STATUS_MAX_BYTES = 1 << 20
STATUS_MAX_LINES = 256
STATUS_LINE_MAX_BYTES = 4096
COMM_MAX_BYTES = 64  # TASK_COMM_LEN is 16
# A JVM maps a few thousand ranges (two per thread stack); a line is the fixed fields and a path
MAPS_MAX_MAPPINGS = 1 << 16  # lines (one a mapping) per process; vm.max_map_count's default is 65,530
MAPS_MAX_BYTES = 16 << 20  # a maps file read (65,530 mappings of ~100 bytes, ~250 for a JDK's paths)
MAPS_LINE_MAX_BYTES = 4096 + 256  # PATH_MAX after ~80 bytes of addresses, offset, device and inode
MAPS_LINE_HEAD = 128  # of an over-long line: its range, perms, offset, device and inode
MAPS_LINE_TAIL = 512  # and the end of its path (the file's name: at most 255 bytes and " (deleted)")
THREADS_MAX = 1 << 14  # per process: a JVM has hundreds to a few thousand threads

_CHUNK = 64 << 10
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class ProcRead:
    """The bytes read of one file; ``capped`` when the file went on past the cap (only its start kept)."""

    data: bytes
    capped: bool


def _shown(root: str, pid: int, name: str) -> str:
    return f"{root}/{pid}/{name}"


def cap_reached(pid: int, path: str, what: str, cap_name: str, cap: int) -> None:
    """The run's warning for a cap reached: one line per process and file."""
    safeio.warn(pid, path, f"pid {pid}: {path}: more than {cap} {what} ({cap_name}); only the first {cap} read")


def _open(root: str, pid: int, name: str) -> int | None:
    """An fd of /proc/PID/<name> opened without following any link; None when the process is gone."""
    try:
        return safeio.open_without_links(_shown(root, pid, name), _FLAGS)
    except OSError:  # gone (ENOENT, ESRCH), a link (ELOOP), not ours to read (EACCES)
        return None


def read_capped(pid: int, name: str, max_bytes: int, cap_name: str, root: str = "/proc") -> ProcRead | None:
    """At most ``max_bytes`` of /proc/PID/<name> (one byte more is asked for, to tell a file of exactly the
    cap from a longer one); None when the process is gone or the file unreadable."""
    fd = _open(root, pid, name)
    if fd is None:
        return None
    chunks: list[bytes] = []
    total = 0
    try:
        while total <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError:
        return None  # ESRCH: gone between open and read
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) <= max_bytes:
        return ProcRead(data, False)
    cap_reached(pid, _shown(root, pid, name), "bytes", cap_name, max_bytes)
    return ProcRead(data[:max_bytes], True)


@dataclass(frozen=True)
class Cmdline:
    args: tuple[str, ...]
    capped: bool  # the line went on past CMDLINE_MAX_BYTES: its last argument may be cut


def cmdline(pid: int, root: str = "/proc") -> Cmdline | None:
    """The command line's arguments; None for a kernel thread, a zombie or a process gone."""
    read = read_capped(pid, "cmdline", CMDLINE_MAX_BYTES, "CMDLINE_MAX_BYTES", root)
    if read is None or not read.data:
        return None
    parts = read.data.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return Cmdline(tuple(part.decode("utf-8", "surrogateescape") for part in parts), read.capped)


def environ(pid: int, names: Collection[str] | None = None, root: str = "/proc") -> dict[str, str]:
    """The environment (only ``names`` when given); empty when unreadable (another user's without
    privileges, a process gone). A variable cut by ENVIRON_MAX_BYTES is left out."""
    read = read_capped(pid, "environ", ENVIRON_MAX_BYTES, "ENVIRON_MAX_BYTES", root)
    if read is None:
        return {}
    entries = read.data.split(b"\0")
    if read.capped and entries:
        entries.pop()  # cut by the cap: neither its name nor its value can be trusted
    found: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.decode("utf-8", "replace").partition("=")
        if sep and (names is None or key in names):
            found[key] = value
    return found


def comm(pid: int, root: str = "/proc") -> str | None:
    read = read_capped(pid, "comm", COMM_MAX_BYTES, "COMM_MAX_BYTES", root)
    return None if read is None else read.data.decode("utf-8", "replace").rstrip("\n")


class Lines:
    """The lines of a /proc file, streamed: at most ``max_lines`` of at most ``max_line_bytes`` each,
    ``max_bytes`` in all. A longer line is skipped whole; a cap reached ends the iteration with
    ``capped`` set and the run's warning. Iterate once."""

    def __init__(
        self,
        pid: int,
        name: str,
        max_lines: int,
        max_line_bytes: int,
        max_bytes: int,
        cap_name: str,
        root: str = "/proc",
    ) -> None:
        self.pid, self.name, self.root = pid, name, root
        self.max_lines, self.max_line_bytes, self.max_bytes = max_lines, max_line_bytes, max_bytes
        self.cap_name = cap_name
        self.capped = False  # a cap was reached (lines, bytes, or a line skipped as too long)
        self.found = False  # the file could be opened

    def _cap(self, what: str, cap_name: str, cap: int) -> None:
        self.capped = True
        cap_reached(self.pid, _shown(self.root, self.pid, self.name), what, cap_name, cap)

    def __iter__(self) -> Iterator[str]:
        fd = _open(self.root, self.pid, self.name)
        if fd is None:
            return
        self.found = True
        try:
            yield from self._lines(fd)
        finally:
            os.close(fd)

    def _lines(self, fd: int) -> Iterator[str]:
        pending = b""  # the start of a line not ended yet (at most max_line_bytes)
        skipping = False  # inside a line already over max_line_bytes
        total = count = 0
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                return
            if not chunk:
                break
            total += len(chunk)
            pieces = chunk.split(b"\n")
            for index, piece in enumerate(pieces):
                ended = index < len(pieces) - 1
                if skipping:
                    skipping = not ended
                    continue
                if len(pending) + len(piece) > self.max_line_bytes:
                    pending, skipping = b"", not ended
                    self._cap("bytes in a line", f"{self.cap_name} line", self.max_line_bytes)
                    continue
                if not ended:
                    pending += piece
                    continue
                line, pending = pending + piece, b""
                if count >= self.max_lines:
                    self._cap("lines", f"{self.cap_name} lines", self.max_lines)
                    return
                count += 1
                yield line.decode("utf-8", "replace")
            if total > self.max_bytes:
                self._cap("bytes", f"{self.cap_name} bytes", self.max_bytes)
                return
        if pending and not skipping and count < self.max_lines:
            yield pending.decode("utf-8", "replace")


@dataclass(frozen=True)
class MapsLine:
    """One line of a maps file. ``whole`` False: a line over MAPS_LINE_MAX_BYTES, kept as its first
    MAPS_LINE_HEAD bytes, a space and its last MAPS_LINE_TAIL (its range and its file's name, not its path)."""

    text: bytes
    whole: bool


class Maps:
    """/proc/PID/maps streamed within its caps, for every reader of a target's mappings (the symbolizer,
    the thread-name uprobe, the checkpoint journal): at most MAPS_MAX_BYTES read, MAPS_MAX_MAPPINGS lines,
    each line at most MAPS_LINE_MAX_BYTES kept (a longer one: head and tail, each byte looked at a bounded
    number of times). Each cap reached is one warning naming it (``cap_reached``; the run keeps one a
    process and file). Iterating gives the whole lines as text; ``entries()`` gives every line with its
    ``whole`` flag. Iterate once.

    ``chunks`` replaces the file (pure: tests and the fuzz suite pass crafted bytes)."""

    def __init__(self, pid: int, root: str = "/proc", chunks: Iterable[bytes] | None = None) -> None:
        self.pid, self.root = pid, root
        self.path = _shown(root, pid, "maps")
        self._chunks = chunks
        self.found = chunks is not None  # the file could be opened
        self.capped = False  # a cap was reached: bytes, mappings, or a line kept as head and tail
        self.cut: str | None = None  # the cap that ended the read early (MAPS_MAX_BYTES, MAPS_MAX_MAPPINGS)
        self.long_lines = 0  # lines over MAPS_LINE_MAX_BYTES
        self.longest = 0  # bytes of the longest of them

    def __iter__(self) -> Iterator[str]:
        for entry in self.entries():
            if entry.whole:
                yield entry.text.decode("utf-8", "replace")

    def entries(self) -> Iterator[MapsLine]:
        if self._chunks is not None:
            yield from self._capped_lines(iter(self._chunks))
            return
        fd = _open(self.root, self.pid, "maps")
        if fd is None:
            return
        self.found = True
        try:
            yield from self._capped_lines(self._read(fd))
        finally:
            os.close(fd)

    def _read(self, fd: int) -> Iterator[bytes]:
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError:
                return  # ESRCH: gone between open and read
            if not chunk:
                return
            yield chunk

    def _cap(self, what: str, cap_name: str, cap: int) -> None:
        self.capped, self.cut = True, cap_name
        cap_reached(self.pid, self.path, what, cap_name, cap)

    def _capped_lines(self, chunks: Iterator[bytes]) -> Iterator[MapsLine]:
        count = 0
        try:
            for line in self._lines(self._within_bytes(chunks)):
                if count >= MAPS_MAX_MAPPINGS:
                    self._cap("mappings", "MAPS_MAX_MAPPINGS", MAPS_MAX_MAPPINGS)
                    return
                count += 1
                yield line
        finally:  # also when the reader stops early: the long lines met so far are named once
            if self.long_lines and self.cut is None:
                self.capped = True
                safeio.warn(
                    self.pid,
                    self.path,
                    f"pid {self.pid}: {self.path}: {self.long_lines} line(s) of up to {self.longest} bytes, more "
                    f"than {MAPS_LINE_MAX_BYTES} (MAPS_LINE_MAX_BYTES: a path nested too deep); only their range "
                    "and the end of their path kept",
                )

    def _within_bytes(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        total = 0
        for chunk in chunks:
            if total + len(chunk) > MAPS_MAX_BYTES:
                yield chunk[: MAPS_MAX_BYTES - total]
                self._cap("bytes", "MAPS_MAX_BYTES", MAPS_MAX_BYTES)
                return
            total += len(chunk)
            yield chunk

    def _lines(self, chunks: Iterator[bytes]) -> Iterator[MapsLine]:
        pending = b""
        head: bytes | None = None  # an over-long line's first bytes while its end is awaited
        length = 0
        for chunk in chunks:
            at = 0
            while at < len(chunk):
                newline = chunk.find(b"\n", at)
                piece = chunk[at:] if newline < 0 else chunk[at:newline]
                at = len(chunk) if newline < 0 else newline + 1
                if head is None and len(pending) + len(piece) <= MAPS_LINE_MAX_BYTES:
                    pending += piece
                else:
                    if head is None:
                        head, length = (pending + piece[:MAPS_LINE_HEAD])[:MAPS_LINE_HEAD], len(pending)
                    length += len(piece)
                    pending = (pending + piece)[-MAPS_LINE_TAIL:]
                if newline >= 0:
                    if head is None:
                        yield MapsLine(pending, True)
                    else:
                        self.long_lines += 1
                        self.longest = max(self.longest, length)
                        yield MapsLine(head + b" " + pending, False)
                    pending, head, length = b"", None, 0
        if pending and head is None and self.cut is None:  # a last line without its newline (not one cut)
            yield MapsLine(pending, True)


def maps(pid: int, root: str = "/proc") -> Maps:
    """/proc/PID/maps within its caps (``Maps``): the one reader of a target's mappings."""
    return Maps(pid, root)


def status(pid: int, root: str = "/proc", task: int | None = None) -> dict[str, str] | None:
    """The ``Key:\\tvalue`` lines of /proc/PID[/task/TID]/status; None when the process is gone."""
    name = "status" if task is None else f"task/{task}/status"
    lines = Lines(pid, name, STATUS_MAX_LINES, STATUS_LINE_MAX_BYTES, STATUS_MAX_BYTES, "STATUS_MAX", root)
    fields: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields if lines.found and fields else None


def status_field(pid: int, key: str, root: str = "/proc") -> str | None:
    """One field of /proc/PID/status (``NSpid``, ``SigCgt``, ...); None when missing or gone."""
    fields = status(pid, root)
    return None if fields is None else fields.get(key)


def namespace_pid(pid: int, root: str = "/proc") -> int:
    """The pid as the process's own pid namespace sees it (the last NSpid entry): the name of its attach
    socket, trigger file and hsperfdata file; ``pid`` when status does not say."""
    nspids = (status_field(pid, "NSpid", root) or "").split()
    return int(nspids[-1]) if nspids and nspids[-1].isascii() and nspids[-1].isdigit() else pid


def _ids(value: str | None) -> list[int] | None:
    parts = (value or "").split()
    if len(parts) != 4 or not all(part.isascii() and part.isdigit() for part in parts):
        return None
    return [int(part) for part in parts]


def owner(pid: int, root: str = "/proc") -> tuple[int, int]:
    """(real uid, real gid) of a process: the rights everything done on its behalf gets. A process whose
    effective ids differ from its real ones (a setuid or setgid program) has no one owner: UnsafeFile.
    FileNotFoundError when it is gone."""
    fields = status(pid, root)
    if fields is None:
        raise FileNotFoundError(errno.ENOENT, "no such process", f"/proc/{pid}")
    uids, gids = _ids(fields.get("Uid")), _ids(fields.get("Gid"))
    shown = _shown(root, pid, "status")
    if uids is None or gids is None:
        raise safeio.UnsafeFile(pid, shown, "no Uid/Gid lines")
    if uids[0] != uids[1] or gids[0] != gids[1]:
        refusal = safeio.UnsafeFile(
            pid, shown, f"real uid/gid {uids[0]}/{gids[0]}, effective {uids[1]}/{gids[1]} (a setuid program)"
        )
        safeio.warn(pid, shown, str(refusal))
        raise refusal
    return uids[0], gids[0]


def task_ids(pid: int, max_threads: int | None = None, root: str = "/proc") -> list[int] | None:
    """The thread ids of ``pid``, sorted, at most ``max_threads`` (THREADS_MAX unless given: the threads
    cap per process; the directory is streamed, never listed whole); None when the process is gone.

    THREADS_MAX is read at each call, not bound as a default argument when the module loads: a default
    bound then kept the import-time 16,384 whatever a test set the constant to (its cap never triggered)."""
    if max_threads is None:
        max_threads = THREADS_MAX
    try:
        fd = safeio.open_without_links(_shown(root, pid, "task"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    tids: list[int] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not (entry.name.isascii() and entry.name.isdigit()):
                    continue
                if len(tids) >= max_threads:
                    cap_reached(pid, _shown(root, pid, "task"), "threads", "THREADS_MAX", max_threads)
                    break
                tids.append(int(entry.name))
    except OSError:
        return None
    finally:
        os.close(fd)
    return sorted(tids)


__all__ = [
    "CMDLINE_MAX_BYTES",
    "COMM_MAX_BYTES",
    "ENVIRON_MAX_BYTES",
    "MAPS_LINE_MAX_BYTES",
    "MAPS_MAX_BYTES",
    "MAPS_MAX_MAPPINGS",
    "STATUS_MAX_BYTES",
    "THREADS_MAX",
    "Cmdline",
    "Lines",
    "Maps",
    "MapsLine",
    "ProcRead",
    "cmdline",
    "comm",
    "environ",
    "maps",
    "owner",
    "read_capped",
    "status",
    "status_field",
    "task_ids",
]
