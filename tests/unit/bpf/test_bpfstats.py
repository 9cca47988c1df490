"""The BPF statistics in slices (profiler/bpf/stats.py): on 1 s in 10, the window's run time and count
estimated from the slices; other tools' statistics neither lost nor multiplied. Fakes for the kernel:
a program that runs at a steady rate while statistics are on (ours or another tool's)."""

from __future__ import annotations

import pytest

from profiler.bpf.stats import StatsSlices


class FakeKernel:
    """Counts a program's runs (1,000 a second, 200 ns each) only while someone holds statistics on."""

    RATE, NS = 1000, 200

    def __init__(self) -> None:
        self.now = 0.0
        self.ours: set[int] = set()
        self.others = False
        self.counted = 0.0  # seconds counted so far
        self._since = 0.0
        self.opened = 0

    def advance(self, to: float) -> None:
        if self.ours or self.others:
            self.counted += to - self._since
        self._since = self.now = to

    def read(self) -> tuple[int, int]:
        runs = round(self.counted * self.RATE)
        return runs * self.NS, runs

    def open_fd(self) -> int:
        self.opened += 1
        self.ours.add(self.opened)
        return self.opened

    def close_fd(self, fd: int) -> None:
        self.ours.remove(fd)

    def slices(self) -> StatsSlices:
        return StatsSlices(self.read, open_fd=self.open_fd, close_fd=self.close_fd, others_on=lambda: self.others)


def run(kernel: FakeKernel, slices: StatsSlices, seconds: float, poll: float = 0.5, others_at: float | None = None):
    assert slices.begin(kernel.now)
    t = 0.0
    while t < seconds:
        t = min(seconds, t + poll)
        if others_at is not None and t >= others_at:
            kernel.advance(t)
            kernel.others = True
        kernel.advance(t)
        slices.tick(t)
    return slices.finish(t)


def test_slices_measure_a_tenth_of_the_window_and_scale_to_it() -> None:
    # GIVEN a program running 1,000 times a second, 200 ns a run, for a 60 s window
    kernel = FakeKernel()
    slices = kernel.slices()
    result = run(kernel, slices, 60.0)
    assert result is not None
    (run_time, runs), measured = result
    # THEN statistics were on ~6 s of it (1 s in 10), and the estimate is the window's
    assert measured == pytest.approx(6.0, abs=0.6)
    assert kernel.counted == pytest.approx(measured)
    assert runs == pytest.approx(60_000, rel=0.01) and run_time == pytest.approx(60_000 * 200, rel=0.01)
    # AND they are off at the end; the figures say they are scaled
    assert not kernel.ours and slices.sliced


def test_a_window_shorter_than_a_slice_is_measured_whole() -> None:
    kernel = FakeKernel()
    slices = kernel.slices()
    result = run(kernel, slices, 0.8, poll=0.4)
    assert result is not None and result[0] == (800 * 200, 800) and result[1] == pytest.approx(0.8)
    assert not slices.sliced  # measured whole: nothing scaled


def test_another_tools_statistics_are_not_multiplied() -> None:
    # GIVEN a tool that turns statistics on host-wide 25 s into our 60 s window (and keeps them)
    kernel = FakeKernel()
    result = run(kernel, kernel.slices(), 60.0, others_at=25.0)
    assert result is not None
    (_, runs), _ = result
    # THEN the estimate stays the window's: counts between our slices are not scaled up tenfold
    assert runs == pytest.approx(60_000, rel=0.05)


def test_statistics_already_on_are_counted_whole() -> None:
    kernel = FakeKernel()
    kernel.others = True
    slices = kernel.slices()
    (_, runs), measured = run(kernel, slices, 30.0) or ((0, 0), 0.0)
    assert slices.whole and not slices.sliced and measured == pytest.approx(30.0) and runs == 30_000


def test_nothing_readable_gives_no_figure() -> None:
    kernel = FakeKernel()
    slices = StatsSlices(lambda: None, open_fd=kernel.open_fd, close_fd=kernel.close_fd, others_on=lambda: False)
    assert slices.begin(0.0)
    slices.tick(5.0)
    assert slices.finish(10.0) is None and not kernel.ours


def test_no_way_to_turn_them_on() -> None:
    slices = StatsSlices(lambda: (0, 0), open_fd=lambda: None, close_fd=lambda fd: None, others_on=lambda: False)
    assert not slices.begin(0.0)
