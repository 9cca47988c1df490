"""The report's Flink section: Flink's own busy, back-pressured and idle time per job vertex (flink.json
of the capture of the host whose JobManager answered) beside the time the vertex's task threads were
sampled on CPU and, with --off-cpu, blocked per cause; and the events note with the count's uncertainty."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from coordinator.analysis.load import RunData
from coordinator.report.flame import StackClassifications
from coordinator.report.formats import format_number
from coordinator.report.model import FlinkVertexLine
from profiler.capture.offcpu import CAUSES, OffCpuEntry
from profiler.capture.read import Capture
from profiler.engines.flinkmetrics import vertex_cpu, vertex_of_thread

OffCpu = Mapping[str, Mapping[int, Sequence[OffCpuEntry]]]  # host -> PID -> entries


def thread_samples(stacks: Mapping[str, Mapping[int, Mapping[str, int]]]) -> Counter[str]:
    """Samples per thread name (the folded stacks' root frame) over every sampled process and host."""
    found: Counter[str] = Counter()
    for by_pid in stacks.values():
        for folded in by_pid.values():
            for stack, count in folded.items():
                found[stack.split(";", 1)[0]] += count
    return found


def vertex_blocked_ns(offcpu: OffCpu, vertex_names: Sequence[str]) -> dict[str, Counter[str]]:
    """Blocked nanoseconds per vertex and cause: each off-CPU stack goes to the vertex its root frame
    (the thread's name: the kernel's 15-byte comm for a blocked thread) names alone
    (``vertex_of_thread``); a thread name that fits no vertex or several is left out."""
    found: dict[str, Counter[str]] = {}
    for by_pid in offcpu.values():
        for entries in by_pid.values():
            for entry in entries:
                vertex = vertex_of_thread(entry.stack.split(";", 1)[0], vertex_names)
                if vertex is not None:
                    found.setdefault(vertex, Counter())[entry.cause] += entry.blocked_ns
    return found


def vertex_blocked_by_task(
    offcpu: OffCpu, vertex_names: Sequence[str], classifications: StackClassifications
) -> dict[str, dict[str, Counter[str]]]:
    """Blocked nanoseconds per vertex, profile task and cause: the vertex as in ``vertex_blocked_ns`` (its
    root frame), the task by the off-CPU rule (``Matcher.decide_offcpu``, the report's other off-CPU views)."""
    found: dict[str, dict[str, Counter[str]]] = {}
    for by_pid in offcpu.values():
        for entries in by_pid.values():
            for entry in entries:
                vertex = vertex_of_thread(entry.stack.split(";", 1)[0], vertex_names)
                if vertex is None:
                    continue
                task = classifications.task_names[classifications.classify(entry.stack)[0]]
                found.setdefault(vertex, {}).setdefault(task, Counter())[entry.cause] += entry.blocked_ns
    return found


def _by_task(
    blocked: Mapping[str, Counter[str]] | None, seconds: float, parallelism: int
) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """Per task (most blocked first), its milliseconds per second of one subtask per cause."""
    if not blocked:
        return ()
    ranked = sorted(blocked.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    return tuple((task, _by_cause(causes, seconds, parallelism)) for task, causes in ranked if sum(causes.values()))


def _by_cause(blocked: Counter[str] | None, seconds: float, parallelism: int) -> tuple[tuple[str, float], ...]:
    """Milliseconds per second of one subtask per cause (CAUSES order, only causes that occurred)."""
    if not blocked or seconds <= 0:
        return ()
    scale = 1e-6 / seconds / max(parallelism, 1)
    return tuple((cause, blocked[cause] * scale) for cause in CAUSES if blocked[cause] > 0)


def _off_cpu_run(run: RunData) -> bool:
    return any(h.capture is not None and h.capture.meta.off_cpu_min_block_ms is not None for h in run.hosts)


def _whole_window(run: RunData) -> bool:
    """Flink's metrics cover the whole window: a sub-window analysis (analyze --from/--to) gets no section."""
    if run.window is None:
        return True
    entries = [h for h in run.window.get("hosts", ()) if h.get("run") == run.run_id]
    return bool(entries) and all(h.get("whole_window") for h in entries)


def _flink_capture(run: RunData) -> Capture | None:
    return next((h.capture for h in run.hosts if h.capture is not None and h.capture.flink_vertices), None)


def flink_vertex_lines(
    run: RunData,
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    offcpu: OffCpu | None = None,
    classifications: StackClassifications | None = None,
) -> tuple[FlinkVertexLine, ...]:
    """One line per job vertex, sources first; empty without flink.json. ``offcpu`` (host -> PID ->
    entries): with a run that had --off-cpu, each vertex's blocked time per cause and, given the report's
    off-CPU ``classifications``, per profile task and cause."""
    capture = _flink_capture(run)
    if capture is None or not _whole_window(run):
        return ()
    meta = capture.meta
    found = vertex_cpu(thread_samples(stacks), capture.flink_vertices, meta.frequency, meta.duration)
    vertex_names = sorted({v.name for v in capture.flink_vertices})
    if classifications is None:
        by_task: dict[str, dict[str, Counter[str]]] = {}
        blocked = vertex_blocked_ns(offcpu or {}, vertex_names)
    else:  # the per-cause column is the per-task one summed: one pass over the entries
        by_task = vertex_blocked_by_task(offcpu or {}, vertex_names, classifications)
        blocked = {vertex: sum(tasks.values(), Counter()) for vertex, tasks in by_task.items()}
    off_cpu = _off_cpu_run(run)
    lines = []
    for vertex in sorted(found, key=lambda v: (not v.window.source, v.window.job_name, v.window.name)):
        window = vertex.window
        busy = window.busy_ms_per_s
        lines.append(FlinkVertexLine(
            name=window.name,
            job=window.job_name or window.job[:8],
            parallelism=window.parallelism,
            source=window.source,
            records_in=window.source_records if window.source else window.records_in,
            records_in_uncertainty=(
                window.source_records_uncertainty if window.source else window.records_in_uncertainty
            ),
            busy_ms_per_s=busy,
            backpressured_ms_per_s=window.backpressured_ms_per_s,
            idle_ms_per_s=window.idle_ms_per_s,
            on_cpu_ms_per_s=vertex.on_cpu_ms_per_s,
            busy_off_cpu_ms_per_s=max(busy - vertex.on_cpu_ms_per_s, 0.0) if busy is not None else None,
            samples=vertex.samples,
            off_cpu_by_cause=(
                _by_cause(blocked.get(window.name), meta.duration, window.parallelism) if off_cpu else None
            ),
            off_cpu_by_task=(
                _by_task(by_task.get(window.name), meta.duration, window.parallelism)
                if off_cpu and classifications is not None else None
            ),
        ))
    return tuple(lines)


def flink_note(run: RunData, lines: Sequence[FlinkVertexLine]) -> str:
    capture = _flink_capture(run)
    if capture is None or not lines:
        return ""
    unmapped = "" if all(line.samples for line in lines) else (
        "; a vertex without samples: its threads were not found by name (or did not run on a sampled host)"
    )
    return (
        f"{len(lines)} job vertices over the {capture.meta.duration:.0f} s window, mean per subtask; "
        f"Flink's times from its REST metrics (host {capture.meta.host}), on-CPU from the samples of the "
        f"vertex's task threads at {capture.meta.frequency} Hz{unmapped}"
    )


def events_note(run: RunData, events: float | None) -> str:
    """Events processed in the window, where the number came from, ± its uncertainty and how."""
    counted = [h.capture.events for h in run.hosts if h.capture is not None and h.capture.events is not None]
    known = [c for c in counted if c.count is not None]
    if events is None:
        return ""
    sources = sorted({c.source for c in known})
    where = f" (from {', '.join(sources)})" if sources else ""
    text = f"{format_number(events, 0)} events processed in the window{where}"
    best = max(known, key=lambda c: c.count or 0) if known else None
    if best is not None and best.uncertainty is not None and best.count == events:
        relative = f", {100 * best.uncertainty / events:.2f} %" if events else ""
        text += f" ± {format_number(best.uncertainty, 0)}{relative}"
    if best is not None and best.method and best.count == events:
        text += f", {best.method}"
    return text
