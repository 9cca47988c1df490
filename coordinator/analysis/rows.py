"""Summary rows of an analysis: per PID, per host and cluster totals, run labels, summary.csv's text and
reading it back. Pure: typed inputs in, rows out (docs/summary-format.md).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.analysis import timeline
from coordinator.analysis.inputs import HostInput, PidInput, PidTaskCounts, RunInput
from coordinator.analysis.timeline import SubWindow
from profiler.capture import format as capture
from profiler.capture.format import ALL_TASKS, OFFCPU_COLUMNS, RESULT_COLUMNS
from profiler.errors import CaptureFormatError, ConfigError
from profiler.files.textinput import open_text
from profiler.matching.aggregate import aggregate_pid
from profiler.matching.matcher import Matcher, MatchResult, match_offcpu, match_offcpu_threads, offcpu_tasks
from profiler.matching.stats import share_ci95

SUMMARY_FILE = "summary.csv"
# A bare host capture is never written to: `coordinator analyze` puts its analysis in this subdirectory.
BARE_CAPTURE_ANALYSIS_DIR = "analysis"
TASKS_DIR = "tasks"
UNMATCHED_FILE = "unmatched.folded"
ANALYSIS_FILE = "analysis.json"
ALL = ALL_TASKS  # "*": every host / every PID / every task

STALL_EVENTS: tuple[tuple[str, str], ...] = (
    ("stalled_cycles_frontend", "stalled-cycles-frontend"),
    ("stalled_cycles_backend", "stalled-cycles-backend"),
)

# Distinct threads with blocked time in the task (offcpu_threads.json; a sub-window's from
# offcpu_timeline_threads.json), and wall seconds per such thread (docs/summary-format.md); summary columns
# only: the host result's columns stay as they were.
THREAD_COLUMNS: tuple[str, ...] = ("offcpu_threads", "wall_seconds_per_thread")

# Fixed columns of summary.csv, in order; run labels follow (docs/summary-format.md).
_PID_COLUMNS_END = RESULT_COLUMNS.index("ipc") + 1
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    *RESULT_COLUMNS[:_PID_COLUMNS_END],  # the host result's columns, then what only a summary has
    "stalled_cycles_frontend",
    "stalled_cycles_backend",
    "multi_task_samples",
    *RESULT_COLUMNS[_PID_COLUMNS_END:],  # network bytes, off-CPU seconds per cause
    *THREAD_COLUMNS,
    "events",
    "events_uncertainty",
    "events_method",
    "cycles_per_event",
    "bytes_per_event",
    "host_state",
)
_ADDITIVE = (
    "cycles", "cpu_seconds", "instructions", "stalled_cycles_frontend", "stalled_cycles_backend", *OFFCPU_COLUMNS,
    "offcpu_threads",  # the PIDs' threads are distinct threads: their counts add up
)
_NET = ("bytes_sent", "bytes_received", "bytes_sent_external", "bytes_received_external")

# ---------------------------------------------------------------- pure row math


def match_result(task_names: Sequence[str], counts: PidTaskCounts) -> MatchResult:
    """A MatchResult for aggregate_pid from the Spark job's counts (every task, zeros included)."""
    samples = {name: int(counts.samples.get(name, 0)) for name in task_names}
    multi = {name: int(counts.multi.get(name, 0)) for name in task_names}
    return MatchResult(
        task_samples=samples,
        total_samples=sum(samples.values()),
        multi_task_samples=sum(multi.values()),
        task_stacks={name: Counter() for name in task_names},
        task_multi_samples=multi,
    )


def _per_event(value: Any, events: int | None) -> float | None:
    if value is None or not events:
        return None
    return float(value) / events


def _add_event_columns(row: dict[str, Any], events: int | None) -> None:
    row["events"] = events
    row["cycles_per_event"] = _per_event(row.get("cycles"), events)
    sent, received = row.get("bytes_sent"), row.get("bytes_received")
    row["bytes_per_event"] = _per_event(sent + received, events) if sent is not None and received is not None else None


def pid_rows(
    pid: PidInput,
    task_names: Sequence[str],
    counts: PidTaskCounts | None,
    events: int | None,
    host_state: str,
    matcher: Matcher | None = None,
) -> list[dict[str, Any]]:
    """summary.csv rows of one PID: the host agent's own row math (profiler.matching.aggregate), plus run,
    stall cycles, multi-task samples and events; ``matcher`` (the analysis profile's) splits the PID's
    off-CPU time by task."""
    result = match_result(task_names, counts or PidTaskCounts()) if pid.process.sampled else None
    offcpu = threads = None
    if matcher is not None and pid.offcpu is not None:
        tasks = offcpu_tasks(matcher, pid.offcpu)  # each stack classified once, for the seconds and the threads
        offcpu = match_offcpu(matcher, pid.offcpu, tasks)
        # with --from/--to the entries are the sub-window's, their thread sets from offcpu_timeline_threads.json
        threads = match_offcpu_threads(matcher, pid.offcpu, tasks)
    rows = aggregate_pid(pid.host, pid.process, result, pid.counters, pid.net, offcpu)
    for row in rows:
        row["offcpu_threads"] = len(threads.get(str(row["task"]), ())) if threads is not None else None
        _add_per_thread(row)
        row["run"] = pid.run
        row["host_state"] = host_state
        share = row.get("share")
        assert share is None or isinstance(share, float)
        for column, event in STALL_EVENTS:
            value = pid.counters.get(event) if pid.counters is not None else None
            row[column] = value if row["task"] == ALL else (None if value is None or share is None else share * value)
        if result is not None:
            task = str(row["task"])
            row["multi_task_samples"] = result.multi_task_samples if task == ALL else result.task_multi_samples[task]
        _add_event_columns(row, events)
    return rows


def _add_per_thread(row: dict[str, Any]) -> None:
    """wall_seconds_per_thread: the row's wall seconds over its threads with blocked time (None without both)."""
    wall, threads = row.get("wall_seconds"), row.get("offcpu_threads")
    row["wall_seconds_per_thread"] = wall / threads if isinstance(wall, int | float) and threads else None


def sum_known(values: Iterable[Any]) -> float | int | None:
    """Sum of the values that were measured; None when none was (never turns "unknown" into 0)."""
    known = [v for v in values if v is not None and v != ""]
    if not known:
        return None
    return sum(known)


def pid_rows_by_task(
    rows: Iterable[Mapping[str, Any]], task_names: Sequence[str]
) -> dict[str, list[Mapping[str, Any]]]:
    """The PID rows of a group (``*`` rows of hosts and the cluster skipped) per task of
    ``task_names``, and under ``*`` each PID's total row: what every per-task sum adds up."""
    by_task: dict[str, list[Mapping[str, Any]]] = {name: [] for name in (*task_names, ALL)}
    for row in rows:
        if row.get("pid") != ALL and row.get("task") in by_task:
            by_task[str(row["task"])].append(row)
    return by_task


def group_rows(
    run: str,
    host: str,
    task_names: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    events: int | None,
    host_state: str | None,
) -> list[dict[str, Any]]:
    """Rows for a group of workload PIDs (one host, or the whole run with host ``*``): per task the
    samples and cycles summed over PIDs, share = task samples / all samples of the group, then a
    ``*`` row with the group totals. ``rows`` are pid_rows of the group (managing PIDs are skipped)."""
    by_task = pid_rows_by_task((r for r in rows if r.get("role") == "workload"), task_names)
    totals = by_task[ALL]
    all_samples = int(sum_known(r.get("samples") for r in totals) or 0)
    engines = sorted({str(r.get("engine") or "") for r in totals} - {""})
    base = {
        "run": run,
        "host": host,
        "pid": ALL,
        "role": "workload",
        "engine": ",".join(engines),
        "host_state": host_state,
    }
    out: list[dict[str, Any]] = []
    for task in (*task_names, ALL):
        members = by_task[task]
        row = dict.fromkeys(SUMMARY_COLUMNS)
        row.update(base, task=task)
        samples = int(sum_known(r.get("samples") for r in members) or 0)
        row["samples"] = samples
        if all_samples:
            row["share"] = samples / all_samples
            row["share_ci95"] = share_ci95(samples, all_samples) if task != ALL else 0.0
        for column in (*_ADDITIVE, "multi_task_samples"):
            row[column] = sum_known(r.get(column) for r in members)
        _add_per_thread(row)
        estimated = [r.get("cycles_estimated") for r in members if r.get("cycles") is not None]
        row["cycles_estimated"] = any(bool(e) for e in estimated) if estimated else None
        if task == ALL:
            for column in _NET:
                row[column] = sum_known(r.get(column) for r in members)
            measured = [r for r in members if r.get("ipc") is not None]
            cycles = sum(r["cycles"] for r in measured)
            row["ipc"] = sum(r["instructions"] for r in measured) / cycles if measured and cycles > 0 else None
        _add_event_columns(row, events)
        out.append(row)
    return out


def failed_host_row(run: str, host: HostInput) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS)
    row.update(run=run, host=host.host, pid=ALL, role="", engine="", task=ALL, host_state=host.state)
    return row


def run_rows(
    run: RunInput, task_names: Sequence[str], counts: Mapping[int, PidTaskCounts], matcher: Matcher | None = None
) -> list[dict[str, Any]]:
    """Every summary row of one run, in summary order: cluster rows (host ``*``), then per host its
    host rows (pid ``*``) and its PIDs in ascending order. ``task_names`` ends with ``unmatched``;
    ``matcher`` gives off-CPU time its tasks (without one, off-CPU columns stay empty)."""
    events = run.events
    host_blocks: list[list[dict[str, Any]]] = []
    all_pid_rows: list[dict[str, Any]] = []
    for host in sorted(run.hosts, key=lambda h: h.host):
        if host.capture_dir is None:
            host_blocks.append([failed_host_row(run.run, host)])
            continue
        rows_of_host: list[dict[str, Any]] = []
        for pid in sorted(host.pids, key=lambda p: p.process.pid):
            rows_of_host.extend(pid_rows(pid, task_names, counts.get(pid.key), events, host.state, matcher))
        all_pid_rows.extend(rows_of_host)
        host_blocks.append(group_rows(run.run, host.host, task_names, rows_of_host, events, host.state) + rows_of_host)
    out = group_rows(run.run, ALL, task_names, all_pid_rows, events, None)
    for block in host_blocks:
        out.extend(block)
    counted = run.event_count
    for row in out:
        row["_labels"] = run.labels
        if counted is not None and row.get("events") is not None:
            row["events_uncertainty"] = counted.uncertainty
            row["events_method"] = counted.method or None
    return out


# ---------------------------------------------------------------- labels and CSV


def label_columns(runs: Iterable[RunInput]) -> dict[str, str]:
    """label key -> column name: the key itself, or ``label_<key>`` when it would shadow a fixed column."""
    keys = sorted({key for run in runs for key in run.labels})
    return {key: (f"label_{key}" if key in SUMMARY_COLUMNS or key.startswith("label_") else key) for key in keys}


def format_summary(rows: Iterable[Mapping[str, Any]], columns_for_labels: Mapping[str, str]) -> str:
    """summary.csv text: fixed columns, then one column per run label; deterministic for equal input."""
    columns = SUMMARY_COLUMNS + tuple(columns_for_labels.values())
    flat = []
    for row in rows:
        labels = row.get("_labels") or {}
        flat.append({**row, **{column: labels.get(key) for key, column in columns_for_labels.items()}})
    return capture.format_result_csv(flat, columns)


_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._+-]+")


def task_file_names(task_names: Sequence[str]) -> dict[str, str]:
    """task -> a safe, unique ``<name>.folded`` file name (task names may hold spaces or '/')."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for task in task_names:
        stem = _UNSAFE_FILE_CHARS.sub("_", task).strip("._") or "task"
        candidate, n = stem, 2
        while candidate.lower() in used:
            candidate, n = f"{stem}_{n}", n + 1
        used.add(candidate.lower())
        names[task] = f"{candidate}.folded"
    return names


def analysis_record(
    runs: Sequence[RunInput],
    profile_text: str,
    profile_source: str,
    task_files: Mapping[str, str],
    master: str,
    window: SubWindow | None = None,
) -> str:
    """analysis.json text: what was analysed with which profile and over which sub-window (no
    timings: stays byte-identical)."""
    payload = {
        "format_version": 1,
        "profile_source": profile_source,
        "profile_text": profile_text,
        "master": master,
        "inputs": [
            {
                "run": run.run,
                "directory": str(run.directory),
                "labels": dict(sorted(run.labels.items())),
                "hosts": [{"host": h.host, "state": h.state, "reason": h.reason} for h in run.hosts],
            }
            for run in runs
        ],
        "task_files": dict(task_files),
        "unmatched_file": UNMATCHED_FILE,
        "window": window_record(runs, window),
    }
    return json.dumps(payload, indent=1, sort_keys=True) + "\n"


def window_record(runs: Sequence[RunInput], window: SubWindow | None) -> dict[str, Any] | None:
    """analysis.json ``window``: the requested --from/--to and, per host, the intervals used (the
    effective sub-window) and how each PID's counters were restricted; None without --from/--to."""
    if window is None or not window.requested:
        return None
    hosts = []
    for run in sorted(runs, key=lambda r: r.run):
        for host in sorted(run.hosts, key=lambda h: h.host):
            if host.span is None:
                continue
            counters = {str(p.process.pid): p.counters_source for p in host.pids if p.counters_source is not None}
            hosts.append({"run": run.run, "host": host.host, **host.span.to_json(), "counters": counters})
    return {"from": window.start, "to": window.end, "hosts": hosts}


def window_notes(runs: Sequence[RunInput]) -> list[str]:
    """One line per host restricted to a sub-window (the intervals used), and one per PID whose
    counters could not come from a counters timeline: what the command prints."""
    notes = []
    for run in sorted(runs, key=lambda r: r.run):
        for host in sorted(run.hosts, key=lambda h: h.host):
            if host.span is None:
                continue
            whole = ", the whole window" if host.span.whole else ""
            notes.append(f"{run.run} {host.host}: sub-window {host.span.describe()}{whole}")
            for pid in host.pids:
                if pid.counters_source in (timeline.COUNTERS_SCALED, timeline.COUNTERS_NONE):
                    notes.append(
                        f"{run.run} {host.host} PID {pid.process.pid}: no counters timeline, "
                        f"cycles and CPU seconds {pid.counters_source}"
                    )
    return notes


# ---------------------------------------------------------------- summary.csv reading and compare


def existing_summary(directory: Path) -> Path | None:
    """The summary.csv `coordinator analyze` wrote for a run or bare capture directory; None if none."""
    candidates = (directory / SUMMARY_FILE, directory / BARE_CAPTURE_ANALYSIS_DIR / SUMMARY_FILE)
    return next((path for path in candidates if path.is_file()), None)


def cell_number(value: Any, *, lenient: bool = False) -> float | None:
    """A summary.csv cell as a number. Empty (or absent) is None: not measured. A cell that is not
    a finite number raises ValueError, or is None when the caller is ``lenient`` (the report shows
    what it can of a damaged file; compare refuses it)."""
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        if lenient:
            return None
        raise ValueError(f"{value!r} is not a number") from None
    if math.isfinite(number):
        return number
    if lenient:
        return None
    raise ValueError(f"{value!r} is not a finite number")


def read_summary(path: Path, stages: bool = False) -> list[dict[str, str]]:
    """summary.csv's rows; Spark stage rows (``analyze --by stage``) and Flink vertex rows (``--by
    vertex``) only with ``stages``: they cut the same samples again and must never be summed with the others."""
    try:
        with open_text(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise CaptureFormatError(
            f"{path}: cannot read ({exc.strerror or exc}); run `coordinator analyze` first"
        ) from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CaptureFormatError(f"{path}: not a summary.csv ({exc}); re-run `coordinator analyze`") from None
    if not rows:  # analyze writes at least the cluster's task rows, even for a run without samples
        raise CaptureFormatError(f"{path}: no rows (an empty or cut summary.csv); re-run `coordinator analyze`")
    if not {"run", "host", "pid", "task", "samples", "cycles"} <= set(rows[0]):
        raise CaptureFormatError(f"{path}: not a summary.csv (missing columns); re-run `coordinator analyze`")
    return rows if stages else [row for row in rows if not row.get("stage") and not row.get("vertex")]


def check_numbers(path: Path, rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> None:
    """Every cell of ``columns`` empty or a finite number, else a CaptureFormatError naming the file, its
    line (rows as read_summary returns them: the header is line 1, no cell holds a line break) and the column."""
    for line, row in enumerate(rows, start=2):
        for column in columns:
            try:
                cell_number(row.get(column))
            except ValueError as exc:
                raise CaptureFormatError(
                    f"{path}:{line}: column {column}: {exc}; re-run `coordinator analyze`"
                ) from None


@dataclass(frozen=True)
class TaskTotals:
    """Cluster-level figures of one task in one run (host ``*``, pid ``*`` rows of summary.csv)."""

    samples: int
    all_samples: int
    cycles: float | None
    share: float | None


def cluster_totals(rows: Iterable[Mapping[str, Any]], run: str | None = None) -> dict[str, TaskTotals]:
    """task -> totals from summary rows of one run (``run`` None: the only run present)."""
    cluster = [r for r in rows if r.get("host") == ALL and r.get("pid") == ALL]
    runs = sorted({str(r.get("run")) for r in cluster})
    if run is None:
        if len(runs) != 1:
            raise ConfigError(f"summary holds {len(runs)} runs ({', '.join(runs) or 'none'}); compare single runs")
        run = runs[0]
    cluster = [r for r in cluster if r.get("run") == run]
    if not cluster:
        raise ConfigError(f"run {run!r} has no cluster rows in the summary; re-run `coordinator analyze`")
    all_samples = next((cell_int(r.get("samples")) for r in cluster if r.get("task") == ALL), None)
    if all_samples is None:
        all_samples = sum(cell_int(r.get("samples")) for r in cluster if r.get("task") != ALL)
    out: dict[str, TaskTotals] = {}
    for row in cluster:
        samples = cell_int(row.get("samples"))
        out[str(row["task"])] = TaskTotals(
            samples=samples,
            all_samples=all_samples,
            cycles=cell_number(row.get("cycles")),
            share=samples / all_samples if all_samples else None,
        )
    return out


def summary_totals(path: Path) -> dict[str, TaskTotals]:
    """``cluster_totals`` of the one run of a summary.csv file; any problem names the file."""
    rows = read_summary(path)
    try:
        return cluster_totals(rows)
    except ValueError as exc:
        raise CaptureFormatError(f"{path}: {exc}; re-run `coordinator analyze`") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def cell_int(value: Any) -> int:
    return int(cell_number(value) or 0)
