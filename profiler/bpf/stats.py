"""The kernel's BPF run-time statistics: what our programs cost during the window (overhead.json).

While the statistics are on, every run of every BPF program on the host pays two clock reads: our
off-CPU program at each context switch, and other tools' and the network's programs alike (+30 ns a run
here, as much again as an empty program at a context switch: docs/benchmarks/offcpu.md). So they are on
for slices of the window (``StatsSlices``: 1 s in 10 by default), and the window's run time and count are
the slices' scaled to the window; their ratio, the time per run, is measured as it is.

Held on by a file descriptor (Linux 5.8+), which the kernel closes even after a SIGKILL; the
kernel.bpf_stats_enabled sysctl (set, then restored) only where that is missing, and then all window.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
SLICE_PERIOD = 10.0  # seconds: the statistics are on for SLICE_ON seconds at the start of each period
SLICE_ON = 1.0

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_ENABLE_STATS, _BPF_STATS_RUN_TIME = 32, 0

Totals = tuple[int, int]  # run_time_ns, run_cnt


def stats_fd() -> int | None:
    """BPF run-time statistics held on by a file descriptor (Linux 5.8+): the kernel turns them off
    when it closes, even after a SIGKILL, where a sysctl we set would stay on for every BPF program."""
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 16)(_BPF_STATS_RUN_TIME)
        fd = int(libc.syscall(number, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr)))
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None


def stats_on_now() -> bool:
    """Whether the statistics are on host-wide (someone's file descriptor or the sysctl)."""
    try:
        return STATS_SYSCTL.read_text().strip() == "1"
    except OSError:
        return False


@contextmanager
def bpf_stats_enabled() -> Iterator[bool]:
    """BPF run-time statistics on for the block (off after); yields whether they are on. The
    kernel.bpf_stats_enabled sysctl (set, then restored) only where the fd way is missing."""
    fd = stats_fd()
    if fd is not None:
        try:
            yield True
        finally:
            os.close(fd)
        return
    try:
        before = STATS_SYSCTL.read_text().strip()
        if before != "1":
            STATS_SYSCTL.write_text("1")
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        if before != "1":
            try:
                STATS_SYSCTL.write_text(before)
            except OSError:
                pass


def bpf_prog_run_stats(prog_ids: Sequence[int]) -> Totals | None:
    """Sum of run_time_ns and run_cnt of the given programs, from /proc/self/fdinfo of their fds."""
    wanted = {int(i) for i in prog_ids}
    if not wanted:
        return None
    run_time = run_count = 0
    seen: set[int] = set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        prog_id = fields.get("prog_id")
        if prog_id is None or int(prog_id) not in wanted or int(prog_id) in seen:
            continue
        seen.add(int(prog_id))
        run_time += int(fields.get("run_time_ns", "0").strip() or 0)
        run_count += int(fields.get("run_cnt", "0").strip() or 0)
    return (run_time, run_count) if seen else None


class StatsSlices:
    """The statistics on for ``on`` seconds at the start of every ``period`` of the window, off between.

    ``read`` gives our programs' cumulative totals; they are read at each slice's start and end, so the
    slices' own counts are exact. The window's figure is their sum × window / measured seconds. Counts
    that grew between slices (another tool had the statistics on meanwhile) are left out: their span is
    unknown, and the slices' rate already stands for those seconds. Once another tool is seen holding them
    on (at the start, or when we close ours), ours stay on to the end: closing saves nothing then, and
    the rest of the window is measured whole.
    """

    def __init__(
        self,
        read: Callable[[], Totals | None],
        *,
        period: float = SLICE_PERIOD,
        on: float = SLICE_ON,
        open_fd: Callable[[], int | None] = stats_fd,
        others_on: Callable[[], bool] = stats_on_now,
        close_fd: Callable[[int], None] = os.close,
    ) -> None:
        # open_fd/close_fd turn them on and off (a file descriptor; tests pass fakes)
        self._read, self._open, self._others_on, self._close = read, open_fd, others_on, close_fd
        self.period, self.on = period, on
        self._fd: int | None = None
        self._start = self._since = 0.0
        self._last: Totals = (0, 0)
        self._sliced: Totals = (0, 0)  # counted in our slices
        self.measured = 0.0  # seconds our slices covered
        self.whole = False  # on to the end from some moment: no more slices
        self.sliced = False  # a slice ended before the window did: the figures are scaled
        self._readable = False  # our programs' totals could be read at the start

    def begin(self, now: float) -> bool:
        """On from ``now`` (the window's start); False when they cannot be turned on this way."""
        self.whole = self._others_on()
        self._fd = self._open()
        if self._fd is None:
            return False
        self._start = self._since = now
        first = self._read()
        self._readable = first is not None
        self._last = first or (0, 0)
        return True

    def tick(self, now: float) -> None:
        """Ends or begins a slice when ``now`` crosses into the off or on part of a period."""
        if self.whole:
            return
        in_slice = (now - self._start) % self.period < self.on
        if self._fd is not None and not in_slice:
            self._end_slice(now)
            self.sliced = True
            if self._others_on():  # someone else's: they run on between our slices anyway
                self._reopen(now)
                self.whole = True
        elif self._fd is None and in_slice:
            self._delta()  # another tool's counts between our slices: left out
            self._reopen(now)

    def finish(self, now: float) -> tuple[Totals, float] | None:
        """The window's (run_time_ns, run_cnt), estimated from the slices, and the seconds they measured;
        statistics off. None when nothing could be read."""
        if self._fd is not None:
            self._end_slice(now)
        if self.measured <= 0 or not self._readable:
            return None
        scale = max(now - self._start, self.measured) / self.measured
        return (round(self._sliced[0] * scale), round(self._sliced[1] * scale)), self.measured

    def close(self) -> None:
        """Statistics off (a slice's end, or a failure before ``finish``)."""
        if self._fd is not None:
            self._close(self._fd)
            self._fd = None

    def _end_slice(self, now: float) -> None:
        """The slice open since ``_since`` counted and measured; statistics off."""
        self._sliced = _add(self._sliced, self._delta())
        self.measured += now - self._since
        self.close()

    def _reopen(self, now: float) -> None:
        self._fd = self._open()
        self._since = now

    def _delta(self) -> Totals:
        current = self._read() or self._last
        delta = (current[0] - self._last[0], current[1] - self._last[1])
        self._last = current
        return delta


def _add(a: Totals, b: Totals) -> Totals:
    return a[0] + b[0], a[1] + b[1]


SYSCTL_HELD = -1  # StatsSlices' handle for statistics held by the sysctl (bpf_stats_enabled restores it)


def _kept(_: int) -> None:
    """The sysctl's statistics stay on until bpf_stats_enabled's block ends."""


@contextmanager
def window_stats(read: Callable[[], Totals | None], now: float) -> Iterator[StatsSlices | None]:
    """The statistics for a window starting at ``now``: in slices (``StatsSlices``) where a file descriptor
    can hold them, else through the sysctl for the whole window; None where neither works. Off after."""
    slices = StatsSlices(read)
    if slices.begin(now):
        try:
            yield slices
        finally:
            slices.close()
        return
    with bpf_stats_enabled() as on:
        if not on:
            yield None
            return
        # the sysctl's: on until the block ends, one slice as long as the window
        whole = StatsSlices(read, period=math.inf, on=math.inf, open_fd=lambda: SYSCTL_HELD, close_fd=_kept)
        whole.begin(now)
        yield whole

