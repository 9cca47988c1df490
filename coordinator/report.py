"""The HTML report of a run directory (or of one bare host capture): load, build the view, render.

``render_report`` is the one entry point; ``coordinator report``, ``profile`` and ``analyze`` call it.
Templates and vendored JavaScript ship inside the package (``coordinator.templates``).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from profiler.capture import (
    ALL_TASKS,
    PROFILE_COPY,
    UNMATCHED,
    Capture,
    CaptureFormatError,
    CounterDelta,
    ProcessInfo,
    contained,
    is_capture_dir,
    iter_timeline,
    read_capture,
    read_counters_timeline,
    replace_dir,
    result_file_name,
    stacks_path,
    timeline_path,
)
from profiler.errors import OutputExistsError
from profiler.matcher import Matcher

from . import flame, timeline
from .analysis import SUMMARY_FILE, cell_number, existing_summary, pid_rows_by_task, read_pid_stacks, sum_known
from .rundir import HOST_OK, HostOutcome, RunInfo, host_capture_dir, is_run_dir, read_run

REPORT_MARKER = ".spe-taskprof-report"
REPORT_META = "report.json"
DEFAULT_MAX_STACKS = flame.DEFAULT_MAX_STACKS
# Files copied beside every report so it works offline (from coordinator.templates).
STATIC_FILES: tuple[str, ...] = ("report.js", "report.css")
VENDOR_FILES: tuple[str, ...] = (
    "d3.min.js",
    "d3-flamegraph.min.js",
    "d3-flamegraph.css",
    "d3.LICENSE",
    "d3-flamegraph.LICENSE",
    "VERSIONS",
)

# Categorical colours for tasks in profile order (Tableau 10, then Tableau 20's light tones).
TASK_PALETTE: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#dbdb8d", "#9edae5", "#bcbd22",
)
UNMATCHED_COLOR = "#a0a0a0"
MIXED_COLOR = "#e3e3e3"

# Health thresholds: above these a line turns into a warning.
UNMATCHED_WARN = 0.20
LOST_WARN = 0.01
INTERPRETED_WARN = 0.05  # "more than a few percent" of samples only in the interpreter (issue 11)
UNRESOLVED_WARN = 0.05  # Java frames no perf map named
OVERHEAD_WARN = 0.05  # profiler CPU seconds per second of window, i.e. share of one core


# ---------------------------------------------------------------- loading


@dataclass(frozen=True)
class HostData:
    """One host of the run: its outcome and, when readable, its capture."""

    name: str
    state: str  # "ok", "failed", "partial", "missing" (no capture directory), "unreadable"
    reason: str
    capture: Capture | None


@dataclass(frozen=True)
class RunData:
    """Everything the report shows, read from disk once."""

    directory: Path
    run_id: str
    bare_capture: bool
    info: RunInfo | None
    hosts: tuple[HostData, ...]
    rows: tuple[Mapping[str, str], ...]  # summary.csv rows, or the hosts' <host>_result.csv rows
    rows_source: str  # "summary.csv" or "host results"
    profile_text: str | None
    profile_source: str | None
    window: Mapping[str, Any] | None = None  # analysis.json "window" (analyze --from/--to), or None

    @property
    def labels(self) -> Mapping[str, str]:
        return self.info.labels if self.info is not None else {}

    def host_intervals(self, host: str) -> tuple[int, int] | None:
        """The intervals the analysis used for ``host`` (None: the whole window)."""
        for entry in (self.window or {}).get("hosts", ()):
            if entry.get("run") == self.run_id and entry.get("host") == host and not entry.get("whole_window"):
                return int(entry["first_interval"]), int(entry["last_interval"])
        return None


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return [dict(row) for row in csv.DictReader(handle)]
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CaptureFormatError(f"{path}: not valid CSV ({exc}); re-run `coordinator analyze`") from None
    except OSError as exc:
        raise CaptureFormatError(f"{path}: cannot read ({exc.strerror or exc}); re-run `coordinator analyze`") from None


def _host_state(outcome: HostOutcome | None, capture_dir: Path) -> tuple[str, str, Capture | None]:
    if not is_capture_dir(capture_dir):
        if outcome is not None and not outcome.has_capture:
            return outcome.state, outcome.reason, None
        return "missing", f"no capture in {capture_dir}", None
    try:
        capture = read_capture(capture_dir)
    except CaptureFormatError as exc:
        return "unreadable", str(exc), None
    if outcome is None:
        return HOST_OK, "", capture
    return outcome.state, outcome.reason, capture


def load_run(path: Path) -> RunData:
    """Read a run directory (run.json) or a bare host capture (meta.json)."""
    path = Path(path)
    if is_run_dir(path):
        info = read_run(path)
        hosts: list[HostData] = []
        for outcome in info.hosts:
            try:
                capture_dir = host_capture_dir(path, outcome.host)
            except CaptureFormatError as exc:
                hosts.append(HostData(outcome.host, "unreadable", str(exc), None))
                continue
            state, reason, capture = _host_state(outcome, capture_dir)
            hosts.append(HostData(outcome.host, state, reason, capture))
        known = {h.host for h in info.hosts}
        hosts_root = path / "hosts"
        if hosts_root.is_dir():  # captures on disk that run.json does not list (copied in by hand)
            for extra in sorted(p for p in hosts_root.iterdir() if p.is_dir() and p.name not in known):
                state, reason, capture = _host_state(None, extra)
                hosts.append(HostData(extra.name, state, reason, capture))
        run_id, bare = info.run_id, False
    elif is_capture_dir(path):
        capture = read_capture(path)
        info = None
        hosts = [HostData(capture.meta.host, HOST_OK, "", capture)]
        run_id = path.resolve().name  # as `coordinator analyze` names a bare capture's run
        bare = True
    else:
        raise CaptureFormatError(
            f"{path}: neither a run directory (run.json) nor a host capture (meta.json); "
            "pass a directory written by `coordinator profile` or `profiler run`"
        )
    rows: list[dict[str, str]] = []
    # `coordinator analyze` writes into the run directory, or <capture>/analysis/ for a bare capture.
    summary = existing_summary(path)
    if summary is not None:
        rows, source = _read_csv(contained(path, summary)), SUMMARY_FILE
        if any(row.get("run") == run_id for row in rows):  # an analysis of several runs: this one's rows
            rows = [row for row in rows if row.get("run") == run_id]
    else:
        source = "host results"
        for host in hosts:
            if host.capture is not None:
                directory = host.capture.directory
                result = contained(directory, directory / result_file_name(host.capture.meta.host))
                if result.is_file():
                    rows.extend(_read_csv(result))
    profile_text, profile_source, window = _analysis_record(summary)
    candidates = [path / PROFILE_COPY] + [h.capture.directory / PROFILE_COPY for h in hosts if h.capture]
    for candidate in candidates if profile_text is None else ():
        if contained(path, candidate).is_file():
            profile_text, profile_source = candidate.read_text(encoding="utf-8", errors="replace"), str(candidate)
            break
    return RunData(
        path, run_id, bare, info, tuple(hosts), tuple(rows), source, profile_text, profile_source, window
    )


def load_stacks(
    capture: Capture, problems: list[str] | None = None, intervals: tuple[int, int] | None = None
) -> dict[int, dict[str, int]]:
    """Folded stacks of every workload PID of a capture (PIDs without a stacks file are left out);
    with ``intervals`` only those of timeline.folded, as `analyze --from/--to` used them.

    An unreadable stacks file leaves that PID out and is reported in ``problems`` (the health panel)
    instead of failing the whole report."""
    stacks: dict[int, dict[str, int]] = {}
    for process in capture.processes:
        if not process.sampled:
            continue
        path = (stacks_path if intervals is None else timeline_path)(capture.directory, process.pid)
        if not path.is_file():
            continue
        try:
            stacks[process.pid] = dict(read_pid_stacks(path, intervals))
        except (CaptureFormatError, OSError) as exc:
            if problems is None:
                raise
            problems.append(f"{capture.meta.host} PID {process.pid}: stacks left out: {exc}")
    return stacks


@dataclass(frozen=True)
class TimelineInput:
    """What the time chart of one host reads: each workload PID's timeline entries (read lazily,
    once) and counters timeline."""

    interval: float
    duration: float
    entries: Mapping[int, Iterable[tuple[int, str, int]]]
    deltas: Mapping[int, Sequence[CounterDelta]] = field(default_factory=dict)
    window_cycles: Mapping[int, float | None] = field(default_factory=dict)  # counters.json, for PIDs without deltas


def load_timeline(capture: Capture, problems: list[str] | None = None) -> TimelineInput | None:
    """The time chart's input of a capture; None when it has no timeline (v1, stack map). An
    unreadable counters timeline is added to ``problems`` (the health panel)."""
    if timeline.timeline_problem(capture.meta) is not None:
        return None
    entries: dict[int, Iterable[tuple[int, str, int]]] = {}
    deltas: dict[int, Sequence[CounterDelta]] = {}
    for process in capture.processes:
        path = timeline_path(capture.directory, process.pid)
        if not process.sampled or not path.is_file():
            continue
        entries[process.pid] = iter_timeline(path)  # a generator: the file is read when build_view uses it
        try:
            rows = read_counters_timeline(capture.directory, process.pid)
        except CaptureFormatError as exc:
            rows = None  # the chart then shows samples and share only for this host
            if problems is not None:
                problems.append(f"{capture.meta.host} PID {process.pid}: time chart without cycles: {exc}")
        if rows is not None:
            deltas[process.pid] = rows
    window_cycles = {pid: c.cycles for pid, c in capture.counters.items() if pid in entries}
    return TimelineInput(capture.meta.interval, capture.meta.duration, entries, deltas, window_cycles)


# ---------------------------------------------------------------- the view (pure)


def _num(value: Any) -> float | None:
    """A CSV cell as a number; the report is lenient: an unparsable cell shows as "not measured"."""
    return cell_number(value, lenient=True)


@dataclass(frozen=True)
class TaskLine:
    task: str
    color: str
    samples: float | None
    share: float | None
    share_ci95: float | None
    cycles: float | None
    cycles_estimated: bool
    cpu_seconds: float | None
    events: float | None = None
    cycles_per_event: float | None = None


@dataclass(frozen=True)
class ProcessLine:
    host: str
    pid: int
    role: str
    engine: str
    kind: str
    cmdline: str
    samples: float | None
    cycles: float | None
    cycles_estimated: bool
    cpu_seconds: float | None
    instructions: float | None
    ipc: float | None
    preserve_frame_pointer: bool | None
    jvm_version: str | None
    exited: bool
    lost: int
    truncated: int
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class HealthLine:
    level: str  # "ok", "warn", "bad", "info"
    topic: str
    text: str


@dataclass(frozen=True)
class HostSection:
    name: str
    state: str
    reason: str
    hostname: str
    kernel: str
    window: str
    cycles_source: str
    warnings: tuple[str, ...]
    tasks: tuple[TaskLine, ...]


@dataclass(frozen=True)
class ReportView:
    """What the templates show: tables as records, the JavaScript payload as one JSON object."""

    title: str
    run_id: str
    bare_capture: bool
    meta: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    health: tuple[HealthLine, ...]
    cluster_tasks: tuple[TaskLine, ...]
    cluster_tasks_note: str
    events_note: str  # events processed in the window and where the number came from, or ""
    show_cycles_per_event: bool
    hosts: tuple[HostSection, ...]
    processes: tuple[ProcessLine, ...]
    candidates: tuple[tuple[str, int, float], ...]
    unmatched_samples: int
    profile_text: str | None
    profile_source: str | None
    payload: dict[str, Any]
    task_names: tuple[str, ...]


def task_colors(task_names: Sequence[str]) -> dict[str, str]:
    colors = {}
    for index, name in enumerate(n for n in task_names if n != UNMATCHED):
        colors[name] = TASK_PALETTE[index % len(TASK_PALETTE)]
    colors[UNMATCHED] = UNMATCHED_COLOR
    return colors


def _task_order(profile_tasks: Sequence[str], rows: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """Profile order, then tasks only the CSV knows (a profile changed since), ``unmatched`` last."""
    names = [t for t in profile_tasks if t != UNMATCHED]
    for row in rows:
        task = row.get("task", "")
        if task and task not in (ALL_TASKS, UNMATCHED) and task not in names:
            names.append(task)
    return (*names, UNMATCHED)


def _line_from_row(row: Mapping[str, str], colors: Mapping[str, str]) -> TaskLine:
    task = row.get("task", "")
    return TaskLine(
        task=task,
        color=colors.get(task, MIXED_COLOR),
        samples=_num(row.get("samples")),
        share=_num(row.get("share")),
        share_ci95=_num(row.get("share_ci95")),
        cycles=_num(row.get("cycles")),
        cycles_estimated=row.get("cycles_estimated") in ("1", "true", "True"),
        cpu_seconds=_num(row.get("cpu_seconds")),
        events=_num(row.get("events")),
        cycles_per_event=_num(row.get("cycles_per_event")),
    )


def aggregate_task_lines(
    rows: Sequence[Mapping[str, str]], task_names: Sequence[str], colors: Mapping[str, str]
) -> tuple[TaskLine, ...]:
    """Task totals over PID rows (``*`` rows skipped). Share is by cycles when every PID has them,
    otherwise by samples; the interval is the samples' Wilson interval (one host's or a bare capture's
    view; summary.csv carries the pipeline's own cluster figures)."""
    from profiler.stats import share_ci95

    by_task = pid_rows_by_task(rows, task_names)
    task_rows = [row for task in task_names for row in by_task[task]]
    lines = []
    total_samples = sum_known(_num(r.get("samples")) for r in task_rows) or 0.0
    all_cycles_known = bool(task_rows) and all(_num(r.get("cycles")) is not None for r in task_rows)
    total_cycles = sum_known(_num(r.get("cycles")) for r in task_rows) if all_cycles_known else None
    for task in task_names:
        mine = by_task[task]
        samples = sum_known(_num(r.get("samples")) for r in mine)
        cycles = sum_known(_num(r.get("cycles")) for r in mine) if mine else None
        if total_cycles:
            share: float | None = (cycles or 0.0) / total_cycles
        else:
            share = (samples or 0.0) / total_samples if total_samples else None
        ci = share_ci95(int(samples or 0), int(total_samples)) if total_samples else None
        lines.append(
            TaskLine(
                task=task,
                color=colors.get(task, MIXED_COLOR),
                samples=samples,
                share=share,
                share_ci95=ci,
                cycles=cycles,
                cycles_estimated=any(r.get("cycles_estimated") in ("1", "true", "True") for r in mine),
                cpu_seconds=sum_known(_num(r.get("cpu_seconds")) for r in mine),
            )
        )
    return tuple(lines)


def _ordered_lines(lines: Iterable[TaskLine], task_names: Sequence[str]) -> tuple[TaskLine, ...]:
    rank = {name: index for index, name in enumerate(task_names)}
    return tuple(sorted(lines, key=lambda line: rank.get(line.task, len(rank))))


def _fmt_time(unix: float | None) -> str:
    if unix is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix))


def _window(capture: Capture | None) -> str:
    if capture is None:
        return "—"
    meta = capture.meta
    return f"{_fmt_time(meta.start_time)}, {meta.duration:.1f} s ({meta.stopped_by})"


def _health(
    run: RunData,
    processes: Sequence[ProcessLine],
    unmatched_share: float | None,
    graphs_dropped: int,
    max_stacks: int,
    multi_task_share: float | None = None,
) -> tuple[HealthLine, ...]:
    captures = [h.capture for h in run.hosts if h.capture is not None]
    lines = [
        *_hosts_health(run),
        *_cycles_health(captures, processes),
        *_frame_pointer_health(processes),
        *_stacks_health(captures),
        *_sampler_health(captures),
        *_matching_health(unmatched_share, multi_task_share),
        *_overhead_health(captures),
    ]
    for capture in captures:
        for warning in capture.meta.warnings:
            lines.append(HealthLine("warn", f"{capture.meta.host}", warning))
    if graphs_dropped:
        lines.append(HealthLine(
            "info", "flamegraphs",
            f"{graphs_dropped} flamegraph(s) drop their smallest stacks beyond {max_stacks} distinct stacks "
            "(totals stay exact); re-render with `coordinator report --max-stacks N` (0 keeps all)",
        ))
    return tuple(lines)


def _hosts_health(run: RunData) -> list[HealthLine]:
    """Hosts missing or failed."""
    bad_hosts = [h for h in run.hosts if h.state != HOST_OK or h.capture is None]
    if not bad_hosts:
        return [HealthLine("ok", "hosts", f"all {len(run.hosts)} host(s) profiled")]
    lines = []
    for host in bad_hosts:
        reason = f": {host.reason}" if host.reason else ""
        lines.append(HealthLine("bad", "hosts", f"{host.name}: {host.state}{reason}"))
    return lines


def _cycles_health(captures: Sequence[Capture], processes: Sequence[ProcessLine]) -> list[HealthLine]:
    """Cycles measured or estimated."""
    sources = sorted({c.meta.cycles_source for c in captures})
    estimated_pids = [p for p in processes if p.cycles_estimated]
    if "estimated" in sources or estimated_pids:
        return [HealthLine(
            "warn", "cycles",
            f"cycles estimated (task-clock × nominal frequency) for {len(estimated_pids)} PID(s): no hardware "
            "cycles counter; shares are exact, absolute cycles and IPC are approximate",
        )]
    if captures:
        return [HealthLine("ok", "cycles", "cycles measured with the hardware counter on every host")]
    return []


def _frame_pointer_health(processes: Sequence[ProcessLine]) -> list[HealthLine]:
    no_fp = [p for p in processes if p.role == "workload" and p.preserve_frame_pointer is False]
    unknown_fp = [p for p in processes if p.role == "workload" and p.jvm_version and p.preserve_frame_pointer is None]
    if no_fp:
        pids = ", ".join(f"{p.host}:{p.pid}" for p in no_fp)
        return [HealthLine(
            "bad", "frame pointers",
            f"JVMs without -XX:+PreserveFramePointer: {pids}; their Java stacks are cut short, "
            "restart them with the flag",
        )]
    if unknown_fp:
        return [HealthLine("warn", "frame pointers", f"PreserveFramePointer unknown for {len(unknown_fp)} JVM(s)")]
    if any(p.role == "workload" for p in processes):
        return [HealthLine("ok", "frame pointers", "every sampled JVM runs with PreserveFramePointer")]
    return []


def _stacks_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """Lost, truncated and unwalkable stacks over every sampled PID."""
    samples = sum(s.samples for c in captures for s in c.sampler.values())
    if not samples:
        return []
    lost = sum(s.lost_user_stack + s.lost_kernel_stack for c in captures for s in c.sampler.values())
    truncated = sum(s.truncated for c in captures for s in c.sampler.values())
    unwalkable = sum(s.java_unwalkable for c in captures for s in c.sampler.values())
    if any(c.meta.stack_collection == "stackmap" for c in captures):
        lost_what, lost_fix = "stacks lost (stack map full or collision)", "raise --stack-storage-size"
    else:  # the ring buffer stores every walked stack: a lost one was not walkable
        lost_what, lost_fix = "stacks not walked (fault)", "use -XX:+PreserveFramePointer"
    lines = []
    for count, what, fix in (
        (lost, lost_what, lost_fix),
        (truncated, "stacks truncated at the depth limit", "raise the stack depth limit"),
        (unwalkable, "samples with unwalkable Java frames", "use -XX:+PreserveFramePointer"),
    ):
        share = count / samples
        level = "warn" if share > LOST_WARN else "ok"
        text = f"{count} of {samples} samples ({share:.1%}) {what}"
        lines.append(HealthLine(level, "stacks", text + (f"; {fix}" if level != "ok" else "")))
    return lines


def _matching_health(unmatched_share: float | None, multi_task_share: float | None) -> list[HealthLine]:
    """The unmatched share, and how often the leaf-first rule chose among several tasks."""
    lines = []
    if unmatched_share is not None:
        level = "warn" if unmatched_share > UNMATCHED_WARN else "ok"
        text = f"{unmatched_share:.1%} of the samples matched no task"
        if level == "warn":
            text += "; add the candidate patterns below to the application profile"
        lines.append(HealthLine(level, "unmatched", text))
    if multi_task_share:
        lines.append(HealthLine(
            "info", "matching",
            f"{multi_task_share:.1%} of the samples matched patterns of several tasks in different frames; "
            "the frame nearest the leaf decided (docs/matching.md)",
        ))
    return lines


def _overhead_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """The profiler's own overhead on each host."""
    lines = []
    for capture in captures:
        overhead = capture.overhead
        if overhead is None:
            continue
        duration = max(capture.meta.duration, 1e-9)
        per_core = overhead.profiler_cpu_seconds / duration
        bpf = (
            f", BPF programs {overhead.bpf_run_time_ns / 1e9:.3f} s in {overhead.bpf_run_count} runs"
            if overhead.bpf_run_time_ns is not None
            else ""
        )
        lines.append(HealthLine(
            "warn" if per_core > OVERHEAD_WARN else "ok",
            "overhead",
            f"{capture.meta.host}: profiler used {overhead.profiler_cpu_seconds:.2f} CPU s "
            f"({per_core:.1%} of one core){bpf}, post-run {overhead.post_run_seconds:.1f} s, "
            f"peak RSS {overhead.peak_rss_bytes / 2**20:.0f} MiB",
        ))
    return lines


def _sampler_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """One line per sampled PID: samples only in the interpreter, Java frames left unresolved,
    perf-map snapshots used, samples dropped (ring buffer or counts map full). Format 1 captures
    did not count the Java figures, so they get the dropped count only."""
    lines = []
    for capture in captures:
        ringbuf = capture.meta.stack_collection == "ringbuf"
        full = "ring buffer full" if ringbuf else "counts map full"
        for pid in sorted(capture.sampler):
            stats = capture.sampler[pid]
            if not stats.samples:
                continue
            dropped_share = stats.dropped / stats.samples
            parts, level = [], "warn" if dropped_share > LOST_WARN else "ok"
            if capture.meta.format_version >= 2 and not stats.java_frames:
                parts.append("no Java frames seen")
            elif capture.meta.format_version >= 2:
                interpreted = stats.interpreted_only / stats.samples
                unresolved = stats.java_frames_unresolved / stats.java_frames if stats.java_frames else 0.0
                parts += [
                    f"{interpreted:.1%} of samples interpreted only",
                    f"{unresolved:.1%} of {stats.java_frames:,} Java frames unresolved",
                    f"{stats.perf_map_snapshots} perf-map snapshot(s)",
                ]
                if interpreted > INTERPRETED_WARN or unresolved > UNRESOLVED_WARN:
                    level = "warn"
            parts.append(f"{stats.dropped:,} dropped ({full}, {dropped_share:.1%})")
            lines.append(HealthLine(level, f"{capture.meta.host} PID {pid}", ", ".join(parts)))
    return lines


def build_view(
    run: RunData,
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    max_stacks: int = DEFAULT_MAX_STACKS,
    candidate_count: int = 15,
    problems: Sequence[str] = (),
    timelines: Mapping[str, TimelineInput] | None = None,
) -> ReportView:
    """Pure: run data, stacks (host → pid → folded counts) and timelines (host → TimelineInput,
    read once) in, everything the page shows out."""
    from profiler.appprofile import parse_profile

    profile = parse_profile(run.profile_text, run.profile_source or "<profile>") if run.profile_text else None
    profile_tasks = profile.task_names if profile is not None else ()
    task_names = _task_order(profile_tasks, run.rows)
    colors = task_colors(task_names)
    matcher = Matcher(profile) if profile is not None else None
    captures = {h.name: h.capture for h in run.hosts if h.capture is not None}
    processes_by_host = {name: {p.pid: p for p in c.processes} for name, c in captures.items()}

    frames = flame.FrameTable()
    graphs, by_task = _flamegraphs(
        stacks, flame.StackClassifications(matcher, task_names), frames, processes_by_host, max_stacks
    )
    task_samples = {task: sum(counts.values()) for task, counts in by_task.items()}
    unmatched_total = task_samples[UNMATCHED]

    rows, rows_source = _table_rows(run, stacks, matcher)
    cluster_rows = [r for r in rows if r.get("host") == ALL_TASKS and r.get("pid") == ALL_TASKS]
    cluster, note = _cluster_lines(cluster_rows, rows, rows_source, task_names, colors)
    processes = _process_lines(run, rows)
    unit, bars = _pid_bars(rows, processes_by_host)

    problems = list(problems)
    time_chart = [
        series.to_json({name: index for index, name in enumerate(task_names)})
        for series in time_series(timelines or {}, matcher, task_names, problems)
    ]
    health = tuple(HealthLine("bad", "capture", problem) for problem in problems) + _health(
        run,
        processes,
        _unmatched_share(cluster, task_samples),
        sum(1 for g in graphs if g.dropped_stacks),
        max_stacks,
        _multi_task_share(cluster_rows),
    )
    payload: dict[str, Any] = {
        "runId": run.run_id,
        "frames": frames.names,
        "tasks": [{"name": name, "color": colors[name]} for name in task_names],
        "mixedColor": MIXED_COLOR,
        "graphs": [g.to_json() for g in graphs],
        "defaultGraph": next((g.key for g in graphs if g.kind == "host"), graphs[0].key if graphs else None),
        "maxStacks": max_stacks,
        "chart": {"unit": unit, "bars": bars},
        "timeline": {"hosts": time_chart, "window": _window_payload(run)},
        "overhead": _overhead_payload(captures),
    }
    return ReportView(
        title=f"Task-level CPU profile {run.run_id}",
        run_id=run.run_id,
        bare_capture=run.bare_capture,
        meta=_meta_lines(run, rows_source),
        labels=tuple(sorted(run.labels.items())),
        health=health,
        cluster_tasks=cluster,
        cluster_tasks_note=note,
        events_note=_events_note(run, cluster),
        show_cycles_per_event=any(line.cycles_per_event is not None for line in cluster),
        hosts=_host_sections(run, rows, task_names, colors),
        processes=processes,
        candidates=_candidates(by_task[UNMATCHED], candidate_count),
        unmatched_samples=unmatched_total,
        profile_text=run.profile_text,
        profile_source=run.profile_source,
        payload=payload,
        task_names=task_names,
    )


def _candidates(unmatched: Mapping[str, int], count: int) -> tuple[tuple[str, int, float], ...]:
    """(leaf frame, samples, share of the unmatched samples) of the ``count`` best candidate patterns."""
    from profiler.matcher import candidate_patterns

    total = sum(unmatched.values())
    return tuple(
        (frame, samples, samples / total if total else 0.0) for frame, samples in candidate_patterns(unmatched, count)
    )


def _cluster_lines(
    cluster_rows: Sequence[Mapping[str, str]],
    rows: Sequence[Mapping[str, str]],
    rows_source: str,
    task_names: Sequence[str],
    colors: Mapping[str, str],
) -> tuple[tuple[TaskLine, ...], str]:
    """The cluster table (summary.csv's cluster rows, else summed over the PID rows) and its note."""
    if cluster_rows:
        lines = _ordered_lines(
            (_line_from_row(r, colors) for r in cluster_rows if r.get("task") != ALL_TASKS), task_names
        )
        return lines, "from summary.csv (coordinator analyze)"
    lines = aggregate_task_lines(rows, task_names, colors)
    return lines, f"summed over the PID rows of the {rows_source}; share by cycles, interval from samples"


def _unmatched_share(cluster: Sequence[TaskLine], task_samples: Mapping[str, int]) -> float | None:
    """The cluster table's unmatched share, else the flamegraphs' (a run without result rows)."""
    unmatched_line = next((line for line in cluster if line.task == UNMATCHED), None)
    if unmatched_line is not None and unmatched_line.share is not None:
        return unmatched_line.share
    all_task_samples: int = sum(task_samples.values(), 0)
    return task_samples.get(UNMATCHED, 0) / all_task_samples if all_task_samples else None


def _flamegraphs(
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    classifications: flame.StackClassifications,
    frames: flame.FrameTable,
    processes_by_host: Mapping[str, Mapping[int, ProcessInfo]],
    max_stacks: int,
) -> tuple[list[flame.FlameGraph], dict[str, dict[str, int]]]:
    """Every flamegraph of the page (per host, per PID, per task's drill-down) and the stacks of
    all hosts split by task."""
    graphs: list[flame.FlameGraph] = []

    def graph(counts: Mapping[str, int], key: str, title: str, kind: str, root: str) -> None:
        graphs.append(flame.build_flamegraph(
            counts, classifications, frames, key=key, title=title, kind=kind, root_name=root, max_stacks=max_stacks
        ))

    all_counts: dict[str, int] = {}
    for host_name in sorted(stacks):
        per_pid = stacks[host_name]
        merged = flame.merge_counts(per_pid[pid] for pid in sorted(per_pid))
        if not merged:
            continue
        graph(merged, f"host:{host_name}", f"host {host_name}: all workload PIDs", "host", f"host {host_name}")
        for pid in sorted(per_pid):
            if not per_pid[pid]:
                continue
            process = processes_by_host.get(host_name, {}).get(pid)
            what = f" ({process.engine} {process.kind})" if process is not None else ""
            graph(per_pid[pid], f"pid:{host_name}:{pid}", f"{host_name} PID {pid}{what}", "pid", f"PID {pid}")
        for stack, count in merged.items():
            all_counts[stack] = all_counts.get(stack, 0) + count
    by_task = classifications.split_by_task(all_counts)
    for task in classifications.task_names:
        title = "unmatched stacks (no task pattern matched)" if task == UNMATCHED else f"task {task}: drill-down"
        graph(by_task[task], f"task:{task}", title, "unmatched" if task == UNMATCHED else "task", task)
    return graphs, by_task


def _table_rows(
    run: RunData, stacks: Mapping[str, Mapping[int, Mapping[str, int]]], matcher: Matcher | None
) -> tuple[list[Mapping[str, str]], str]:
    """The result rows the tables show and where they come from. Hosts without result rows (a run
    not analysed yet) get the host agent's own pre-aggregation of their capture, so every table
    has the same shape."""
    rows = list(run.rows)
    rows_source = run.rows_source
    hosts_with_rows = {r.get("host") for r in rows}
    for host in run.hosts:
        if host.capture is not None and host.name not in hosts_with_rows:
            rows.extend(_rows_from_capture(host.name, host.capture, stacks.get(host.name, {}), matcher))
            rows_source = f"{run.rows_source} and the captures" if run.rows else "the captures (pre-aggregated here)"
    return rows, rows_source


def _host_sections(
    run: RunData, rows: Sequence[Mapping[str, str]], task_names: Sequence[str], colors: Mapping[str, str]
) -> tuple[HostSection, ...]:
    sections = []
    for host in run.hosts:
        host_rows = [r for r in rows if r.get("host") == host.name]
        level_rows = [r for r in host_rows if r.get("pid") == ALL_TASKS and r.get("task") != ALL_TASKS]
        lines = (
            _ordered_lines((_line_from_row(r, colors) for r in level_rows), task_names)
            if level_rows
            else aggregate_task_lines(host_rows, task_names, colors)
        )
        capture = host.capture
        sections.append(HostSection(
            name=host.name,
            state=host.state,
            reason=host.reason,
            hostname=capture.meta.hostname if capture else "—",
            kernel=capture.meta.kernel if capture else "—",
            window=_window(capture),
            cycles_source=capture.meta.cycles_source if capture else "—",
            warnings=capture.meta.warnings if capture else (),
            tasks=lines if host_rows else (),
        ))
    return tuple(sections)


def _pid_bars(
    rows: Sequence[Mapping[str, str]], processes_by_host: Mapping[str, Mapping[int, ProcessInfo]]
) -> tuple[str, list[dict[str, Any]]]:
    """Stacked bars: task cycles (or samples where cycles are unknown) per workload PID; (unit, bars)."""
    bars = []
    unit = "cycles"
    pid_task_rows = [r for r in rows if r.get("pid") not in (ALL_TASKS, None) and r.get("task") != ALL_TASKS]
    if pid_task_rows and any(_num(r.get("cycles")) is None for r in pid_task_rows):
        unit = "samples"
    seen: dict[tuple[str, str], dict[str, float]] = {}
    for row in pid_task_rows:
        key = (row.get("host", ""), row.get("pid", ""))
        value = _num(row.get(unit)) or 0.0
        seen.setdefault(key, {})[row.get("task", "")] = value
    for (host_name, pid_text), values in sorted(seen.items(), key=lambda item: (item[0][0], _num(item[0][1]) or 0)):
        process = processes_by_host.get(host_name, {}).get(int(pid_text)) if pid_text.isdigit() else None
        kind = f" {process.kind}" if process is not None and process.kind else ""
        bars.append({"label": f"{host_name} · {pid_text}{kind}", "host": host_name, "pid": pid_text, "values": values})
    return unit, bars


def _multi_task_share(cluster_rows: Sequence[Mapping[str, str]]) -> float | None:
    """Share of the cluster's samples whose frames matched several tasks (summary.csv only)."""
    cluster_task_rows = [r for r in cluster_rows if r.get("task") != ALL_TASKS]
    multi = sum_known(_num(r.get("multi_task_samples")) for r in cluster_task_rows)
    cluster_samples = sum_known(_num(r.get("samples")) for r in cluster_task_rows)
    return multi / cluster_samples if multi is not None and cluster_samples else None


def _overhead_payload(captures: Mapping[str, Capture]) -> list[dict[str, Any]]:
    overhead = []
    for host_name, host_capture in captures.items():
        series = timeline.overhead_series(host_capture.overhead)
        if series is not None:
            overhead.append({"host": host_name, **series.to_json()})
    return overhead


def time_series(
    timelines: Mapping[str, TimelineInput],
    matcher: Matcher | None,
    task_names: Sequence[str],
    problems: list[str],
) -> list[timeline.HostTimeline]:
    """The time chart of every host with a timeline, hosts in name order. Stacks are classified by
    ``matcher`` (the summary's Matcher; None: everything is unmatched); a timeline that cannot be
    read leaves its PID out and adds a line to ``problems``."""
    match = matcher.match if matcher is not None else (lambda stack: UNMATCHED)
    out = []
    for host in sorted(timelines):
        data = timelines[host]
        per_pid = {}
        for pid in sorted(data.entries):
            try:
                per_pid[pid] = timeline.task_interval_samples(data.entries[pid], match)
            except (CaptureFormatError, OSError) as exc:
                problems.append(f"{host} PID {pid}: left out of the time chart: {exc}")
        if per_pid:
            out.append(timeline.host_timeline(
                host, data.interval, data.duration, per_pid, data.deltas, task_names, data.window_cycles
            ))
    return out


def _window_payload(run: RunData) -> dict[str, Any] | None:
    """The sub-window the tables were computed for, as the time chart shades it (seconds)."""
    spans = [
        h for h in (run.window or {}).get("hosts", ()) if h.get("run") == run.run_id and not h.get("whole_window")
    ]
    if not spans:
        return None
    return {"from": min(float(h["from"]) for h in spans), "to": max(float(h["to"]) for h in spans)}


def _window_meta(run: RunData) -> str | None:
    """The header line of a sub-window analysis: the sub-window used (whole intervals) and the asked one."""
    if run.window is None:
        return None
    entries = [h for h in run.window.get("hosts", ()) if h.get("run") == run.run_id]
    start, end = run.window.get("from"), run.window.get("to")
    asked = f"--from {start or 0:g}" + (f" --to {end:g}" if end is not None else "")
    used = sorted({f"{float(h['from']):g}–{float(h['to']):g} s" for h in entries}) or ["none"]
    intervals = sorted({f"{float(h['interval']):g} s" for h in entries})
    text = f"{', '.join(used)} of the window ({asked}; whole {', '.join(intervals) or '—'} intervals)"
    if entries and all(h.get("whole_window") for h in entries):
        text += ", i.e. the whole window"
    return text + "; task tables, charts of tasks per executor and flamegraphs show only it, health the whole window"


def _events_note(run: RunData, cluster: Sequence[TaskLine]) -> str:
    events = next((line.events for line in cluster if line.events is not None), None)
    sources = sorted({
        h.capture.events.source for h in run.hosts
        if h.capture is not None and h.capture.events is not None and h.capture.events.count is not None
    })
    if events is None:
        return ""
    where = f" (from {', '.join(sources)})" if sources else ""
    return f"{format_number(events, 0)} events processed in the window{where}"


def _meta_lines(run: RunData, rows_source: str) -> tuple[tuple[str, str], ...]:
    captures = [h.capture for h in run.hosts if h.capture is not None]
    lines: list[tuple[str, str]] = [("run", run.run_id)]
    if run.info is not None:
        info = run.info
        lines += [
            ("started", _fmt_time(info.start_time)),
            ("ended", _fmt_time(info.end_time)),
            ("duration", f"{info.duration:g} s requested"),
            ("frequency", f"{info.frequency} Hz"),
            ("cluster file", info.cluster_file),
            ("profile", info.profile_name),
            ("complete", "yes" if info.complete else "no"),
        ]
        lines += [(f"version {name}", value) for name, value in sorted(info.versions.items())]
    elif captures:
        meta = captures[0].meta
        lines += [
            ("started", _fmt_time(meta.start_time)),
            ("window", f"{meta.duration:.1f} s ({meta.stopped_by})"),
            ("frequency", f"{meta.frequency} Hz"),
            ("profile", meta.profile_name),
            ("profiler", meta.profiler_version),
            ("kind", "bare host capture (`profiler run`)"),
        ]
    lines.append(("hosts", str(len(run.hosts))))
    lines.append(("tables from", rows_source))
    window = _window_meta(run)
    if window is not None:
        lines.append(("sub-window", window))
    return tuple(lines)


def _rows_from_capture(
    host: str, capture: Capture, stacks: Mapping[int, Mapping[str, int]], matcher: Matcher | None
) -> list[dict[str, str]]:
    """<host>_result.csv rows computed like the host agent does (profiler.aggregate), as CSV text cells."""
    from profiler.aggregate import aggregate_host
    from profiler.capture import format_result_csv
    from profiler.matcher import match_stacks

    if matcher is None:
        return []
    matched = {pid: match_stacks(matcher, counts) for pid, counts in stacks.items()}
    rows = aggregate_host(host, capture.processes, matched, capture.counters, capture.net)
    return [dict(row) for row in csv.DictReader(format_result_csv(rows).splitlines())]


def _process_lines(run: RunData, rows: Sequence[Mapping[str, str]]) -> tuple[ProcessLine, ...]:
    totals = {
        (r.get("host", ""), r.get("pid", "")): r
        for r in rows
        if r.get("task") == ALL_TASKS and r.get("pid") != ALL_TASKS
    }
    lines = []
    for host in run.hosts:
        capture = host.capture
        if capture is None:
            continue
        for process in sorted(capture.processes, key=lambda p: (p.role != "workload", p.pid)):
            row = totals.get((host.name, str(process.pid)), {})
            counters = capture.counters.get(process.pid)
            sampler = capture.sampler.get(process.pid)
            cycles = _num(row.get("cycles"))
            if cycles is None and counters is not None:
                cycles = counters.cycles
            estimated = row.get("cycles_estimated") in ("1", "true", "True") or (
                not row and counters is not None and counters.cycles_estimated
            )
            cpu = _num(row.get("cpu_seconds"))
            if cpu is None and counters is not None:
                cpu = counters.cpu_seconds
            warnings = []
            if process.role == "workload" and process.preserve_frame_pointer is False:
                warnings.append("no PreserveFramePointer")
            if process.exited:
                warnings.append("exited during the window")
            if counters is not None and counters.cycles is None:
                warnings.append("no cycles counter")
            if process.role == "workload" and sampler is None:
                warnings.append("no sampler stats")
            lines.append(ProcessLine(
                host=host.name,
                pid=process.pid,
                role=process.role,
                engine=process.engine,
                kind=process.kind,
                cmdline=process.cmdline,
                samples=_num(row.get("samples")) if row else (float(sampler.samples) if sampler else None),
                cycles=cycles,
                cycles_estimated=estimated,
                cpu_seconds=cpu,
                instructions=_num(row.get("instructions")),
                ipc=_num(row.get("ipc")),
                preserve_frame_pointer=process.preserve_frame_pointer,
                jvm_version=process.jvm_version,
                exited=process.exited,
                lost=(sampler.lost_user_stack + sampler.lost_kernel_stack) if sampler else 0,
                truncated=sampler.truncated if sampler else 0,
                warnings=tuple(warnings),
            ))
    return tuple(lines)


# ---------------------------------------------------------------- rendering


def format_si(value: float | None, unit: str = "") -> str:
    """1234567 → "1.23 M"; None → "—" (not measured, never 0)."""
    if value is None:
        return "—"
    magnitude = abs(value)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    if float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def format_share(share: float | None, ci: float | None = None) -> str:
    if share is None:
        return "—"
    text = f"{share * 100:.1f} %"
    if ci is not None and ci > 0:
        text = f"{share * 100:.1f} ± {ci * 100:.1f} %"
    return text


def format_number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def format_bytes(size: int) -> str:
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def template_environment() -> Any:
    """jinja2 over the templates shipped in the package; autoescaping on for every template."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("coordinator.templates", "."),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["si"] = format_si
    env.filters["share"] = format_share
    env.filters["number"] = format_number
    env.filters["bytes"] = format_bytes
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    return env


def _asset(name: str) -> bytes:
    return resources.files("coordinator.templates").joinpath(name).read_bytes()


def _copy_assets(target: Path) -> None:
    for name in STATIC_FILES:
        (target / name).write_bytes(_asset(name))
    (target / "vendor").mkdir()
    for name in VENDOR_FILES:
        (target / "vendor" / name).write_bytes(_asset(f"vendor/{name}"))


def payload_size(view: ReportView) -> int:
    """Bytes of the JSON the page carries (shown on the page and in report.json)."""
    return len(json.dumps(view.payload, separators=(",", ":")).encode("utf-8"))


def render_html(view: ReportView, payload_bytes: int | None = None) -> str:
    """The report page."""
    env = template_environment()
    size = payload_size(view) if payload_bytes is None else payload_bytes
    return str(env.get_template("report.html").render(view=view, payload=view.payload, payload_bytes=size))


def report_summary(view: ReportView, run: RunData, payload_bytes: int = 0) -> dict[str, Any]:
    """report.json beside the page: what the runs index of ``--publish`` lists."""
    start = run.info.start_time if run.info is not None else None
    if start is None:
        start = next((h.capture.meta.start_time for h in run.hosts if h.capture is not None), None)
    top = sorted(
        (line for line in view.cluster_tasks if line.share is not None and line.task != UNMATCHED),
        key=lambda line: -(line.share or 0.0),
    )[:3]
    return {
        "run_id": view.run_id,
        "start_time": start,
        "labels": dict(view.labels),
        "hosts": [{"name": h.name, "state": h.state} for h in view.hosts],
        "top_tasks": [{"task": line.task, "share": line.share} for line in top],
        "unmatched_share": next((line.share for line in view.cluster_tasks if line.task == UNMATCHED), None),
        "health_problems": sum(1 for line in view.health if line.level in ("warn", "bad")),
        "rendered_at": time.time(),
        "payload_bytes": payload_bytes,
        "flamegraphs": len(view.payload["graphs"]),
        "flamegraphs_pruned": sum(1 for g in view.payload["graphs"] if g["droppedStacks"]),
        "max_stacks": view.payload["maxStacks"],
    }


def _analysis_record(summary: Path | None) -> tuple[str | None, str | None, Mapping[str, Any] | None]:
    """The profile summary.csv was computed with (analysis.json beside it), so that colours and tables
    agree after `coordinator analyze --profile EDITED`, and its sub-window (``--from/--to``);
    (None, None, None) when there is no analysis."""
    if summary is None:
        return None, None, None
    record = summary.parent / "analysis.json"
    try:
        payload = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None, None
    if not isinstance(payload, dict):
        return None, None, None
    window = payload.get("window") if isinstance(payload.get("window"), dict) else None
    text = payload.get("profile_text")
    if not isinstance(text, str):
        return None, None, window
    return text, str(payload.get("profile_source") or record), window


def render_report(
    run_dir: Path,
    out_dir: Path | None = None,
    max_stacks: int = DEFAULT_MAX_STACKS,
    *,
    force: bool = False,
) -> Path:
    """Render the report of a run directory or host capture; returns the path of its index.html.

    ``out_dir`` defaults to ``run_dir/report``. A previous report there is replaced atomically; any
    other existing directory needs ``force``.
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "report"
    if out_dir.exists() and not (out_dir / REPORT_MARKER).exists() and not force:
        raise OutputExistsError(f"{out_dir}: exists and is not a report; choose another --out or pass --force")
    run = load_run(run_dir)
    problems: list[str] = []
    stacks = {
        h.name: load_stacks(h.capture, problems, run.host_intervals(h.name)) for h in run.hosts if h.capture is not None
    }
    timelines = {h.name: load_timeline(h.capture, problems) for h in run.hosts if h.capture is not None}
    view = build_view(
        run,
        stacks,
        max_stacks=max_stacks,
        problems=problems,
        timelines={name: t for name, t in timelines.items() if t is not None},
    )
    payload_bytes = payload_size(view)
    html = render_html(view, payload_bytes)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        _copy_assets(staging)
        (staging / "index.html").write_text(html, encoding="utf-8")
        (staging / REPORT_META).write_text(
            json.dumps(report_summary(view, run, payload_bytes), indent=1) + "\n", encoding="utf-8"
        )
        (staging / REPORT_MARKER).write_text("written by coordinator report\n", encoding="utf-8")
        os.chmod(staging, 0o755)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "index.html"
