"""Native and kernel frames named in bounded batches during the window, while their process still runs.

The sampler's reader files raw addresses only (profiler/capture/stackstore.py); naming them through bcc is
the slow part of symbolization and the part that needs the process: its /proc/PID/maps and, in another
mount namespace, its files under /proc/PID/root. Every interval the runner asks for a batch: the
stacks new since the last one (at most ``limit`` of them) have their plain pcs resolved into the memo of
the symbol cache the sampler keeps for the process anyway (``FrameMemo.resolve_native``, bounded by
``MEMO_LIMIT`` addresses). After the window the symbolizer adopts that memo, so the post-run pass finds
its native names there and names only Java frames (which depend on the perf-map version and the JVM's
generation of names: their epoch is settled only when it ends), kernel frames and what the batches had
no time for.

Only frames of kind "native" are kept from a batch: what the window's symbol cache could not name (a
library mapped after it was opened, JIT code) is named after the window as before, so the capture of
the same samples is the same whether or not batches ran; what changes is that a process exiting
mid-window keeps the native names its batches found (before, one that exited before its symbol cache
was prepared, or whose library was unmapped, had those frames as ``[unknown]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..capture.stackstore import TAG_MASK, StackKey
from .symbolize import FrameMemo, raw_addresses

BATCH_STACKS = 2000  # distinct stacks looked at per batch: bounds the runner's pause
SEEN_LIMIT = 200_000  # chunks and addresses a process's batches remember having looked at


class NativeResolver(Protocol):
    """What a batch needs of a process's symbolizer (profiler/symbols/symbolize.py FrameMemo)."""

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
        self._seen: dict[int, set[bytes | int]] = {}  # pid -> chunks and pcs looked at (bounded)
        # the store's keys looked at so far: where the next batch starts (the store hands them out in order);
        # how many batches ran and what they cost are the runner's to count (overhead.json name_batch_*)
        self.stacks_named = 0

    def name_batch(self, new_keys: Sequence[StackKey]) -> int:
        """Resolve the native pcs of ``new_keys`` (the store's keys from ``stacks_named`` on); returns how
        many keys were looked at. A chunk of a deep stack or a pc looked at before is skipped: stacks share
        their root frames, and a pc bcc does not place in a file stays unplaced in the same cache."""
        for key in new_keys:
            if isinstance(key.user, int):
                continue
            symbols = self.used.get(key.tgid) or self._symbols_of(key.tgid)
            if symbols is None:
                continue
            self.used[key.tgid] = symbols
            seen = self._seen.setdefault(key.tgid, set())
            chunks = (key.user,) if isinstance(key.user, bytes) else key.user
            for chunk in chunks:
                if chunk in seen:
                    continue
                self._name_chunk(symbols, chunk, seen)
                seen.add(chunk)
        self.stacks_named += len(new_keys)
        return len(new_keys)

    def _name_chunk(self, symbols: NativeResolver, chunk: bytes, seen: set[bytes | int]) -> None:
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
