"""Reading the text files a user hands in (application profiles, cluster.txt, known_spes.txt, CSV and
JSON of run archives): UTF-8 with an optional byte-order mark, which never changes a result, and
sizes bounded before parsing, each refusal one line naming the file (and line)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from ..errors import ConfigError, ProfilerError

# A BOM (Windows editors save one) is dropped by this codec and absent from every result.
TEXT_ENCODING = "utf-8-sig"
BOM = "\ufeff"


def open_text(path: str | os.PathLike[str], newline: str | None = None, lenient: bool = False) -> IO[str]:
    """A text file opened for streaming reads (folded stacks, CSV): UTF-8 without its BOM;
    ``lenient`` turns bytes that are not UTF-8 into U+FFFD instead of an error."""
    return open(path, encoding=TEXT_ENCODING, errors="replace" if lenient else "strict", newline=newline)


def read_text_input(
    path: str | os.PathLike[str],
    what: str,
    fix: str,
    *,
    max_bytes: int,
    error: type[ProfilerError] = ConfigError,
) -> str:
    """The whole text of one input file: a regular file of at most ``max_bytes``, UTF-8 (an optional
    BOM dropped). Anything else is ``error`` ``FILE[:LINE]: problem; fix`` (``what`` names the
    file's role for the message, ``fix`` says what to do)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{path}: cannot read {what}: not a regular file; {fix}")
            if info.st_size > max_bytes:
                raise error(f"{path}: {info.st_size} bytes, more than {max_bytes} for {what}; {fix}")
            content = handle.read(max_bytes + 1)
    except IsADirectoryError:
        raise error(f"{path}: cannot read {what}: it is a directory; {fix}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc}); {fix}") from None
    if len(content) > max_bytes:  # grew while read (a pipe, /proc)
        raise error(f"{path}: more than {max_bytes} bytes for {what}; {fix}")
    try:
        return content.decode(TEXT_ENCODING)
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def check_line_lengths(lines: Iterable[str], source: str, max_chars: int, fix: str) -> None:
    """A ConfigError ``source:LINE`` for the first line longer than ``max_chars`` (linear)."""
    for number, line in enumerate(lines, start=1):
        if len(line) > max_chars:
            raise ConfigError(f"{source}:{number}: a line of {len(line)} characters, more than {max_chars}; {fix}")
