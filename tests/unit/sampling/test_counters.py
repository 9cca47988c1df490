"""Counters against a fake perf syscall layer: scaling, unsupported events, cycles measured vs estimated."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from profiler.capture.format import CounterValue
from profiler.errors import ConfigError
from profiler.sampling.counters import (
    CounterGroup,
    derive_cycles,
    nominal_cpu_hz,
    parse_cpu_mhz,
    parse_model_name_hz,
    scale_counts,
)
from profiler.sampling.perf_event import (
    PERF_TYPE_HARDWARE,
    EventSpec,
    PerfEventAttr,
    RawCount,
    counting_attr,
    event_spec,
)


@dataclass
class FakePerf:
    """A kernel in a box: per (tid, event) counts, a set of events the 'PMU' lacks."""

    threads_of: dict[int, list[int]]
    counts: dict[tuple[int, str], RawCount] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)  # event -> errno
    reject_inherit_thread: bool = False
    opened: dict[int, tuple[int, str, bool]] = field(default_factory=dict)
    closed: list[int] = field(default_factory=list)
    next_fd: int = 100

    def open(self, spec: EventSpec, tid: int, inherit_thread: bool) -> int:
        if spec.name in self.missing:
            raise OSError(self.missing[spec.name], "nope")
        if inherit_thread and self.reject_inherit_thread:
            raise OSError(errno.EINVAL, "bad attr")
        self.next_fd += 1
        self.opened[self.next_fd] = (tid, spec.name, inherit_thread)
        return self.next_fd

    def read(self, fd: int) -> RawCount:
        tid, name, _ = self.opened[fd]
        return self.counts.get((tid, name), RawCount(0, 0, 0))

    def close(self, fd: int) -> None:
        self.closed.append(fd)

    def threads(self, pid: int) -> list[int]:
        return list(self.threads_of.get(pid, []))


NO_PMU = {name: errno.ENOENT for name in ("cycles", "instructions", "branches", "branch-misses")}


def test_attr_layout_matches_the_kernel_abi() -> None:
    attr = counting_attr(event_spec("task-clock"))
    assert attr.size == 136 and PerfEventAttr.flags.offset == 40 and PerfEventAttr.config3.offset == 128
    assert attr.read_format == 3  # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING
    assert attr.flags & (1 << 1) and attr.flags & (1 << 35)  # inherit, inherit_thread
    assert not attr.flags & 1  # enabled at open


def test_scaling_multiplies_each_thread_by_enabled_over_running() -> None:
    total = scale_counts([RawCount(100, 1000, 500), RawCount(30, 600, 600), RawCount(0, 0, 0)])
    assert total.value == pytest.approx(100 * 2 + 30)
    assert (total.enabled_ns, total.running_ns, total.note) == (1600, 1100, "scaled")
    never = scale_counts([RawCount(0, 1000, 0)])
    assert never.value is None and "never scheduled" in never.note
    assert scale_counts([RawCount(5, 10, 10)]).note == ""


def test_hardware_counters_measured_and_scaled() -> None:
    fake = FakePerf({42: [42, 43]})
    fake.counts = {
        (42, "cycles"): RawCount(1_000, 2_000, 1_000),
        (43, "cycles"): RawCount(500, 1_000, 1_000),
        (42, "task-clock"): RawCount(2_000, 2_000, 2_000),
        (43, "task-clock"): RawCount(1_000, 1_000, 1_000),
    }
    group = CounterGroup(
        ["cycles", "instructions", "task-clock"], syscalls=fake, nominal_hz=(2e9, "test"), source="perf"
    )
    assert group.probe() == {"cycles": "ok", "instructions": "ok", "task-clock": "ok"}
    group.add_pid(42)
    counters = group.read(42)
    assert counters.cycles == pytest.approx(2_500) and counters.cycles_estimated is False
    assert counters.events["cycles"].note == "scaled" and counters.events["cycles"].scaled
    assert counters.events["instructions"].value == 0 and counters.events["instructions"].supported
    assert counters.cpu_seconds == pytest.approx(3e-6)
    assert group.cycles_source == "hardware"
    # one fd per (thread, event), each inherited into threads only
    assert sorted((tid, name) for tid, name, _ in fake.opened.values() if tid != group_probe_tid(fake)) == [
        (42, "cycles"),
        (42, "instructions"),
        (42, "task-clock"),
        (43, "cycles"),
        (43, "instructions"),
        (43, "task-clock"),
    ]
    assert all(inherit for _, _, inherit in fake.opened.values())


def group_probe_tid(fake: FakePerf) -> int:
    import os

    return os.getpid()


def test_unsupported_events_are_none_with_reason_and_cycles_estimated() -> None:
    fake = FakePerf({7: [7]}, missing=dict(NO_PMU))
    fake.counts = {(7, "task-clock"): RawCount(1_500_000_000, 10, 10)}
    group = CounterGroup(
        ["cycles", "instructions", "branches", "branch-misses", "task-clock"],
        syscalls=fake,
        nominal_hz=(2.0e9, "test"),
        source="perf",
    )
    group.add_pid(7)
    counters = group.read(7)
    for name in NO_PMU:
        value = counters.events[name]
        assert value.value is None and value.supported is False and "ENOENT" in value.note and value.value != 0
        assert counters.get(name) is None
    assert counters.cycles == pytest.approx(1.5 * 2.0e9) and counters.cycles_estimated is True
    assert group.cycles_source == "estimated"


def test_task_clock_always_counted_and_unknown_event_is_config_error() -> None:
    group = CounterGroup(["page-faults"], syscalls=FakePerf({}), nominal_hz=(1e9, "t"), source="perf")
    assert [spec.name for spec in group.specs] == ["page-faults", "task-clock"]
    with pytest.raises(ConfigError, match="unknown perf event 'cycels'"):
        CounterGroup(["cycels"], syscalls=FakePerf({}))
    assert event_spec("r003c") == EventSpec("r003c", 4, 0x3C)
    assert event_spec("cycles").type == PERF_TYPE_HARDWARE


def test_exited_pid_keeps_frozen_values_and_fds_are_released() -> None:
    fake = FakePerf({9: [9, 10]})
    fake.counts = {(9, "task-clock"): RawCount(100, 100, 100), (10, "task-clock"): RawCount(50, 50, 50)}
    group = CounterGroup(["task-clock"], syscalls=fake, nominal_hz=(1e9, "t"), source="perf")
    group.add_pid(9)
    group.pid_exited(9)
    assert group.open_fds() == 0
    fake.counts[(9, "task-clock")] = RawCount(999, 999, 999)  # later changes are not seen
    assert group.read(9).events["task-clock"].value == 150
    with pytest.raises(KeyError):
        group.read(12345)


def test_vanished_pid_is_recorded_not_an_error() -> None:
    group = CounterGroup(["task-clock"], syscalls=FakePerf({}), nominal_hz=(1e9, "t"), source="perf")
    group.add_pid(555)
    value = group.read(555).events["task-clock"]
    assert value.value is None and not value.supported and "exited before" in value.note
    assert group.read(555).cycles is None


def test_old_kernel_without_inherit_thread_falls_back_and_says_so() -> None:
    fake = FakePerf({3: [3]}, reject_inherit_thread=True)
    fake.counts = {(3, "task-clock"): RawCount(10, 10, 10)}
    group = CounterGroup(["task-clock"], syscalls=fake, nominal_hz=(1e9, "t"), source="perf")
    group.add_pid(3)
    assert group.read(3).events["task-clock"].note == "children included"
    assert not any(inherit for _, _, inherit in fake.opened.values())


def test_partial_thread_failures_are_noted() -> None:
    class Flaky(FakePerf):
        def open(self, spec: EventSpec, tid: int, inherit_thread: bool) -> int:
            if tid == 21:
                raise OSError(errno.EMFILE, "too many")
            if tid == 22:
                raise OSError(errno.ESRCH, "gone")  # ended between listing and opening: ignored
            return super().open(spec, tid, inherit_thread)

    fake = Flaky({20: [20, 21, 22]})
    fake.counts = {(20, "task-clock"): RawCount(10, 10, 10)}
    group = CounterGroup(["task-clock"], syscalls=fake, nominal_hz=(1e9, "t"), source="perf")
    group.add_pid(20)
    value = group.read(20).events["task-clock"]
    assert value.value == 10 and "incomplete: 1 thread(s)" in value.note and "EMFILE" in value.note


def test_zero_hardware_cycles_for_a_busy_process_fall_back_to_the_estimate() -> None:
    events = {
        "cycles": CounterValue(0.0, True, 10, 10),
        "task-clock": CounterValue(2e9, True, 10, 10),
    }
    assert derive_cycles(events, 1e9) == (pytest.approx(2e9), True, pytest.approx(2.0))
    events["cycles"] = CounterValue(5e9, True, 10, 10)
    assert derive_cycles(events, 1e9) == (5e9, False, 2.0)
    assert derive_cycles({"task-clock": CounterValue(None, False)}, 1e9) == (None, False, None)


@pytest.mark.parametrize(
    ("text", "hz"),
    [
        ("model name\t: Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz\n", 2.10e9),
        ("model name\t: Some CPU @ 800MHz\n", 8e8),
        ("model name\t: AMD EPYC\ncpu MHz\t\t: 2596.142\n", None),
    ],
)
def test_model_name_frequency(text: str, hz: float | None) -> None:
    assert parse_model_name_hz(text) == (pytest.approx(hz) if hz else None)


def test_nominal_hz_sources_in_order(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpufreq = tmp_path / "cpufreq"
    cpufreq.mkdir()
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.142\n")
    assert nominal_cpu_hz(cpuinfo, cpufreq) == (pytest.approx(2596.142e6), f"{cpuinfo} cpu MHz")
    (cpufreq / "cpuinfo_max_freq").write_text("3500000\n")
    assert nominal_cpu_hz(cpuinfo, cpufreq) == (3.5e9, str(cpufreq / "cpuinfo_max_freq"))
    (cpufreq / "base_frequency").write_text("2400000\n")
    assert nominal_cpu_hz(cpuinfo, cpufreq)[0] == 2.4e9
    cpuinfo.write_text("model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz\ncpu MHz\t\t: 1200.0\n")
    assert nominal_cpu_hz(cpuinfo, cpufreq) == (pytest.approx(2.4e9), f"{cpuinfo} model name")
    assert nominal_cpu_hz(tmp_path / "none", tmp_path / "none")[0] is None
    assert parse_cpu_mhz("cpu MHz : garbage\ncpu MHz : 1000\n") == 1e9
