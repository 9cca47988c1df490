"""A host capture read back: each file of the layout in format.py (docs/capture-format.md) checked and
turned into its record, the stacks in whichever form the capture's format_version stores them.

Every reader here refuses what `profiler run` cannot write (checks.py, jsonfile.py) with one line naming
the file: a capture may come from a compromised host."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CaptureFormatError
from ..files.textinput import open_text
from .checks import check_rate, check_times, contained, present, row_interval_error
from .folded import MAX_COUNT, is_count, iter_folded, parse_line, read_folded
from .format import (
    COUNTERS_FILE,
    COUNTERS_TIMELINE_FILE,
    EVENTS_FILE,
    FLINK_FILE,
    FLINK_FORMAT_VERSION,
    MAX_OFFCPU_INTERVAL,
    META_FILE,
    NET_FILE,
    OFFCPU_TIMELINE_FILE,
    OFFCPU_TIMELINE_THREADS_FILE,
    OVERHEAD_FILE,
    PIDS_DIR,
    SAMPLER_FILE,
    SCOPE_FILE,
    SPARK_FILE,
    STACKS_FILE,
    ComponentCpu,
    CounterDelta,
    CounterValue,
    EventCount,
    FlinkSubtask,
    FlinkTaskManager,
    NetStats,
    Overhead,
    OverheadPoint,
    PidCounters,
    ProcessInfo,
    RunMeta,
    SamplerStats,
    VertexWindow,
    contexts_path,
    is_safe_name,
    pid_file,
    stacks_path,
    table_path,
    timeline_path,
)
from .jsonfile import expect_json, from_json_object, read_json_file
from .offcpu import (
    OFFCPU_CONTEXTS_FILE,
    OFFCPU_FILE,
    OFFCPU_THREADS_FILE,
    OffCpuEntry,
    merge_entries,
    parse_offcpu_lines,
    read_offcpu_lines,
    with_threads,
)
from .stacktable import STACK_TABLE_FILE, StackTable, read_table

# v1: no timeline, no perf-map refresh; v2: no full thread names, no contexts.json; v1-v3: folded stacks
# (stacks.folded, timeline.folded, contexts.json) instead of the stack table (stacks.tpc); the rest reads the same
READABLE_VERSIONS = (1, 2, 3, 4, 5)


def read_spark_plans(capture_dir: Path) -> dict[str, Any] | None:
    """spark.json (v3): the Spark drivers' stages, jobs and codegen operators; None when absent.
    Only its shape is checked here; profiler/engines/sparkplan.py's readers skip entries they cannot use."""
    path = capture_dir / SPARK_FILE
    if not os.path.lexists(path):
        return None
    payload = _versioned(_load_json(capture_dir, path), path, SPARK_READABLE_VERSIONS)
    expect_json(payload.get("plans", []), list, path, "plans")
    return dict(payload)


def _load_json(capture_dir: Path, path: Path) -> Any:
    return read_json_file(
        contained(capture_dir, path),
        "is this a capture directory written by `profiler run`?",
        "re-run the capture",
        follow=False,
    )


def read_meta(capture_dir: Path) -> RunMeta:
    path = capture_dir / META_FILE
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    version = payload.get("format_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise CaptureFormatError(
            f"{path}: format_version {version!r}, this version reads {', '.join(map(str, READABLE_VERSIONS))}; "
            "use a matching profiler version"
        )
    if version == 1:
        payload.setdefault("stack_collection", "stackmap")
    payload["warnings"] = tuple(expect_json(payload.get("warnings", []), list, path, "warnings"))
    meta: RunMeta = from_json_object(RunMeta, payload, path)
    if not is_safe_name(meta.host):
        raise CaptureFormatError(f"{path}: host {meta.host!r} is not a safe directory name; re-run the capture")
    if not (math.isfinite(meta.interval) and meta.interval > 0):
        raise CaptureFormatError(
            f"{path}: interval {meta.interval!r} is not a positive number of seconds; re-run the capture"
        )
    check_times(path, meta.start_time, meta.end_time, "re-run the capture")
    check_rate(path, meta.frequency, meta.duration_requested, "re-run the capture")
    if not 0 <= meta.intervals <= MAX_INTERVALS:
        raise CaptureFormatError(
            f"{path}: intervals {meta.intervals!r} is not 0 to {MAX_INTERVALS}; re-run the capture"
        )
    return meta


MAX_INTERVALS = 10_000_000  # timeline slices of a window: 7 days (--duration's bound) of 0.1 s (--interval's)


def window_intervals(meta: RunMeta) -> int:
    """The intervals a capture's rows may lie in: meta.json's ``intervals``; for a capture that does not
    say (written before it was kept), those of its window and one more (the first ring-buffer runner
    numbered the window's last sliver one too high), at most MAX_INTERVALS."""
    if meta.intervals > 0:
        return meta.intervals
    slices = meta.duration / meta.interval
    return MAX_INTERVALS if not slices < MAX_INTERVALS - 1 else max(1, math.ceil(slices)) + 1


def interval_limit_of(path: Path) -> int | None:
    """``window_intervals`` of the capture a PID's stacks file lies in (``<capture>/pids/<pid>/<file>``);
    None for a file outside a capture (`profiler match FILE`)."""
    capture_dir = Path(path).parent.parent.parent
    if Path(path).parent.parent.name != PIDS_DIR or not (capture_dir / META_FILE).is_file():
        return None
    return window_intervals(read_meta(capture_dir))


def read_scope(capture_dir: Path) -> list[ProcessInfo]:
    path = capture_dir / SCOPE_FILE
    rows = expect_json(_load_json(capture_dir, path), list, path, "the file")
    return [from_json_object(ProcessInfo, row, path) for row in rows]


def read_counters(capture_dir: Path, pid: int) -> PidCounters | None:
    path = pid_file(capture_dir, pid, COUNTERS_FILE)
    if not os.path.lexists(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    events = expect_json(payload.get("events"), dict, path, "events")
    payload["events"] = {name: from_json_object(CounterValue, value, path) for name, value in events.items()}
    counters: PidCounters = from_json_object(PidCounters, payload, path)
    return counters


def read_sampler_stats(capture_dir: Path, pid: int) -> SamplerStats | None:
    path = pid_file(capture_dir, pid, SAMPLER_FILE)
    return from_json_object(SamplerStats, _load_json(capture_dir, path), path) if os.path.lexists(path) else None


def read_net(capture_dir: Path, pid: int) -> NetStats | None:
    path = pid_file(capture_dir, pid, NET_FILE)
    return from_json_object(NetStats, _load_json(capture_dir, path), path) if os.path.lexists(path) else None


def read_pid_offcpu(capture_dir: Path, pid: int) -> list[OffCpuEntry] | None:
    """``pid``'s off-CPU entries, with their threads where offcpu_threads.json gives them; None when the run
    had no --off-cpu (or an older profiler wrote it)."""
    path = pid_file(capture_dir, pid, OFFCPU_FILE)
    if not present(path):
        return None
    lines = read_offcpu_lines(path)
    threads_path = pid_file(capture_dir, pid, OFFCPU_THREADS_FILE)
    if present(threads_path):
        lines = with_threads(lines, _load_json(capture_dir, threads_path), str(threads_path))
    return merge_entries(lines)


def _offcpu_timeline_lines(path: Path) -> list[tuple[int, OffCpuEntry]]:
    """(interval, entry) per line of an offcpu_timeline.folded, in file order (blank lines left out)."""
    lines: list[tuple[int, OffCpuEntry]] = []
    with open_text(path, lenient=True) as handle:
        for number, raw in enumerate(handle, start=1):
            interval_text, _space, rest = raw.partition(" ")
            if not raw.strip():
                continue
            if not (is_count(interval_text) and int(interval_text) <= MAX_OFFCPU_INTERVAL):
                raise CaptureFormatError(
                    f"{path}:{number}: expected 'interval cause blocked_ns switches stack' with a whole interval "
                    f"up to {MAX_OFFCPU_INTERVAL}, got {raw[:80]!r}; fix or drop the line"
                )
            try:
                entries = list(parse_offcpu_lines([rest], str(path)))
            except CaptureFormatError as exc:
                raise CaptureFormatError(str(exc).replace(f"{path}:1:", f"{path}:{number}:", 1)) from None
            lines += [(int(interval_text), entry) for entry in entries]
    return lines


def read_pid_offcpu_timeline(capture_dir: Path, pid: int) -> dict[int, list[OffCpuEntry]] | None:
    """``pid``'s off-CPU entries per interval; None when the capture has none (no --off-cpu, or older than v5)."""
    path = pid_file(capture_dir, pid, OFFCPU_TIMELINE_FILE)
    if not present(path):
        return None
    lines = _offcpu_timeline_lines(path)
    threads_path = pid_file(capture_dir, pid, OFFCPU_TIMELINE_THREADS_FILE)
    entries = [entry for _interval, entry in lines]
    if present(threads_path):
        payload = _load_json(capture_dir, threads_path)
        entries = with_threads(entries, payload, str(threads_path), OFFCPU_TIMELINE_FILE)
    by_interval: dict[int, list[OffCpuEntry]] = {}
    for (interval, _line), entry in zip(lines, entries):
        by_interval.setdefault(interval, []).append(entry)
    return by_interval


def read_pid_offcpu_contexts(capture_dir: Path, pid: int) -> dict[int, list[OffCpuEntry]] | None:
    """``pid``'s blocked time of threads with a context, per interval (entries with ``context`` set); None
    when the capture has no offcpu_contexts.json (no --off-cpu, or made before contexts were kept)."""
    path = pid_file(capture_dir, pid, OFFCPU_CONTEXTS_FILE)
    if not present(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    names = expect_json(payload.get("contexts", []), list, path, "contexts")
    rows = expect_json(payload.get("rows", []), list, path, "rows")
    timeline = pid_file(capture_dir, pid, OFFCPU_TIMELINE_FILE)
    lines = _offcpu_timeline_lines(timeline) if rows else []
    by_interval: dict[int, list[OffCpuEntry]] = {}
    for number, row in enumerate(rows, 1):
        checked = _context_row(row, names, len(lines), lambda line: (lines[line - 1][1].blocked_ns, MAX_COUNT))
        if checked is None:
            raise CaptureFormatError(
                f"{path}: row {number} is not [context index, line of {OFFCPU_TIMELINE_FILE}, blocked_ns up to "
                "that line's, switches]; re-run the capture"
            )
        context, line, (blocked_ns, switches) = checked
        interval, entry = lines[line - 1]
        by_interval.setdefault(interval, []).append(
            replace(entry, blocked_ns=blocked_ns, switches=switches, context=context)
        )
    return by_interval


def _context_row(
    row: object, names: list[Any], line_count: int, highs: Callable[[int], tuple[int, ...]]
) -> tuple[str, int, tuple[int, ...]] | None:
    """One row of contexts.json or offcpu_contexts.json: ``[context index, line number, *values]``, every cell
    a whole number, the index one of ``names`` (a name), the line one of ``line_count`` (from 1), each value
    from 0 to its bound in ``highs(line)``. (context, line, values), or None when the row is not one."""
    if not (isinstance(row, list) and len(row) >= 2):
        return None
    if not all(isinstance(cell, int) and not isinstance(cell, bool) for cell in row):
        return None
    index, line, *values = row
    if not (0 <= index < len(names) and isinstance(names[index], str) and 1 <= line <= line_count):
        return None
    bounds = highs(line)
    if len(values) != len(bounds) or not all(0 <= value <= high for value, high in zip(values, bounds)):
        return None
    return names[index], line, tuple(values)


def read_events(capture_dir: Path) -> EventCount | None:
    path = capture_dir / EVENTS_FILE
    return from_json_object(EventCount, _load_json(capture_dir, path), path) if os.path.lexists(path) else None


FLINK_READABLE_VERSIONS = (1, FLINK_FORMAT_VERSION)


SPARK_READABLE_VERSIONS = (1,)


def _versioned(payload: Any, path: Path, readable: tuple[int, ...]) -> dict[str, Any]:
    """A JSON object whose ``format_version`` (absent in the first files) this build reads; a newer
    one is refused, never read as if current."""
    payload = expect_json(payload, dict, path, "the file")
    version = payload.get("format_version", readable[0])
    if version not in readable or isinstance(version, bool):
        raise CaptureFormatError(
            f"{path}: format_version {version!r}, this version reads {', '.join(map(str, readable))}; "
            "use a matching profiler version"
        )
    return dict(payload)


def read_flink_placement(capture_dir: Path) -> tuple[tuple[FlinkSubtask, ...], tuple[FlinkTaskManager, ...]]:
    """flink.json's subtasks and TaskManagers (v2); empty for a v1 file or when the REST API did not say."""
    path = capture_dir / FLINK_FILE
    if not os.path.lexists(path):
        return (), ()
    payload = _versioned(_load_json(capture_dir, path), path, FLINK_READABLE_VERSIONS)
    subtasks = expect_json(payload.get("subtasks", []), list, path, "subtasks")
    taskmanagers = expect_json(payload.get("taskmanagers", []), list, path, "taskmanagers")
    return (
        tuple(from_json_object(FlinkSubtask, entry, path) for entry in subtasks),
        tuple(from_json_object(FlinkTaskManager, entry, path) for entry in taskmanagers),
    )


def read_flink_vertices(capture_dir: Path) -> tuple[VertexWindow, ...]:
    """Flink's own view of its job vertices over the window (flink.json), empty when absent."""
    path = capture_dir / FLINK_FILE
    if not os.path.lexists(path):
        return ()
    payload = _versioned(_load_json(capture_dir, path), path, FLINK_READABLE_VERSIONS)
    entries = expect_json(payload.get("vertices", []), list, path, "vertices")
    return tuple(from_json_object(VertexWindow, entry, path) for entry in entries)


MAX_COMPONENTS = 64  # overhead.json's CPU components: a dozen are written


def read_overhead(capture_dir: Path) -> Overhead | None:
    path = capture_dir / OVERHEAD_FILE
    if not os.path.lexists(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    points = expect_json(payload.get("timeline") or [], list, path, "timeline")
    payload["timeline"] = tuple(from_json_object(OverheadPoint, point, path) for point in points)
    components = expect_json(payload.get("cpu_by_component") or [], list, path, "cpu_by_component")
    if len(components) > MAX_COMPONENTS:
        raise CaptureFormatError(
            f"{path}: {len(components)} CPU components (at most {MAX_COMPONENTS}); re-run the capture"
        )
    payload["cpu_by_component"] = tuple(from_json_object(ComponentCpu, entry, path) for entry in components)
    overhead: Overhead = from_json_object(Overhead, payload, path)
    return overhead


def iter_timeline(path: Path) -> Iterator[tuple[int, str, int]]:
    """(interval, folded stack, count) per line of a timeline.folded, or per row of a stacks.tpc (contexts
    merged); a bad line or table is a CaptureFormatError."""
    if path.name == STACK_TABLE_FILE:
        yield from read_table(path).timeline_entries()
        return
    limit = interval_limit_of(path)
    with open_text(path, lenient=True) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            head, _, rest = line.partition(" ")
            try:
                parsed = parse_line(rest) if is_count(head) else None
            except ValueError:
                parsed = None
            if parsed is None:
                raise CaptureFormatError(f"{path}:{number}: not '<interval> <stack> <count>'; re-run the capture")
            if limit is not None and int(head) >= limit:
                raise CaptureFormatError(f"{path}:{number}: {row_interval_error(int(head), limit)}; re-run the capture")
            yield int(head), parsed[0], parsed[1]


def read_stack_counts(path: Path, intervals: tuple[int, int] | None = None) -> Counter[str]:
    """Folded stack -> samples of one PID's stacks file (``pid_stacks_file``): the whole window, or with
    ``intervals`` only the intervals ``first..last`` (inclusive; the timeline of a folded capture)."""
    if path.name == STACK_TABLE_FILE:
        return read_table(path).folded(*(intervals or (None, None)))
    if intervals is None:
        return read_folded(path)
    first, last = intervals
    counts: Counter[str] = Counter()
    for interval, stack, count in iter_timeline(path):
        if first <= interval <= last:
            counts[stack] += count
    return counts


def read_timeline(
    capture_dir: Path, pid: int, first: int | None = None, last: int | None = None
) -> Counter[str] | None:
    """Stacks of ``pid`` summed over intervals ``first..last`` (inclusive, None = open); None without a timeline."""
    path = pid_timeline_file(capture_dir, pid)
    if path is None:
        return None
    return read_stack_counts(path, (-1 if first is None else first, MAX_COUNT if last is None else last))


def read_counters_timeline(capture_dir: Path, pid: int) -> list[CounterDelta] | None:
    path = pid_file(capture_dir, pid, COUNTERS_TIMELINE_FILE)
    if not os.path.lexists(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    rows = expect_json(payload.get("rows", []), list, path, "rows")
    return [from_json_object(CounterDelta, row, path) for row in rows]


def read_contexts(capture_dir: Path, pid: int) -> Counter[tuple[str, str]] | None:
    """(context, folded stack) -> samples of ``pid``; None when the capture has no contexts (v1/v2, or no
    thread of the PID carried a per-unit name)."""
    table = table_path(capture_dir, pid)
    if present(table):
        return read_table(table).context_counts() or None
    path = contexts_path(capture_dir, pid)
    if not present(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    names = expect_json(payload.get("contexts", []), list, path, "contexts")
    rows = expect_json(payload.get("rows", []), list, path, "rows")
    stacks_file = stacks_path(capture_dir, pid)
    with open_text(stacks_file, lenient=True) as handle:
        stacks = [stack for stack, _count in iter_folded(handle, str(stacks_file))]
    counts: Counter[tuple[str, str]] = Counter()
    for number, row in enumerate(rows, 1):
        checked = _context_row(row, names, len(stacks), lambda _line: (MAX_COUNT,))
        if checked is None:
            raise CaptureFormatError(
                f"{path}: row {number} is not [context index, stack line of {STACKS_FILE}, count]; re-run the capture"
            )
        context, line, (count,) = checked
        counts[(context, stacks[line - 1])] += count
    return counts


def pid_stacks_file(capture_dir: Path, pid: int) -> Path | None:
    """The file holding ``pid``'s stacks: stacks.tpc (format 4), else stacks.folded; None when neither is there."""
    for path in (table_path(capture_dir, pid), stacks_path(capture_dir, pid)):
        if present(path):
            return path
    return None


def pid_timeline_file(capture_dir: Path, pid: int) -> Path | None:
    """The file holding ``pid``'s stacks per interval: stacks.tpc, else timeline.folded; None without one."""
    for path in (table_path(capture_dir, pid), timeline_path(capture_dir, pid)):
        if present(path):
            return path
    return None


def read_pid_table(capture_dir: Path, pid: int) -> StackTable | None:
    """``pid``'s samples as a stack table, whichever form the capture stores them in; None without stacks."""
    from .stacktable import table_from_folded

    path = pid_stacks_file(capture_dir, pid)
    if path is None:
        return None
    if path.name == STACK_TABLE_FILE:
        return read_table(path)
    timeline_file = pid_timeline_file(capture_dir, pid)
    timeline: Counter[tuple[int, str]] | None = None
    if timeline_file is not None:
        timeline = Counter()
        for interval, stack, count in iter_timeline(timeline_file):
            timeline[(interval, stack)] += count
    return table_from_folded(read_folded(path), timeline, read_contexts(capture_dir, pid))


@dataclass(frozen=True)
class Capture:
    """Everything one host capture holds except the stacks themselves (read those lazily)."""

    directory: Path
    meta: RunMeta
    processes: tuple[ProcessInfo, ...]
    counters: Mapping[int, PidCounters] = field(default_factory=dict)
    sampler: Mapping[int, SamplerStats] = field(default_factory=dict)
    net: Mapping[int, NetStats] = field(default_factory=dict)
    overhead: Overhead | None = None
    events: EventCount | None = None
    flink_vertices: tuple[VertexWindow, ...] = ()
    flink_subtasks: tuple[FlinkSubtask, ...] = ()  # flink.json v2: where each subtask ran
    flink_taskmanagers: tuple[FlinkTaskManager, ...] = ()


def read_capture(capture_dir: Path) -> Capture:
    capture_dir = Path(capture_dir)
    meta = read_meta(capture_dir)
    processes = tuple(read_scope(capture_dir))
    counters: dict[int, PidCounters] = {}
    sampler: dict[int, SamplerStats] = {}
    net: dict[int, NetStats] = {}
    for process in processes:
        check_pid_files(capture_dir, meta, process.pid)
        if (c := read_counters(capture_dir, process.pid)) is not None:
            counters[process.pid] = c
        if (s := read_sampler_stats(capture_dir, process.pid)) is not None:
            sampler[process.pid] = s
        if (n := read_net(capture_dir, process.pid)) is not None:
            net[process.pid] = n
    return Capture(
        capture_dir, meta, processes, counters, sampler, net, read_overhead(capture_dir), read_events(capture_dir),
        read_flink_vertices(capture_dir), *read_flink_placement(capture_dir),
    )


TABLE_FORMAT = 4  # the first format_version whose stacks are stack tables


def check_pid_files(capture_dir: Path, meta: RunMeta, pid: int) -> None:
    """A PID's stacks files are regular files of the form meta.json's format_version has: a stack table
    from format 4, folded files before it, never both (which of them would count?)."""
    table = present(table_path(capture_dir, pid))
    folded = [path for path in (stacks_path(capture_dir, pid), timeline_path(capture_dir, pid)) if present(path)]
    if table and meta.format_version < TABLE_FORMAT:
        raise CaptureFormatError(
            f"{capture_dir / META_FILE}: format_version {meta.format_version}, but {table_path(capture_dir, pid)} is "
            f"a stack table (format {TABLE_FORMAT} and later); re-run or re-fetch the capture"
        )
    if table and folded:
        raise CaptureFormatError(
            f"{folded[0]}: beside {STACK_TABLE_FILE}, which holds the same samples; a capture has one of them, "
            "re-run or re-fetch the capture"
        )


def is_capture_dir(path: Path) -> bool:
    return (Path(path) / META_FILE).is_file()
