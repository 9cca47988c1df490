"""Native and kernel frames named in bounded batches during the window, while their process still runs.

The sampler's reader files raw addresses only (profiler/capture/stackstore.py); naming them (procsyms.py) is
the slow part of symbolization and the part that needs the process: its /proc/PID/maps and the files it
maps, reached only through /proc/PID/map_files. Every interval the runner asks for a batch: the
stack chunks the store kept for the first time since the last one (at most ``limit`` of them,
``StackStore.take_fresh``: each chunk is handed out once, so nothing here remembers chunks) have their
plain pcs resolved into the memo of the symbol cache the sampler keeps for the process anyway
(``FrameMemo.resolve_native``, bounded by ``MEMO_LIMIT`` addresses). After the window the symbolizer
adopts that memo, so the post-run pass finds its native names there and names only Java frames (which
depend on the perf-map version and the JVM's generation of names: their epoch is settled only when it
ends), kernel frames and what the batches had no time for.

Only frames of kind "native" are kept from a batch: what the window's symbol cache could not name (a
library mapped after it was opened, JIT code) is named after the window as before, so the capture of
the same samples is the same whether or not batches ran; what changes is that a process exiting
mid-window keeps the native names its batches found (before, one that exited before its symbol cache
was prepared, or whose library was unmapped, had those frames as ``[unknown]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..capture.stackstore import TAG_MASK, FreshChunks
from .frames import FrameMemo
from .symbolize import raw_addresses

BATCH_CHUNKS = 16_000  # stack chunks (32 values) looked at per batch: bounds the runner's pause
SEEN_LIMIT = 50_000  # pcs a process's batches remember having looked at (~3 MB at most)


class NativeResolver(Protocol):
    """What a batch needs of a process's symbolizer (profiler/symbols/frames.py FrameMemo)."""

    def resolve_native(self, addr: int) -> None: ...


class WindowSymbols:
    """The stacks already looked at, per process, and where their native names went.

    ``symbols_of(pid)`` returns the symbol cache the sampler already keeps for a live process (the
    preparer's, profiler/symbols/symbolprep.py: no second cache, no memory of its own), or None while
    there is none yet (its stacks are left to the pass after the window). ``walker``: user stacks hold
    tagged values (interpreted Method*s, compiled frames, gaps) besides pcs. The kernel's names are left
    to that pass too: they do not go away with a process.
    """

    def __init__(self, symbols_of: Callable[[int], NativeResolver | None], walker: bool) -> None:
        self._symbols_of = symbols_of
        self.walker = walker
        self.used: dict[int, NativeResolver] = {}  # pid -> the cache its names went into
        self._seen: dict[int, set[int]] = {}  # pid -> pcs looked at (bounded)
        # stacks new when the batches took their chunks; how many batches ran and what they cost are the
        # runner's to count (overhead.json name_batch_*)
        self.stacks_named = 0

    def name_batch(self, fresh: FreshChunks) -> int:
        """Resolve the native pcs of the chunks the store kept since the last batch (each handed out once);
        returns how many stacks were new since the last batch. A pc looked at before is skipped: a pc the cache
        does not place in a file stays unplaced in the same cache."""
        for tgid, chunk in fresh.chunks:
            symbols = self.used.get(tgid) or self._symbols_of(tgid)
            if symbols is None:
                continue
            self.used[tgid] = symbols
            self._name_chunk(symbols, chunk, self._seen.setdefault(tgid, set()))
        self.stacks_named += fresh.stacks
        return fresh.stacks

    def _name_chunk(self, symbols: NativeResolver, chunk: bytes, seen: set[int]) -> None:
        if len(seen) >= SEEN_LIMIT:
            seen.clear()  # a bound, not a cache miss: the memo keeps what was named
        for value in raw_addresses(chunk):
            if (self.walker and value & TAG_MASK) or value in seen:
                continue
            symbols.resolve_native(value)
            seen.add(value)

    def adopt_into(self, pid: int, target: FrameMemo) -> None:
        """Hand ``pid``'s native names to the symbolizer that names its stacks after the window (nothing to
        do when that is the cache they went into: a process gone, named with its prepared cache)."""
        found = self.used.pop(pid, None)
        self._seen.pop(pid, None)
        if isinstance(found, FrameMemo) and found is not target:
            target.adopt_native(found)

    def close(self) -> None:
        """Forget everything (the caches are their owner's to free)."""
        self.used.clear()
        self._seen.clear()
