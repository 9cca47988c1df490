"""Native and kernel frames named in bounded batches during the window, while their process still runs.

The sampler's reader files raw addresses only (profiler/capture/stackstore.py); naming them through bcc is
the slow part of symbolization and the part that needs the process: its /proc/PID/maps and, in another
mount namespace, its files under /proc/PID/root. Every few seconds the runner asks for a batch: the
stacks new since the last one (at most ``limit`` of them) have their plain pcs and kernel addresses
resolved into per-process memos (``FrameMemo.resolve_native``, bounded by ``MEMO_LIMIT`` addresses). After
the window the symbolizer adopts those memos, so the post-run pass finds its native names there and
names only Java frames (which depend on the perf-map version and the JVM's generation of names: their
epoch is settled only when it ends) and what the batches had no time for.

Only frames of kind "native" are kept from a batch: what the window's symbol cache could not name (a
library mapped after it was opened, JIT code) is named after the window as before, so the capture of
the same samples is the same whether or not batches ran; what changes is that a process exiting
mid-window keeps the native names its batches found (before, one that exited before its symbol cache
was prepared, or whose library was unmapped, had those frames as ``[unknown]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..capture.stackstore import TAG_MASK, StackKey, stack_bytes
from .symbolize import FrameMemo, raw_addresses

BATCH_STACKS = 2000  # distinct stacks named per batch: bounds the runner's pause (~0.1-0.3 s of bcc)


class NativeResolver(Protocol):
    """What a batch needs of a process's symbolizer (profiler/symbols/symbolize.py FrameMemo)."""

    def resolve_native(self, addr: int) -> None: ...
    def close(self) -> None: ...


class KernelNames(Protocol):
    """The kernel's symbolizer (symbolize.KernelSymbols): one for the window and the pass after it."""

    def resolve(self, addr: int) -> str: ...
    def close(self) -> None: ...


class WindowSymbols:
    """Per-process symbol caches opened during the window and the stacks already named into them.

    ``open_symbols(pid)`` returns a new cache for a live process, or None (gone, or not ours to read);
    ``walker``: user stacks hold tagged values (interpreted Method*s, compiled frames, gaps) besides pcs.
    """

    def __init__(
        self,
        open_symbols: Callable[[int], NativeResolver | None],
        kernel: KernelNames,
        walker: bool,
    ) -> None:
        self._open = open_symbols
        self.kernel = kernel
        self.walker = walker
        self.symbols: dict[int, NativeResolver | None] = {}  # None: no cache could be opened
        self.stacks_named = 0  # store keys looked at so far (the store hands them out in order)
        self.batches = 0

    def _symbols_of(self, pid: int) -> NativeResolver | None:
        if pid not in self.symbols:
            self.symbols[pid] = self._open(pid)
        return self.symbols[pid]

    def name_batch(self, new_keys: Sequence[StackKey]) -> int:
        """Resolve the native pcs and kernel addresses of ``new_keys`` (the store's keys from
        ``stacks_named`` on); returns how many were named."""
        for key in new_keys:
            symbols = self._symbols_of(key.tgid)
            if symbols is not None and not isinstance(key.user, int):
                for value in raw_addresses(stack_bytes(key.user)):
                    if not (self.walker and value & TAG_MASK):
                        symbols.resolve_native(value)
            if not isinstance(key.kernel, int):
                for addr in raw_addresses(stack_bytes(key.kernel)):
                    self.kernel.resolve(addr)
        self.stacks_named += len(new_keys)
        self.batches += 1
        return len(new_keys)

    def adopt_into(self, pid: int, target: FrameMemo) -> None:
        """Hand ``pid``'s native names to the symbolizer that names its stacks after the window, and free
        the window's cache of it (no batch comes after)."""
        found = self.symbols.pop(pid, None)
        if isinstance(found, FrameMemo) and found is not target:
            target.adopt_native(found)
        if found is not None and found is not target:
            found.close()

    def close(self) -> None:
        """Free every cache, the kernel's too."""
        for symbols in self.symbols.values():
            if symbols is not None:
                symbols.close()
        self.symbols.clear()
        self.kernel.close()
