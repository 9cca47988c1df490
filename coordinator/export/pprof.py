"""pprof export: a gzip-compressed ``perftools.profiles.Profile`` (google/pprof's profile.proto,
vendored beside this module with the protobuf classes protoc generated from it) whose samples carry
the labels Pyroscope and ``go tool pprof -tags/-tagfocus`` filter by: run, host, pid, process
(host:pid), role, engine, kind, thread and task. Pure: an ExportSet in, a message or bytes out.
"""

from __future__ import annotations

import gzip
from typing import TYPE_CHECKING, Any

from coordinator.export.stacks import ExportSet, OffCpuStack, TaskStack

if TYPE_CHECKING:
    from coordinator.export import profile_pb2

# Label keys on every sample, in this order (docs/exports.md).
# ``process`` is host:pid: pprof's -tagfocus filters on one label key, so a PID of one host needs one key.
LABEL_KEYS: tuple[str, ...] = ("run", "host", "pid", "process", "role", "engine", "kind", "thread", "task")
SAMPLES_TYPE = ("samples", "count")
CPU_TYPE = ("cpu", "nanoseconds")
CYCLES_TYPE = ("cycles", "count")
OFFCPU_TYPE = ("off_cpu", "nanoseconds")  # blocked time (runs with --off-cpu): its own samples
CAUSE_LABEL = "cause"  # on off-CPU samples only: the cause of the wait (docs/offcpu.md)


class StringTable:
    """pprof's string table: index 0 is the empty string, each string stored once."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        index = self._index.get(text)
        if index is None:
            index = self._index[text] = len(self.strings)
            self.strings.append(text)
        return index


def _period_ns(export: ExportSet) -> int | None:
    """Nanoseconds between samples of the (first) sampling frequency; None when unknown."""
    frequency = next((p.frequency for p in export.processes if p.frequency), None)
    return round(1e9 / frequency) if frequency else None


def _cpu_ns(stack: TaskStack, period_ns: int | None) -> int:
    """The stack's CPU nanoseconds: its share of the process's CPU seconds (summary.csv's rule), or
    samples × the sampling period for a process without CPU counters."""
    seconds = stack.cpu_seconds
    if seconds is not None:
        return round(seconds * 1e9)
    return stack.count * (period_ns or 0)


def comments(export: ExportSet, with_cycles: bool) -> list[str]:
    """What a reader of the profile should know (``go tool pprof -comments``)."""
    notes = [f"spe-taskprof run {export.run_id}: samples per task as in summary.csv"]
    if export.window:
        notes.append(export.window)
    if export.offcpu:
        notes.append(
            "off_cpu = nanoseconds blocked (profiler run --off-cpu), in samples of their own labelled with "
            "their cause; summed over each task's threads"
        )
    unmeasured = [p.label for p in export.processes if p.cpu_seconds is None]
    if unmeasured:
        notes.append("cpu = samples × sampling period (no CPU counters) for: " + ", ".join(unmeasured))
    if with_cycles:
        estimated = [p.label for p in export.processes if p.cycles is not None and p.cycles_estimated]
        if estimated:
            notes.append("cycles estimated as task-clock × nominal frequency for: " + ", ".join(estimated))
        missing = [p.label for p in export.processes if p.cycles is None]
        if missing:
            notes.append("cycles 0 (not measured) for: " + ", ".join(missing))
    return notes


def build_profile(export: ExportSet) -> profile_pb2.Profile:
    """The Profile message: sample types samples/count, cpu/nanoseconds, when any process has cycles
    cycles/count, and for a run with --off-cpu off_cpu/nanoseconds; one Sample per (process, stack),
    leaf first, with its labels; the blocked time in samples of its own (one per process, stack and
    cause: 0 in the other types, labelled with its ``cause``). A frame is one Function and one Location
    (no addresses: the stacks are symbolized already)."""
    from coordinator.export import profile_pb2

    string = StringTable()
    profile = profile_pb2.Profile()
    with_cycles = any(p.cycles is not None for p in export.processes)
    with_offcpu = bool(export.offcpu)
    types = [SAMPLES_TYPE, CPU_TYPE] + ([CYCLES_TYPE] if with_cycles else []) + ([OFFCPU_TYPE] if with_offcpu else [])
    for kind, unit in types:
        profile.sample_type.add(type=string(kind), unit=string(unit))
    period = _period_ns(export)
    profile.period_type.type, profile.period_type.unit = string(CPU_TYPE[0]), string(CPU_TYPE[1])
    profile.period = period or 0
    profile.default_sample_type = string(CPU_TYPE[0])
    if export.start_time is not None:
        profile.time_nanos = round(export.start_time * 1e9)
    if export.duration is not None:
        profile.duration_nanos = round(export.duration * 1e9)
    # One mapping for every location, flagged as symbolized: pprof then neither looks for a binary
    # to symbolize with nor warns that the main binary's name is unknown.
    profile.mapping.add(id=1, filename=string("[spe-taskprof folded stacks]"), has_functions=True)
    locations = _Locations(profile, string)
    for stack in export.stacks:
        sample = profile.sample.add()
        sample.location_id.extend(locations.leaf_first(stack.frames))
        values = [stack.count, _cpu_ns(stack, period)]
        if with_cycles:
            cycles = stack.cycles
            values.append(round(cycles) if cycles is not None else 0)
        sample.value.extend(values + ([0] if with_offcpu else []))
        for key, value in zip(LABEL_KEYS, _label_values(stack)):
            sample.label.add(key=string(key), str=string(value))
    for blocked in export.offcpu:
        sample = profile.sample.add()
        sample.location_id.extend(locations.leaf_first(blocked.frames))
        sample.value.extend([0] * (len(types) - 1) + [blocked.blocked_ns])
        for key, value in zip((*LABEL_KEYS, CAUSE_LABEL), (*_label_values(blocked), blocked.cause)):
            sample.label.add(key=string(key), str=string(value))
    profile.comment.extend(string(note) for note in comments(export, with_cycles))
    profile.string_table.extend(string.strings)
    return profile


class _Locations:
    """One Function and one Location per distinct frame name."""

    def __init__(self, profile: Any, string: StringTable) -> None:
        self._profile, self._string = profile, string
        self._ids: dict[str, int] = {}

    def leaf_first(self, frames: list[str]) -> list[int]:
        ids = []
        for frame in reversed(frames):  # pprof: location_id[0] is the leaf
            location_id = self._ids.get(frame)
            if location_id is None:
                location_id = self._ids[frame] = len(self._ids) + 1
                name = self._string(frame)
                self._profile.function.add(id=location_id, name=name, system_name=name)
                self._profile.location.add(id=location_id, mapping_id=1).line.add(function_id=location_id)
            ids.append(location_id)
        return ids


def _label_values(stack: TaskStack | OffCpuStack) -> tuple[str, ...]:
    process = stack.process
    pid = str(process.pid)
    return (
        process.run,
        process.host,
        pid,
        f"{process.host}:{pid}",
        process.role,
        process.engine,
        process.kind,
        stack.thread,
        stack.task,
    )


def encode(profile: Any) -> bytes:
    """The serialized profile, gzip-compressed as pprof files are (mtime 0: the same input gives
    the same bytes)."""
    return gzip.compress(profile.SerializeToString(deterministic=True), mtime=0)


def decode(content: bytes) -> profile_pb2.Profile:
    """A .pb.gz (or uncompressed) profile parsed back with the protobuf library (tests, tools)."""
    from coordinator.export import profile_pb2

    raw = gzip.decompress(content) if content[:2] == b"\x1f\x8b" else content
    profile = profile_pb2.Profile()
    profile.ParseFromString(raw)
    return profile


def pprof_bytes(export: ExportSet) -> bytes:
    return encode(build_profile(export))
