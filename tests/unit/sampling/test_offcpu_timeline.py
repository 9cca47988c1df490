"""Blocked time per interval (profiler/sampling/offcpu_timeline.py), its file (offcpu_timeline.folded)
and the analysis's cut by sub-window (coordinator/analysis/timeline.py ``window_offcpu``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.analysis.timeline import IntervalSpan, window_offcpu
from profiler.capture import format as capture
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import read_pid_offcpu_timeline
from profiler.errors import CaptureFormatError
from profiler.sampling.offcpu import RawBlock
from profiler.sampling.offcpu_timeline import OffCpuTimeline, OpenBlock, block_key, split_span

S = 1_000_000_000
MIN = 1_000_000
SLEEP = RawBlock(10, 1, 2, 1, "sleeper", 0, 0)
PARK = RawBlock(10, 3, 4, 1, "parker", 0, 0)


def _sums(*pairs: tuple[RawBlock, int, int]) -> dict[RawBlock, tuple[int, int]]:
    return {block_key(block): (ns, switches) for block, ns, switches in pairs}


def _totals(per_interval: dict[int, list[RawBlock]]) -> dict[int, dict[str, int]]:
    return {i: {b.comm: b.blocked_ns for b in blocks} for i, blocks in per_interval.items()}


def test_closed_blocks_go_to_the_interval_they_ended_in() -> None:
    timeline = OffCpuTimeline(MIN)
    timeline.snapshot(0, 10 * S, _sums((SLEEP, 3 * S, 3)), [])
    timeline.snapshot(1, 20 * S, _sums((SLEEP, 5 * S, 5), (PARK, 2 * S, 1)), [])
    final = [RawBlock(10, 1, 2, 1, "sleeper", 6 * S, 6), RawBlock(10, 3, 4, 1, "parker", 2 * S, 1)]
    per_interval = timeline.finish(2, final)
    assert _totals(per_interval) == {0: {"sleeper": 3 * S}, 1: {"sleeper": 2 * S, "parker": 2 * S}, 2: {"sleeper": S}}
    assert sum(b.switches for blocks in per_interval.values() for b in blocks) == 7


def test_a_block_open_across_interval_ends_is_split_where_it_lay() -> None:
    # GIVEN a thread that blocks at 5 s and wakes at 27 s (the kernel sums the 22 s at its switch-in)
    timeline = OffCpuTimeline(MIN)
    timeline.snapshot(0, 10 * S, {}, [OpenBlock(77, 5 * S, block_key(SLEEP))])
    timeline.snapshot(1, 20 * S, {}, [OpenBlock(77, 5 * S, block_key(SLEEP))])
    timeline.snapshot(2, 30 * S, _sums((SLEEP, 22 * S, 1)), [])
    per_interval = timeline.finish(2, [RawBlock(10, 1, 2, 1, "sleeper", 22 * S, 1)])
    # THEN each interval holds the part of the block that lay in it, and they add up to the block
    assert _totals(per_interval) == {0: {"sleeper": 5 * S}, 1: {"sleeper": 10 * S}, 2: {"sleeper": 7 * S}}
    assert [b.switches for b in per_interval[2]] == [1]


def test_blocks_open_at_the_end_and_reblocked_threads_add_up() -> None:
    timeline = OffCpuTimeline(MIN)  # --off-cpu-sample-every 10: sums arrive weighted, open blocks carry their weight
    timeline.snapshot(
        0, 10 * S, {}, [OpenBlock(1, 8 * S, block_key(PARK), 10), OpenBlock(2, 10 * S - 1, block_key(SLEEP), 10)]
    )
    # thread 1 woke at 12 s and blocked again at 13 s; the window ends at 15 s with both still open
    timeline.snapshot(1, 14 * S, _sums((PARK, 40 * S, 10)), [OpenBlock(1, 13 * S, block_key(PARK), 10)])
    final = [RawBlock(10, 3, 4, 1, "parker", 40 * S + 20 * S, 20), RawBlock(10, 1, 2, 1, "sleeper", 50 * S + 10, 10)]
    per_interval = timeline.finish(1, final)
    # the block shorter than the minimum at the first snapshot was not credited there
    assert _totals(per_interval) == {0: {"parker": 20 * S}, 1: {"parker": 40 * S, "sleeper": 50 * S + 10}}
    assert sum(b.blocked_ns for blocks in per_interval.values() for b in blocks) == sum(b.blocked_ns for b in final)


def test_timeline_file_round_trips_and_names_bad_lines(tmp_path: Path) -> None:
    entries = {
        0: [OffCpuEntry("park", "t;Unsafe::park;futex_wait_[k]", 5, 1)],
        3: [OffCpuEntry("net", "a thread;x y;ep_poll_[k]", 7, 2), OffCpuEntry("sleep", "s;nanosleep_[k]", 9, 3)],
    }
    capture.write_offcpu_timeline(tmp_path, 42, entries)
    read = read_pid_offcpu_timeline(tmp_path, 42)
    assert read is not None and {i: sorted(e, key=lambda x: x.stack) for i, e in read.items()} == {
        i: sorted(e, key=lambda x: x.stack) for i, e in entries.items()
    }
    assert read_pid_offcpu_timeline(tmp_path, 43) is None  # older captures: no file
    path = capture.pid_dir(tmp_path, 42) / capture.OFFCPU_TIMELINE_FILE
    path.write_text("0 park 5 1 t;f\nx park 5 1 t;f\n")
    with pytest.raises(CaptureFormatError, match=r"offcpu_timeline.folded:2: expected 'interval cause"):
        read_pid_offcpu_timeline(tmp_path, 42)
    path.write_text("0 park 5 1 t;f\n1 nap 5 1 t;f\n")
    with pytest.raises(CaptureFormatError, match=r"offcpu_timeline.folded:2: unknown cause 'nap'"):
        read_pid_offcpu_timeline(tmp_path, 42)


def test_window_cut_sums_the_spans_intervals() -> None:
    stack = "t;Unsafe::park;futex_wait_[k]"
    by_interval = {
        0: [OffCpuEntry("park", stack, 1, 1)],
        1: [OffCpuEntry("park", stack, 10, 1), OffCpuEntry("net", "u;ep_poll_[k]", 100, 1)],
        2: [OffCpuEntry("park", stack, 1000, 1)],
        3: [OffCpuEntry("park", stack, 10000, 1)],  # past the capture's last interval: belongs to it
    }
    span = IntervalSpan(1, 2, 10.0, 30.0, 3)
    cut = window_offcpu(by_interval, span)
    assert {(e.cause, e.stack): e.blocked_ns for e in cut} == {("park", stack): 11010, ("net", "u;ep_poll_[k]"): 100}
    assert window_offcpu(by_interval, IntervalSpan(0, 0, 10.0, 30.0, 3)) == (OffCpuEntry("park", stack, 1, 1),)


def test_a_whole_window_span_is_split_at_the_interval_ends_and_adds_up() -> None:
    ticks = [(0, 10 * S), (1, 20 * S), (2, 30 * S)]
    assert split_span(4 * S, 31 * S, ticks, 2) == {0: 6 * S, 1: 10 * S, 2: 11 * S}  # after the last tick: the last
    assert split_span(12 * S, 15 * S, ticks, 2) == {1: 3 * S}
    assert split_span(5, 5, ticks, 2) == {} and split_span(5, 9, [], 0) == {0: 4}
