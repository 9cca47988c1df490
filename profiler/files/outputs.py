"""Every output path of both CLIs, checked before any work: its kind (file or directory), whether it
can be written, and what ``--force`` may replace: only what this tool wrote (docs/reliability.md).

A directory the tool creates holds a marker file (``MARKER``); an existing output is the tool's when
it has the marker, or one of the files an older version left instead (``ours_if``). A file output is
the tool's when its first bytes are what the command writes (``signature``). Anything else is the
user's: refused even with ``--force``, never removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ConfigError, OutputExistsError

MARKER = ".spe-taskprof"
_HEAD_BYTES = 4096
# Markers of the versions before MARKER existed (report, comparison, campaign directories).
LEGACY_MARKERS = (".spe-taskprof-report", ".spe-taskprof-compare", ".spe-taskprof-campaign")

Signature = Callable[[bytes], bool]


def csv_header(*columns: str) -> Signature:
    """A CSV this tool wrote starts with its header row."""
    expected = ",".join(columns).encode("utf-8")
    return lambda head: head.split(b"\n", 1)[0].rstrip(b"\r") == expected


def text_prefix(*prefixes: bytes) -> Signature:
    return lambda head: head.startswith(prefixes)


_FOLDED_LINE = re.compile(rb"^[^\n]* [0-9]+$")


def folded_text(head: bytes) -> bool:
    """Folded stacks (``frame;frame count`` lines), or nothing at all."""
    lines = head.split(b"\n")
    if len(head) == _HEAD_BYTES:
        lines = lines[:-1]  # the last one may be cut
    return all(_FOLDED_LINE.match(line) for line in lines if line)


def _nearest_existing(path: Path) -> Path:
    candidate = path.absolute()
    while not candidate.exists() and candidate != candidate.parent:
        candidate = candidate.parent
    return candidate


def _check_creatable(path: Path, option: str) -> None:
    """The closest existing ancestor of ``path`` is a writable directory (so the output can be made)."""
    parent = _nearest_existing(path.absolute().parent)
    if not parent.is_dir():
        raise ConfigError(f"{path}: {parent} is not a directory; choose another {option}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{path}: cannot write in {parent} (permission denied); choose another {option}")


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(_HEAD_BYTES)
    except OSError:
        return b""


def check_output_file(
    path: Path, option: str, *, force: bool, signature: Signature | None = None, replace_own: bool = False
) -> Path:
    """``path`` may be written as one file: not a directory; an existing file only when ``signature``
    recognises it as this tool's output, and then with ``force`` or when ``replace_own`` (a command
    that always rewrote its own file). Without a signature, the file the user named is replaced
    with ``force``."""
    path = Path(path)
    if path.is_dir():
        raise OutputExistsError(f"{path}: is a directory, {option} takes a file name; choose a file path")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise OutputExistsError(f"{path}: exists and is not a regular file; choose another {option}")
        ours = signature is None or signature(_head(path))
        if not ours and (force or replace_own):
            raise OutputExistsError(
                f"{path}: exists and was not written by this tool; refusing to replace it even with --force, "
                f"choose another {option}"
            )
        if not (force or (replace_own and ours)):
            raise OutputExistsError(f"{path}: exists; choose another {option} or add --force")
    _check_creatable(path, option)
    return path


def is_ours(directory: Path, own_kind: Iterable[str] = ()) -> bool:
    """Whether an existing directory was written by this tool: its marker, or a file that only this
    tool's output of that kind holds (``own_kind``: names relative to the directory)."""
    names = (MARKER, *LEGACY_MARKERS, *own_kind)
    return any((Path(directory) / name).exists() for name in names)


def check_output_dir(
    path: Path,
    option: str,
    *,
    force: bool,
    own_kind: Iterable[str] = (),
    replace_own: bool = False,
) -> Path:
    """``path`` may be written as a directory: not a file; an existing non-empty directory only when
    it is this tool's (``is_ours``), and then with ``force``, or without it when ``replace_own`` and
    it is a previous output of the same command (one of ``own_kind`` exists: a report replaces the
    previous report). A directory of the user's is refused even with ``force``; never removed."""
    path = Path(path)
    own_kind = tuple(own_kind)
    if path.exists() and not path.is_dir():
        raise OutputExistsError(f"{path}: is a file, {option} takes a directory; choose another {option}")
    if path.is_dir() and any(child.name != MARKER for child in path.iterdir()):  # only our marker: empty
        if not is_ours(path, own_kind):
            raise OutputExistsError(
                f"{path}: exists and holds files this tool did not write; refusing to replace or write into it "
                f"even with --force, choose another {option}"
            )
        same = any((path / name).exists() for name in own_kind)
        if not (force or (replace_own and same)):
            raise OutputExistsError(f"{path}: exists; choose another {option} or add --force")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{path}: cannot write in it (permission denied); choose another {option}")
        return path
    _check_creatable(path, option)
    return path


def mark_output_dir(directory: Path, command: str) -> None:
    """Leave the marker that lets ``--force`` recognise this directory as the tool's later on."""
    marker = Path(directory) / MARKER
    if not marker.exists():
        marker.write_text(f"written by {command}; --force may replace this directory\n", encoding="utf-8")
