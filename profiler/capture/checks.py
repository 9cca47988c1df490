"""The one validator of a capture's files: what `profiler run` cannot write is refused with one line naming
the file, by every reader (the host agent's, the coordinator's analysis, report and exports, the PySpark
engine's workers), before a number is computed from it.

A capture comes home from a host that may be compromised, over a disk that may be full: its files are
opened without following links or blocking (a FIFO named stacks.tpc), must be regular files, are inflated
no further than their own header announces (a gzip bomb is refused at its first byte too many), and the
tables' names and rows must be what the writer produces (no NUL, no lone surrogate, each (interval, stack,
context) row once and in order, intervals inside meta.json's window). docs/capture-format.md lists them.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import zlib
from collections.abc import Sequence
from operator import lt
from pathlib import Path
from typing import BinaryIO

from ..errors import CaptureFormatError

ADVICE = "re-run or re-fetch the capture"
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def refused(path: Path | str, what: str, advice: str = ADVICE) -> CaptureFormatError:
    return CaptureFormatError(f"{path}: {what}; {advice}")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def present(path: Path) -> bool:
    """Whether a capture file is there: False when absent, True for a regular file; anything else where a
    file belongs (a directory, a link, a FIFO) is a CaptureFormatError: a reader that skipped it would
    count a PID's samples as none."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise refused(path, f"cannot read ({exc.strerror or exc})") from None
    if stat.S_ISREG(mode):
        return True
    raise refused(path, f"{_kind(mode)} where the capture has a file; a capture holds only regular files")


def not_a_link(path: Path, advice: str = ADVICE) -> Path:
    """``path`` unless it is a symbolic link (a directory a capture or run holds is its own, never a link
    elsewhere: a reader would count, and a writer remove, what lies there)."""
    if os.path.islink(path):
        raise refused(path, f"a symbolic link (to {os.readlink(path)}) where a directory of its own belongs", advice)
    return path


def open_regular(path: Path, follow: bool = False, advice: str = ADVICE) -> BinaryIO:
    """``path`` opened for reading when it is a regular file: never through a link (unless ``follow``),
    never blocking on a FIFO; else a CaptureFormatError naming it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise refused(path, "missing", "is this a capture directory written by `profiler run`?") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refused(path, "a symbolic link where the capture has a file", advice) from None
        raise refused(path, f"cannot read ({exc.strerror or exc})", advice) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise refused(path, f"{_kind(mode)}, not a file", advice)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


# ---------------------------------------------------------------- texts


def text_problem(values: Sequence[str], what: str) -> str | None:
    """Why ``values`` (a table's frame names, contexts, modules) are not what the writer produces: a NUL
    (written raw into a page, cut by C strings) or a lone surrogate (JSON's \\ud800 escapes; no file can
    hold it); None when they are fine."""
    joined = "\x01".join(values)
    if "\x00" in joined:
        return f"a {what} holds a NUL character"
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return f"a {what} is not UTF-8 text (a lone surrogate)"
    return None


# ---------------------------------------------------------------- rows


def row_interval_error(interval: int, limit: int) -> str:
    return f"a row's interval {interval} is past the window's {limit} intervals (meta.json)"


def row_order_error(row: int, repeated: bool) -> str:
    if repeated:
        return f"row {row} is listed twice (the same interval, stack and context as the row before)"
    return f"row {row} is out of (interval, stack, context) order"


def row_problem(
    intervals: Sequence[int], stack_ids: Sequence[int], context_ids: Sequence[int], limit: int | None
) -> str | None:
    """The rows' problem (standard library): an interval past ``limit`` (meta.json's window; None: no
    capture around the table), or rows not strictly in (interval, stack, context) order: the writer sums
    each cell once and sorts them, so a row listed twice counts its samples twice. (tableread.py makes the
    same checks with numpy, with the same messages.)"""
    if limit is not None and intervals and max(intervals) >= limit:
        return row_interval_error(max(intervals), limit)
    keys = list(zip(intervals, stack_ids, context_ids))
    if all(map(lt, keys, keys[1:])):
        return None
    row = next(i for i in range(1, len(keys)) if not keys[i - 1] < keys[i])
    return row_order_error(row, keys[row - 1] == keys[row])


# ---------------------------------------------------------------- bounded inflation

READ_CHUNK = 1 << 16
# deflate's largest expansion (a run of one byte): more announced output per byte of input than this is a
# table whose declared sizes exceed its bytes.
DEFLATE_MAX_RATIO = 1032


class BoundedInflater:
    """One gzip member read from a file a part at a time, giving out exactly the bytes asked for: nothing
    is inflated beyond what the caller's bound allows, so a bomb is refused at its first byte too many,
    in the time and memory of what came before it."""

    def __init__(self, handle: BinaryIO, source: str) -> None:
        self._handle, self._source = handle, source
        self._inflater = zlib.decompressobj(31)  # gzip wrapper: header, CRC32 and length checked by zlib
        self.compressed_size = os.fstat(handle.fileno()).st_size

    def _corrupt(self, detail: str) -> CaptureFormatError:
        return refused(self._source, f"truncated or corrupt ({detail})")

    def _inflate(self, limit: int) -> bytes:
        """Up to ``limit`` (> 0) bytes of output; b"" once the stream has ended."""
        while True:
            if self._inflater.eof:
                return b""
            data = self._inflater.unconsumed_tail
            if not data:
                data = self._handle.read(READ_CHUNK)
                if not data:
                    raise self._corrupt("the gzip stream ends before its end")
            try:
                out = self._inflater.decompress(data, limit)
            except zlib.error as exc:
                raise self._corrupt(str(exc)) from None
            if out:
                return out

    def read_into(self, target: memoryview) -> int:
        """Fill ``target`` as far as the stream goes; the bytes written."""
        filled = 0
        while filled < len(target):
            out = self._inflate(len(target) - filled)
            if not out:
                break
            target[filled : filled + len(out)] = out
            filled += len(out)
        return filled

    def read(self, size: int) -> bytes:
        buffer = bytearray(size)
        return bytes(buffer[: self.read_into(memoryview(buffer))])

    def at_end(self) -> bool:
        """Whether the stream ends here (one byte more is inflated at most to tell) and the file with it."""
        if self._inflate(1):
            return False
        if self._inflater.unused_data or self._handle.read(1):
            raise self._corrupt("bytes after the gzip stream")
        return True


def contained(root: Path, path: Path) -> Path:
    """``path`` when it resolves inside ``root`` (a capture or run directory). A capture never holds
    links, so one that leads out (to /etc/shadow, another run) is refused before it is read."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise CaptureFormatError(
            f"{path}: a link out of {root}; a capture holds its own files only, copy the file in instead"
        )
    return path


# Unix times a capture can hold: after 1970, before the year 3000 (time.localtime of 1e300 overflows).
LATEST_TIME = 32503680000.0
MAX_FREQUENCY = 10000  # Hz, profiler.argtypes.frequency's bound
MAX_DURATION = 7 * 24 * 3600.0  # seconds, profiler.argtypes.duration's bound


def check_rate(path: Path, frequency: int, duration: float, advice: str) -> None:
    """A sampling frequency and a requested duration that a run can have (every --frequency and
    --duration passes argparse's bounds); else a CaptureFormatError naming ``path``."""
    if not 1 <= frequency <= MAX_FREQUENCY:
        raise CaptureFormatError(f"{path}: frequency {frequency!r} is not 1 to {MAX_FREQUENCY} Hz; {advice}")
    if not (math.isfinite(duration) and 0 <= duration <= MAX_DURATION):
        raise CaptureFormatError(f"{path}: duration {duration!r} is not 0 to {MAX_DURATION:g} seconds; {advice}")


def check_times(
    path: Path, start: float | None, end: float | None, advice: str, what: str = "", early_end: float = 0.0
) -> None:
    """A window's start and end (either may be None): finite, between 1970 and 3000, start <= end (or at
    most ``early_end`` seconds before it: a run stopped before its window opened); else a
    CaptureFormatError naming ``path`` (and ``what``, e.g. the host)."""
    for name, value in (("start_time", start), ("end_time", end)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= LATEST_TIME):
            raise CaptureFormatError(f"{path}: {what}{name} {value!r} is not a possible time; {advice}")
    if start is not None and end is not None and end < start - early_end:
        raise CaptureFormatError(f"{path}: {what}end_time {end!r} is before start_time {start!r}; {advice}")
