"""Versions of a JVM's perf map over the window, so every sample is named with the code of its time.

The JIT compiles, deoptimises and frees code all the time; an address can hold one method early in a
long window and another later. The sampler refreshes the map every ``perf_map_refresh`` seconds and
once more at the end, copying each version aside. A sample taken at time t is named with the first
version whose refresh began at or after t (it lists every method compiled before t); an address missing
there (code freed between t and that refresh) is looked up in the version before t. Code that is
compiled and freed again between two refreshes, at an address that other code reuses, is the one case
this cannot name right: refresh more often than code lives (``--perf-map-refresh``).
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from pathlib import Path

from ..files.atomic import atomic_write_bytes
from . import perfmap
from .perfmap import PerfMap


class PerfMapHistory:
    """Refresh times and copied map versions of one process (epochs are indices into them)."""

    def __init__(self, pid: int, directory: Path) -> None:
        self.pid = pid
        self.directory = directory
        self._starts: list[int] = []  # monotonic ns each refresh began, ascending
        self._files: list[Path | None] = []  # the copied version; None when that refresh failed
        self._last_digest: str | None = None
        self._last_path: Path | None = None
        self._lock = threading.Lock()
        self._loaded: dict[Path, PerfMap] = {}

    def epoch_at(self, time_ns: int) -> int:
        """Index of the first refresh that began at or after ``time_ns`` (may be one not yet taken)."""
        return bisect.bisect_left(self._starts, time_ns)

    def begin(self) -> int:
        """A refresh begins now: samples from now on belong to a later version. Returns its index."""
        with self._lock:
            self._starts.append(time.monotonic_ns())
            self._files.append(None)
            return len(self._starts) - 1

    def finish(self, index: int, ok: bool) -> None:
        """Copy the map the refresh wrote (an identical one is shared with the previous version)."""
        if not ok:
            return
        content = perfmap.read_perf_map_bytes(self.pid)  # bounded, no link or FIFO followed (safeio)
        if content is None:
            return
        digest = hashlib.blake2b(content, digest_size=16).hexdigest()
        if digest == self._last_digest and self._last_path is not None:
            self._files[index] = self._last_path
            return
        target = self.directory / f"perf-{self.pid}-{index}.map"
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, content)  # whole or absent: a kill mid-copy must not leave half a map
        self._files[index] = target
        self._last_digest, self._last_path = digest, target

    def versions(self) -> list[tuple[int, str | None]]:
        """(refresh start ns, copied file's name or None) of every refresh so far, for the checkpoint journal."""
        with self._lock:
            return [(start, path.name if path is not None else None) for start, path in zip(self._starts, self._files)]

    @classmethod
    def restore(cls, pid: int, directory: Path, versions: list[tuple[int, str | None]]) -> PerfMapHistory:
        """The history as a checkpoint recorded it (recovery); a copy missing on disk counts as a failed refresh."""
        history = cls(pid, directory)
        for start, name in versions:
            history._starts.append(int(start))
            path = directory / name if name is not None else None
            history._files.append(path if path is not None and path.is_file() else None)
        return history

    @property
    def last_refresh_ns(self) -> int | None:
        return self._starts[-1] if self._starts else None

    @property
    def snapshots(self) -> int:
        """Refreshes that produced a map."""
        return sum(1 for path in self._files if path is not None)

    def path_for(self, epoch: int) -> Path | None:
        """The version that names samples of ``epoch``: the first good one from there, else the last good one."""
        for path in self._files[epoch:]:
            if path is not None:
                return path
        for path in reversed(self._files[:epoch]):
            if path is not None:
                return path
        return None

    def _before(self, epoch: int) -> Path | None:
        for path in reversed(self._files[: min(epoch, len(self._files))]):
            if path is not None:
                return path
        return None

    def _parse(self, path: Path) -> PerfMap:
        cached = self._loaded.get(path)
        if cached is None:
            with open(path, encoding="utf-8", errors="replace") as handle:
                cached = perfmap.parse_perf_map(handle)
            if len(self._loaded) >= 2:  # epochs are visited in order: two versions are all we need
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[path] = cached
        return cached

    def map_for(self, epoch: int) -> PerfMapPair | None:
        """The lookup for samples of ``epoch``: the version after them, then the one before."""
        after, before = self.path_for(epoch), self._before(epoch)
        if after is None:
            return None
        return PerfMapPair(self._parse(after), self._parse(before) if before not in (None, after) else None)

    def discard(self) -> None:
        """Delete the copies (they live only until symbolization)."""
        self._loaded.clear()
        for path in {p for p in self._files if p is not None}:
            path.unlink(missing_ok=True)


class PerfMapPair:
    """Looks an address up in the version after the sample, then in the one before it."""

    def __init__(self, after: PerfMap, before: PerfMap | None) -> None:
        self.after, self.before = after, before

    def __len__(self) -> int:
        return len(self.after)

    def lookup(self, addr: int) -> str | None:
        name = self.after.lookup(addr)
        if name is None and self.before is not None:
            name = self.before.lookup(addr)
        return name
