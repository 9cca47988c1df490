"""The report's view of a run: task lines, flamegraphs, tables, charts and the payload the page draws.
Pure: loaded run data in, a ReportView out.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from coordinator.analysis import timeline
from coordinator.analysis.decide import TaskDecider
from coordinator.analysis.load import RunData, TimelineInput
from coordinator.analysis.rows import cell_number, pid_rows_by_task, sum_known
from coordinator.analysis.stages import annotate_codegen_frames, spark_index, stage_lines
from coordinator.analysis.vertices import vertex_lines
from coordinator.report import flame
from coordinator.report.flame import DEFAULT_MAX_STACKS
from coordinator.report.flinkview import events_note, flink_note, flink_vertex_lines
from coordinator.report.health import health_lines, warmup_health
from coordinator.report.latencyview import latency_note
from coordinator.report.model import HealthLine, HostSection, ProcessLine, ReportView, TaskLine
from coordinator.report.offcpuview import offcpu_flamegraphs, offcpu_table, wait_sites
from profiler.capture.format import ALL_TASKS, UNMATCHED, ProcessInfo
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import Capture
from profiler.errors import CaptureFormatError
from profiler.matching.appprofile import ApplicationProfile
from profiler.matching.matcher import Matcher

# Categorical colours for tasks in profile order (Tableau 10, then Tableau 20's light tones).
TASK_PALETTE: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#dbdb8d", "#9edae5", "#bcbd22",
)
UNMATCHED_COLOR = "#a0a0a0"
MIXED_COLOR = "#e3e3e3"
# ---------------------------------------------------------------- the view (pure)


def _num(value: Any) -> float | None:
    """A CSV cell as a number; the report is lenient: an unparsable cell shows as "not measured"."""
    return cell_number(value, lenient=True)

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
    from profiler.matching.stats import share_ci95

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


def build_view(
    run: RunData,
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    max_stacks: int = DEFAULT_MAX_STACKS,
    candidate_count: int = 15,
    problems: Sequence[str] = (),
    timelines: Mapping[str, TimelineInput] | None = None,
    offcpu: Mapping[str, Mapping[int, Sequence[OffCpuEntry]]] | None = None,
) -> ReportView:
    """Pure: run data, stacks (host → pid → folded counts), timelines (host → TimelineInput, read
    once) and off-CPU entries (host → pid → entries) in, everything the page shows out."""
    from profiler.matching.appprofile import parse_profile

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
    blocked = flame.StackClassifications(matcher, task_names, off_cpu=True)
    graphs += offcpu_flamegraphs(
        offcpu or {},
        blocked,
        frames,
        processes_by_host,
        max_stacks,
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
    spark = spark_index(run.spark_plans)
    health = (
        tuple(HealthLine("bad", "capture", problem) for problem in problems)
        + health_lines(
            run,
            processes,
            _unmatched_share(cluster, task_samples),
            sum(1 for g in graphs if g.dropped_stacks),
            max_stacks,
            _multi_task_share(cluster_rows),
        )
        + tuple(warmup_health(stacks, {
            host: frozenset(pid for pid, info in infos.items() if info.sampled)
            for host, infos in processes_by_host.items()
        }))
        + _spark_health(spark)
    )
    flink_lines = flink_vertex_lines(run, stacks, offcpu, blocked)
    vertices, subtasks = vertex_lines(run.vertex_rows)
    tasks = [{"name": name, "color": colors[name]} for name in task_names]
    payload = _payload(
        run, captures, frames, spark, tasks, graphs, max_stacks, {"unit": unit, "bars": bars}, time_chart
    )
    return ReportView(
        title=f"Task-level CPU profile {run.run_id}",
        run_id=run.run_id,
        bare_capture=run.bare_capture,
        meta=_meta_lines(run, rows_source),
        labels=tuple(sorted(run.labels.items())),
        health=health,
        cluster_tasks=cluster,
        cluster_tasks_note=note,
        events_note=events_note(run, next((line.events for line in cluster if line.events is not None), None)),
        show_cycles_per_event=any(line.cycles_per_event is not None for line in cluster),
        hosts=_host_sections(run, rows, task_names, colors),
        processes=processes,
        candidates=_candidates(by_task[UNMATCHED], candidate_count),
        unmatched_samples=unmatched_total,
        profile_text=run.profile_text,
        profile_source=run.profile_source,
        payload=payload,
        task_names=task_names,
        stages=stage_lines(run.stage_rows),
        codegen=tuple((n, ", ".join(operators)) for n, operators in sorted(spark.codegen.items())),
        flink_vertices=flink_lines,
        flink_note=flink_note(run, flink_lines),
        vertex_lines=vertices,
        subtask_lines=subtasks,
        flink_run=bool(flink_lines or vertices),
        offcpu=offcpu_table(rows, task_names, colors, wait_sites(offcpu or {}, blocked)),
        latency_note=(latency := latency_note(h.capture.events for h in run.hosts if h.capture is not None))[0],
        latency_detail=latency[1],
    )


def _spark_health(spark: Any) -> tuple[HealthLine, ...]:
    """A warning per note (up to three) when no Spark driver's REST API could be read."""
    if spark.reachable:
        return ()
    return tuple(
        HealthLine("warn", "Spark REST API", f"{note}; stages keep their ids only, codegen stages are not named")
        for note in spark.notes[:3]
    )


def _payload(
    run: RunData,
    captures: Mapping[str, Capture],
    frames: flame.FrameTable,
    spark: Any,
    tasks: list[dict[str, str]],
    graphs: Sequence[Any],
    max_stacks: int,
    chart: dict[str, Any],
    time_chart: list[Any],
) -> dict[str, Any]:
    """The page script's data: frames, tasks and their colours, flamegraphs, the chart and the timeline."""
    return {
        "runId": run.run_id,
        "frames": annotate_codegen_frames(frames.names, spark),
        "tasks": tasks,
        "mixedColor": MIXED_COLOR,
        "graphs": [g.to_json() for g in graphs],
        "defaultGraph": next((g.key for g in graphs if g.kind == "host"), graphs[0].key if graphs else None),
        "maxStacks": max_stacks,
        "chart": chart,
        "timeline": {"hosts": time_chart, "window": _window_payload(run)},
        "overhead": _overhead_payload(captures),
    }


def _candidates(unmatched: Mapping[str, int], count: int) -> tuple[tuple[str, int, float], ...]:
    """(leaf frame, samples, share of the unmatched samples) of the ``count`` best candidate patterns."""
    from profiler.matching.matcher import candidate_patterns

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
    decider = TaskDecider(matcher if matcher is not None else Matcher(ApplicationProfile((), "<no profile>")))
    out = []
    for host in sorted(timelines):
        data = timelines[host]
        per_pid = {}
        for pid in sorted(data.files):
            try:
                per_pid[pid] = decider.interval_tasks(data.files[pid])
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
    """<host>_result.csv rows computed like the host agent does (profiler.matching.aggregate), as CSV text cells."""
    from profiler.capture.format import format_result_csv
    from profiler.matching.aggregate import aggregate_host
    from profiler.matching.matcher import match_stacks

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
                user=process.user,
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


