"""A host's capture, taken in from its tar stream by our own reader: regular files and directories only,
every name kept under the host's directory, bounded in members, bytes and name length, and every file
created under a directory fd with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (no link is ever followed, no owner or
mode taken from the stream).

Python's ``tarfile`` filters are not relied on (``filter="data"`` is bypassed on 3.11.7, CVE-2025-4517,
and its PAX and GNU long-name readers allocate whatever size a header claims). A refused member stops
the extraction with one line naming the member and why; what was written stays under the host's
directory. A stream that ends early is an EOFError (the connection was lost: the caller fetches again).

May import: coordinator.errors and the standard library.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from coordinator.errors import ProfilerError

BLOCK = 512
FILE_MODE = 0o644
DIR_MODE = 0o755
_PAX_MAX_BYTES = 64 << 10  # a PAX record set of a capture member names one path and a size
_TRAILER_MAX_BYTES = 1 << 20  # GNU tar pads the end to its record size (10 KiB by default)
_KINDS = {
    b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device", b"4": "a block device",
    b"6": "a FIFO", b"7": "a contiguous file", b"K": "a long link name", b"S": "a sparse file", b"V": "a volume label",
}  # fmt: skip


class CaptureRefused(ProfilerError):
    """A host's capture stream held something a capture never holds (a link, a device, a name that leads
    out of the host's directory, more than the limits): nothing of it is extracted past that member."""

    exit_code = 7


@dataclass(frozen=True)
class TarLimits:
    """What one host's capture may hold (a 10-minute capture of a busy host is a few hundred MB)."""

    max_total_bytes: int = 8 << 30
    max_member_bytes: int = 4 << 30
    max_members: int = 100_000
    max_name_bytes: int = 1024
    max_depth: int = 16


@dataclass(frozen=True)
class Member:
    name: str  # as the stream gave it
    parts: tuple[str, ...]  # normalised, relative to the host's directory; () for the directory itself
    is_dir: bool
    size: int


def extract_capture(stream: BinaryIO, dest: Path, limits: TarLimits = TarLimits()) -> int:
    """Extract the tar ``stream`` into ``dest`` (an existing directory, the host's); returns the number
    of members written. CaptureRefused (one line: the member and why) on the first member refused."""
    try:
        root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CaptureRefused(f"{dest}: a link or a file, not the host's directory; nothing extracted") from None
        raise
    total_bytes = written = 0
    try:
        for member in read_members(stream, limits):
            total_bytes += member.size
            if total_bytes > limits.max_total_bytes:
                raise _refused(member.name, f"the capture passes {limits.max_total_bytes} bytes")
            if member.is_dir:
                if member.parts:
                    os.close(_directory(root_fd, member.name, member.parts))
            else:
                _write_file(root_fd, member, stream)
            _skip_padding(stream, member.size if not member.is_dir else 0)
            written += 1
        _drain(stream)
    finally:
        os.close(root_fd)
    return written


def read_members(stream: BinaryIO, limits: TarLimits) -> Iterator[Member]:
    """The members of a tar stream, header by header (the caller reads each file's content next)."""
    pending_name: str | None = None
    pending_size: int | None = None
    count = 0
    while True:
        header = _read_exact(stream, BLOCK, "a header")
        if header == bytes(BLOCK):
            return
        _check_sum(header)
        kind = header[156:157]
        size = _number(header[124:136])
        if kind in (b"L", b"x", b"g"):
            if size > (limits.max_name_bytes if kind == b"L" else _PAX_MAX_BYTES):
                raise _refused(_name_of(header), f"an extended header of {size} bytes")
            body = _read_exact(stream, size, "an extended header")
            _skip_padding(stream, size)
            if kind == b"L":
                pending_name = body.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif kind == b"x":
                pax = _pax_records(body)
                pending_name = pax.get("path", pending_name)
                if "size" in pax:
                    pending_size = _pax_size(pax["size"])
            continue
        name = pending_name if pending_name is not None else _name_of(header)
        if pending_size is not None:
            size = pending_size
        pending_name = pending_size = None
        count += 1
        if count > limits.max_members:
            raise _refused(name, f"more than {limits.max_members} members")
        if kind not in (b"0", b"\0", b"5"):
            raise _refused(name, f"{_KINDS.get(kind, f'of type {kind!r}')}, not a regular file or a directory")
        if size > limits.max_member_bytes:
            raise _refused(name, f"{size} bytes, over the limit of {limits.max_member_bytes}")
        is_dir = kind == b"5" or (kind == b"\0" and name.endswith("/"))
        yield Member(name, normalise(name, limits), is_dir, 0 if is_dir else size)


def normalise(name: str, limits: TarLimits) -> tuple[str, ...]:
    """The components of a member's name under the host's directory; CaptureRefused for an absolute name,
    ``..``, a NUL, or a name or depth over the limits."""
    if len(name.encode("utf-8", "surrogateescape")) > limits.max_name_bytes:
        raise _refused(name[:80], f"a name over {limits.max_name_bytes} bytes")
    if name.startswith("/"):
        raise _refused(name, "an absolute name")
    if "\0" in name:
        raise _refused(name, "a NUL in the name")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise _refused(name, "'..' in the name (it would lead out of the host's directory)")
    if len(parts) > limits.max_depth or any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in parts):
        raise _refused(name, f"deeper than {limits.max_depth} directories or a component over 255 bytes")
    return parts


# ---------------------------------------------------------------- the stream


def _chunks(stream: BinaryIO, size: int, what: str) -> Iterator[bytes]:
    """Exactly ``size`` bytes of the stream, a MiB at most at a time; EOFError if it ends before."""
    left = size
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the capture stream ends inside {what}")
        yield chunk
        left -= len(chunk)


def _read_exact(stream: BinaryIO, size: int, what: str) -> bytes:
    return b"".join(_chunks(stream, size, what))


def _skip_padding(stream: BinaryIO, size: int) -> None:
    if size % BLOCK:
        _read_exact(stream, BLOCK - size % BLOCK, "padding")


def _drain(stream: BinaryIO) -> None:
    """Read the end-of-archive padding (bounded) so the host's tar can finish and report its status."""
    left = _TRAILER_MAX_BYTES
    while left > 0 and (chunk := stream.read(min(left, 65536))):
        left -= len(chunk)


def _check_sum(header: bytes) -> None:
    stored = _number(header[148:156])
    blanked = header[:148] + b" " * 8 + header[156:]
    if stored not in (sum(blanked), sum(b - 256 if b > 127 else b for b in blanked)):
        raise _refused(_name_of(header), "a header whose checksum is wrong (not a tar stream?)")


def _number(field: bytes) -> int:
    """An octal field, or GNU's base-256 for large values (a negative one is refused)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        raise _refused("", "a negative number in a header")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise _refused("", f"a header field {field[:16]!r} that is not a number (not a tar stream?)") from None


def _name_of(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar" and (prefix := header[345:500].split(b"\0", 1)[0]):
        name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_records(body: bytes) -> dict[str, str]:
    """``<length> <key>=<value>\\n`` records; linear in the body (each record is cut at its stated length)."""
    records: dict[str, str] = {}
    at = 0
    while at < len(body) and body[at:at + 1] != b"\0":
        space = body.find(b" ", at, at + 20)
        length_text = body[at:space] if space > at else b""
        if not length_text.isdigit() or int(length_text) <= 0 or at + int(length_text) > len(body):
            raise _refused("", "a malformed PAX header")
        record = body[space + 1 : at + int(length_text)].rstrip(b"\n")
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        at += int(length_text)
    return records


def _pax_size(text: str) -> int:
    if not text.isdigit() or len(text) > 20:
        raise _refused("", f"a PAX size {text[:30]!r} that is not a number")
    return int(text)


# ---------------------------------------------------------------- the files


def _refused(name: str, reason: str) -> CaptureRefused:
    what = f"capture member {name[:200]!r}" if name else "capture stream"
    return CaptureRefused(f"{what} refused: {reason}; nothing further extracted")


def _directory(root_fd: int, name: str, parts: tuple[str, ...]) -> int:
    """An fd of the directory ``parts`` under ``root_fd``, created (0755) where missing; a link or a file
    anywhere on the way is refused, never followed."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refused(name, f"{part!r} is a link or a file here, not a directory") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_file(root_fd: int, member: Member, stream: BinaryIO) -> None:
    """``member``'s content from the stream into a new file (0644) under its directory; an earlier copy
    (a fetch again after a lost connection) is replaced, a directory or link of that name is refused."""
    if not member.parts:
        raise _refused(member.name, "a file where the host's directory is")
    parent_fd = _directory(root_fd, member.name, member.parts[:-1])
    leaf = member.parts[-1]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(leaf, flags, FILE_MODE, dir_fd=parent_fd)
        except FileExistsError:
            info = os.stat(leaf, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise _refused(member.name, "something that is not a file holds its name") from None
            os.unlink(leaf, dir_fd=parent_fd)
            fd = os.open(leaf, flags, FILE_MODE, dir_fd=parent_fd)
        with os.fdopen(fd, "wb") as out:
            for chunk in _chunks(stream, member.size, repr(member.name)):
                out.write(chunk)
    finally:
        os.close(parent_fd)
