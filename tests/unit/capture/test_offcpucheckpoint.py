"""The off-CPU copy beside the checkpoint journal (profiler/capture/offcpucheckpoint.py): written by the
runner at each checkpoint, read back whole or refused, and written into a recovered capture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.checkpoint import checkpoint_dir
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.offcpucheckpoint import (
    OFFCPU_CHECKPOINT_FILE,
    OffCpuCheckpoint,
    decode_offcpu_checkpoint,
    encode_offcpu_checkpoint,
    read_offcpu_checkpoint,
    write_offcpu_checkpoint,
)
from profiler.capture.read import read_meta, read_pid_offcpu, read_pid_offcpu_timeline
from profiler.errors import CaptureFormatError
from profiler.run.recovery import recover_capture
from tests.unit.capture.test_checkpoint import (
    GONE_PID,
    FakeKernel,
    NamedFrames,
    libc_function,
    runner_with_checkpoints,
    write_journal,
)
from tests.unit.run.test_runner import FakeOffCpu

PARKED = OffCpuEntry("park", "Executor task;run;Unsafe::park;futex_wait_[k]", 3_000_000_000, 7, "task 1.0")
SLEPT = OffCpuEntry("sleep", "main;Thread::sleep;do_nanosleep_[k]", 1_500_000_000, 3)


def test_the_copy_round_trips_with_its_contexts() -> None:
    taken = OffCpuCheckpoint(12.5, 2.0, 10, {GONE_PID: [PARKED, SLEPT], 7: []})
    assert decode_offcpu_checkpoint(encode_offcpu_checkpoint(taken)) == OffCpuCheckpoint(
        12.5, 2.0, 10, {GONE_PID: [PARKED, SLEPT], 7: []}
    )


@pytest.mark.parametrize(
    "pids",
    [
        {"../1": []},  # a pid names a directory of the capture
        {"0": []},
        {"12": [["nap", "main;x", 1, 1, None]]},  # no such cause
        {"12": [["sleep", "main;x", -1, 1, None]]},
        {"12": [["sleep", "main;x", 1.5, 1, None]]},
        {"12": [["sleep", "", 1, 1, None]]},
        {"12": [["sleep", "main;x", 1, 1, 5]]},
        {"12": [["sleep", "main;x", 1]]},
    ],
)
def test_a_hostile_copy_is_refused(tmp_path: Path, pids: dict[str, object]) -> None:
    payload = {"version": 1, "time": 1.0, "min_block_ms": 1.0, "sample_every": 10, "pids": pids}
    (tmp_path / OFFCPU_CHECKPOINT_FILE).write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="offcpu.json: unreadable"):
        read_offcpu_checkpoint(tmp_path)


def test_recover_writes_the_off_cpu_time_of_the_last_copy(tmp_path: Path) -> None:
    # GIVEN a killed run's journal and its off-CPU copy
    address, maps = libc_function("getpid")
    write_journal(tmp_path, maps, address)
    write_offcpu_checkpoint(checkpoint_dir(tmp_path), OffCpuCheckpoint(1.0, 2.0, 10, {GONE_PID: [PARKED, SLEPT]}))
    # WHEN it is recovered
    recover_capture(tmp_path, kernel=FakeKernel)
    # THEN the capture has the PID's off-CPU entries and the run's off-CPU options, as a normal end writes them
    assert read_meta(tmp_path).off_cpu_min_block_ms == 2.0
    assert read_meta(tmp_path).off_cpu_sample_every == 10
    assert read_pid_offcpu(tmp_path, GONE_PID) == [
        OffCpuEntry(PARKED.cause, PARKED.stack, PARKED.blocked_ns, PARKED.switches),
        SLEPT,
    ]
    # and no timeline: the copy is not split by interval (`analyze --from/--to` says so rather than zero)
    assert read_pid_offcpu_timeline(tmp_path, GONE_PID) is None


def test_recover_without_a_copy_writes_no_off_cpu_time(tmp_path: Path) -> None:
    address, maps = libc_function("getpid")
    write_journal(tmp_path, maps, address)
    recover_capture(tmp_path, kernel=FakeKernel)
    assert read_pid_offcpu(tmp_path, GONE_PID) is None
    assert read_meta(tmp_path).off_cpu_min_block_ms is None


def test_a_damaged_copy_stops_recovery_with_the_way_out(tmp_path: Path) -> None:
    address, maps = libc_function("getpid")
    write_journal(tmp_path, maps, address)
    (checkpoint_dir(tmp_path) / OFFCPU_CHECKPOINT_FILE).write_text("{")
    with pytest.raises(CaptureFormatError, match="move it aside"):
        recover_capture(tmp_path, kernel=FakeKernel)


class CheckpointedOffCpu(FakeOffCpu):
    """FakeOffCpu whose sums grow by one block per checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    def checkpoint_entries(self) -> dict[int, list[OffCpuEntry]]:
        self.taken += 1
        return {101: [OffCpuEntry("lock", "main;run;futex_wait_[k]", self.taken * 1_000_000, self.taken)]}


def test_the_runner_copies_the_off_cpu_sums_at_each_checkpoint_and_recover_writes_the_last(tmp_path: Path) -> None:
    # GIVEN an --off-cpu window with checkpoints, killed before its capture was written
    runner, components, out = runner_with_checkpoints(tmp_path, 1.6)
    offcpu = components.offcpu = CheckpointedOffCpu()
    runner._window(components)
    taken = runner.journal.cost.count if runner.journal is not None else 0
    assert taken >= 2 and offcpu.taken == taken and not (out / capture.META_FILE).exists()
    # WHEN it is recovered
    recover_capture(out, kernel=FakeKernel, symbols=lambda pid, saved: (NamedFrames(), "offline"))
    # THEN the last checkpoint's sums are the capture's off-CPU time
    assert read_pid_offcpu(out, 101) == [
        OffCpuEntry("lock", "main;run;futex_wait_[k]", taken * 1_000_000, taken)
    ]
