"""Blocked time per timeline interval (``profiler run --off-cpu``; docs/offcpu.md, "Per interval").

The kernel keeps one running sum per block key for the whole window. At each interval's end the runner
takes a snapshot of those sums and of the threads switched out at that moment; the difference between two
snapshots is the time of the blocks that ended in the interval. A block still open at a snapshot is split
there: the part up to the snapshot counts in the interval it fell in (a *credit*), and the interval where
the block ends gets its whole sum minus what was credited before. So a thread asleep for 25 s counts in
each 10 s slice it slept in, and the intervals add up to the window's sums exactly.

Pure: snapshots in, per-interval sums out; ``OffCpuTracer`` reads the maps (profiler/sampling/offcpu.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # offcpu.py imports this module
    from .offcpu import RawBlock


def block_key(block: RawBlock) -> RawBlock:
    return replace(block, blocked_ns=0, switches=0)


def sums_of(blocks: Iterable[RawBlock]) -> dict[RawBlock, tuple[int, int]]:
    """(blocked_ns, switches) per key, summed."""
    sums: dict[RawBlock, tuple[int, int]] = {}
    for block in blocks:
        key = block_key(block)
        ns, switches = sums.get(key, (0, 0))
        sums[key] = (ns + block.blocked_ns, switches + block.switches)
    return sums


@dataclass(frozen=True)
class OpenBlock:
    """A thread switched out at a snapshot: since ``since_ns`` (monotonic), under ``key``."""

    tid: int
    since_ns: int
    key: RawBlock
    weight: int = 1  # the switch-outs it stands for (--off-cpu-sample-every: weighted in the kernel)


@dataclass
class _Credit:
    since_ns: int
    key: RawBlock
    until_ns: int  # credited up to here
    credited_ns: int
    weight: int


@dataclass
class OffCpuTimeline:
    """Snapshots of the kernel's sums at interval ends, split into per-interval sums."""

    min_block_ns: int
    _previous: dict[RawBlock, tuple[int, int]] = field(default_factory=dict)
    _credits: dict[int, _Credit] = field(default_factory=dict)
    _intervals: dict[int, dict[RawBlock, list[int]]] = field(default_factory=dict)
    last_interval: int = -1

    def _add(self, interval: int, key: RawBlock, ns: int, switches: int) -> None:
        if ns or switches:
            entry = self._intervals.setdefault(interval, {}).setdefault(key, [0, 0])
            entry[0] += ns
            entry[1] += switches

    def _take_difference(self, interval: int, sums: Mapping[RawBlock, tuple[int, int]]) -> None:
        for key, (ns, switches) in sums.items():
            before_ns, before_switches = self._previous.get(key, (0, 0))
            self._add(interval, key, ns - before_ns, switches - before_switches)
        self._previous = dict(sums)

    def snapshot(
        self, interval: int, now_ns: int, sums: Mapping[RawBlock, tuple[int, int]], open_blocks: Iterable[OpenBlock]
    ) -> None:
        """Interval ``interval`` ends at ``now_ns``: ``sums`` are the kernel's (weighted) sums so far,
        ``open_blocks`` the threads switched out now (an open block counts times its weight)."""
        self.last_interval = max(self.last_interval, interval)
        self._take_difference(interval, sums)
        still_open = {block.tid: block for block in open_blocks}
        for tid in list(self._credits):
            credit = self._credits[tid]
            current = still_open.get(tid)
            if current is None or current.since_ns != credit.since_ns:  # ended: its whole sum came in now
                self._add(interval, credit.key, -credit.credited_ns, 0)
                del self._credits[tid]
        for block in still_open.values():
            if now_ns - block.since_ns < self.min_block_ns:
                continue  # may end too short to be summed: nothing to credit
            credit = self._credits.setdefault(
                block.tid, _Credit(block.since_ns, block.key, block.since_ns, 0, max(block.weight, 1))
            )
            part = (now_ns - credit.until_ns) * credit.weight
            credit.until_ns = now_ns
            credit.credited_ns += part
            self._add(interval, block.key, part, 0)

    def finish(self, interval: int, final_blocks: Iterable[RawBlock]) -> dict[int, list[RawBlock]]:
        """The window ended in ``interval`` with ``final_blocks`` (the kernel's sums and the blocks closed
        at the end, weighted): per-interval blocks, each interval's keys with time or switches."""
        interval = max(interval, self.last_interval, 0)
        self._take_difference(interval, sums_of(final_blocks))
        for credit in self._credits.values():  # every credited block is in the final sums by now
            self._add(interval, credit.key, -credit.credited_ns, 0)
        self._credits.clear()
        result: dict[int, list[RawBlock]] = {}
        for index in sorted(self._intervals):
            blocks = [
                replace(key, blocked_ns=max(0, ns), switches=max(0, switches))
                for key, (ns, switches) in self._intervals[index].items()
                if ns > 0 or switches > 0
            ]
            if blocks:
                result[index] = blocks
        return result


def split_span(start_ns: int, end_ns: int, ticks: Iterable[tuple[int, int]], last_interval: int) -> dict[int, int]:
    """Nanoseconds of [``start_ns``, ``end_ns``] per interval, ``ticks`` being (interval, its end) in order;
    what lies after the last tick belongs to ``last_interval`` (as for a block still open at the end). The
    parts add up to the span exactly."""
    parts: dict[int, int] = {}
    cursor = start_ns
    for interval, tick_ns in ticks:
        cut = min(max(tick_ns, cursor), end_ns)
        if cut > cursor:
            parts[interval] = parts.get(interval, 0) + cut - cursor
            cursor = cut
    if end_ns > cursor:
        parts[last_interval] = parts.get(last_interval, 0) + end_ns - cursor
    return parts


def by_pid(blocks: Iterable[RawBlock]) -> dict[int, list[RawBlock]]:
    grouped: dict[int, list[RawBlock]] = {}
    for block in blocks:
        grouped.setdefault(block.tgid, []).append(block)
    return grouped

