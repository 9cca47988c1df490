"""Root's private caches under ``/var/cache/spe-taskprof`` (compiled BPF, prepared unwind tables): the checks
every entry gets, in one place.

A cache directory is the agent's own (its euid's, mode 0700); an entry is still input read back by root, so it
is opened without following links, checked (a regular file of that uid, under a size bound) before a bounded
read, written atomically (a reader sees the old or the new entry, never half) and, where the cache has a
bound on its total size, the least recently used entries are removed past it. What an entry holds is each
cache's own format, validated by its reader.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

STALE_TEMP_SECONDS = 600.0  # a writer's temporary file older than this was left by a crash


class PrivateCacheError(Exception):
    """A cache directory or entry that cannot be used; the caller goes on without it."""


def configured_dir(env_name: str, default: Path) -> Path | None:
    """The cache's directory: ``default``, another one named by the environment variable, or None when the
    variable says ``off``."""
    configured = os.environ.get(env_name, "")
    if configured == "off":
        return None
    return Path(configured) if configured else default


def check_private_dir(directory: Path) -> None:
    """PrivateCacheError unless ``directory`` is a real directory of this euid that nobody else may enter."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PrivateCacheError(f"{directory}: not a directory private to uid {os.geteuid()} (mode 0700); remove it")


def read_entry_bytes(path: Path, limit: int, touch: bool = False) -> bytes:
    """An entry's bytes (at most ``limit``): PrivateCacheError("no entry") when absent, PrivateCacheError naming
    the path when its directory or the file is not the agent's own or too large. ``touch``: its mtime set to now
    (the cache's eviction keeps the entries used last)."""
    try:
        check_private_dir(path.parent)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PrivateCacheError("no entry") from None
    except OSError as exc:
        raise PrivateCacheError(f"{path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > limit:
            raise PrivateCacheError(f"{path}: not a regular file of uid {os.geteuid()} under {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as handle:
            content = handle.read(limit + 1)
        if touch:
            try:
                os.utime(fd)
            except OSError:
                pass  # a read-only cache still serves its entries
    finally:
        os.close(fd)
    if len(content) > limit:
        raise PrivateCacheError(f"{path}: larger than {limit} bytes")
    return content


def write_entry_bytes(directory: Path, name: str, content: bytes) -> None:
    """Store an entry atomically (0600) in the private directory, created 0700 when absent; OSError or
    PrivateCacheError when it cannot be."""
    from .atomic import atomic_write_bytes

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(directory)
    atomic_write_bytes(directory / name, content, mode=0o600)


def evict(directory: Path, max_bytes: int, suffix: str) -> int:
    """The least recently used entries (names ending ``suffix``; mtime, which a read with ``touch`` renews)
    removed until the entries total at most ``max_bytes``, and writers' temporary files a crash left behind;
    the bytes removed. Nothing is followed: only regular files directly in the directory are counted."""
    entries: list[tuple[float, int, str]] = []
    removed = 0
    now = time.time()
    try:
        check_private_dir(directory)
        names = os.listdir(directory)
    except (OSError, PrivateCacheError):
        return 0
    for name in names:
        try:
            info = os.lstat(directory / name)
        except OSError:
            continue  # removed by another evictor meanwhile
        if not stat.S_ISREG(info.st_mode):
            continue
        if name.startswith("."):
            if now - info.st_mtime > STALE_TEMP_SECONDS:
                removed += _unlink(directory / name, info.st_size)
            continue
        if name.endswith(suffix):
            entries.append((info.st_mtime, info.st_size, name))
    total = sum(size for _mtime, size, _name in entries)
    for _mtime, size, name in sorted(entries):
        if total <= max_bytes:
            break
        removed += _unlink(directory / name, size)
        total -= size
    return removed


def _unlink(path: Path, size: int) -> int:
    try:
        os.unlink(path)
    except OSError:
        return 0
    return size
