"""Atomic writes: a reader sees the old or the new content of a file or of a whole directory, never half.

Every output of both halves is written through here: the capture's files, the journal, summaries,
reports, published pages and exports (``atomic_write_*`` for one file, ``staged_dir`` for a tree).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write a file so a reader sees the old or the new content, never half of it. The file is
    private (0600) unless ``mode`` says otherwise (0o644 for what a web server serves)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_lines(path: Path, lines: Iterable[str], batch_chars: int = 1 << 18) -> None:
    """``atomic_write_text`` of text that arrives as lines, encoded and written ~``batch_chars`` at a time."""

    def batches() -> Iterator[bytes]:
        batch: list[str] = []
        size = 0
        for line in lines:
            batch.append(line)
            size += len(line)
            if size >= batch_chars:
                yield "".join(batch).encode("utf-8")
                batch, size = [], 0
        if batch:
            yield "".join(batch).encode("utf-8")

    atomic_write_chunks(path, batches())


def atomic_write_bytes(path: Path, content: bytes, mode: int | None = None, sync: bool = False) -> None:
    """``atomic_write_text`` for binary content (a gzip-compressed pprof profile)."""
    atomic_write_chunks(path, (content,), mode, sync)


def atomic_write_chunks(path: Path, chunks: Iterable[bytes], mode: int | None = None, sync: bool = False) -> None:
    """``atomic_write_bytes`` of content that arrives in parts (written as they come, never joined); ``sync``:
    on disk before it replaces the old file (a host crash keeps the old or the new content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            if sync:
                handle.flush()
                os.fdatasync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def replace_dir(staging: Path, target: Path) -> None:
    """Move a complete directory into place. A reader sees the old or the new tree, never half of
    one (between the two renames the path is briefly absent); nothing of the old tree lingers."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(target, old)
    os.rename(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_dir(target: Path, mode: int = 0o755) -> Iterator[Path]:
    """A new directory beside ``target`` to fill; swapped in for ``target`` as a whole (replace_dir) when
    the block ends, removed when it raises, so a reader never sees half a tree. ``mode``: the tree's
    top (0o755: reports and exports are served or shared; the files inside keep their own modes)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    try:
        yield staging
        # by the directory's own fd, never by path: nothing swapped in at the name gets root's chmod
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        replace_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
