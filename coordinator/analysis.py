"""Pure pieces of the analysis pipeline: summary rows, host and cluster totals, run labels, the
run comparison and CSV text, plus the one function that reads run directories into typed inputs.

docs/summary-format.md describes summary.csv; coordinator/pipeline.py runs the matching on Spark.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from profiler import capture
from profiler.aggregate import aggregate_pid
from profiler.capture import ALL_TASKS, RESULT_COLUMNS, EventCount, NetStats, PidCounters, ProcessInfo
from profiler.errors import CaptureFormatError, ConfigError
from profiler.folded import read_folded
from profiler.matcher import MatchResult
from profiler.stats import share_ci95, two_proportion_z

from . import timeline
from .timeline import IntervalSpan, SubWindow

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

# Fixed columns of summary.csv, in order; run labels follow (docs/summary-format.md).
_PID_COLUMNS_END = RESULT_COLUMNS.index("ipc") + 1
SUMMARY_COLUMNS: tuple[str, ...] = (
    "run",
    *RESULT_COLUMNS[:_PID_COLUMNS_END],  # the host result's columns, then what only a summary has
    "stalled_cycles_frontend",
    "stalled_cycles_backend",
    "multi_task_samples",
    *RESULT_COLUMNS[_PID_COLUMNS_END:],  # network bytes
    "events",
    "cycles_per_event",
    "bytes_per_event",
    "host_state",
)
_ADDITIVE = ("cycles", "cpu_seconds", "instructions", "stalled_cycles_frontend", "stalled_cycles_backend")
_NET = ("bytes_sent", "bytes_received", "bytes_sent_external", "bytes_received_external")

COMPARE_COLUMNS: tuple[str, ...] = (
    "task",
    "cycles_a",
    "cycles_b",
    "cycles_delta",
    "cycles_relative_delta",
    "share_a",
    "share_b",
    "share_delta",
    "samples_a",
    "samples_b",
    "z",
    "p_value",
    "significant",
)
SIGNIFICANCE_LEVEL = 0.05


# ---------------------------------------------------------------- typed inputs


@dataclass(frozen=True)
class PidInput:
    """One process of one host capture; ``stacks`` is None for managing PIDs or missing files."""

    key: int  # position in the analysis, the join key inside the Spark job
    run: str
    host: str
    process: ProcessInfo
    stacks: Path | None  # stacks.folded, or timeline.folded when ``intervals`` is set
    counters: PidCounters | None
    net: NetStats | None
    intervals: tuple[int, int] | None = None  # sub-window: read only these intervals (inclusive)
    counters_source: str | None = None  # sub-window: how the counters were restricted (timeline.COUNTERS_*)


@dataclass(frozen=True)
class HostInput:
    host: str
    state: str  # "ok", "partial" or "failed" (no capture)
    reason: str
    capture_dir: Path | None
    events: EventCount | None
    pids: tuple[PidInput, ...] = ()
    span: IntervalSpan | None = None  # the intervals used when a sub-window was asked for


@dataclass(frozen=True)
class RunInput:
    run: str
    directory: Path
    labels: Mapping[str, str]
    hosts: tuple[HostInput, ...]
    profile_copies: tuple[Path, ...]  # application profile copies found in the run, preferred first

    @property
    def events(self) -> int | None:
        return run_events(h.events for h in self.hosts)

    @property
    def pids(self) -> tuple[PidInput, ...]:
        return tuple(p for h in self.hosts for p in h.pids)


@dataclass(frozen=True)
class PidTaskCounts:
    """What the Spark job returns per workload PID: samples and multi-task samples per task."""

    samples: Mapping[str, int] = field(default_factory=dict)
    multi: Mapping[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- reading run directories (I/O)


def _capture_pids(
    run: str, host: str, capture_dir: Path, first_key: int, window: SubWindow | None
) -> tuple[tuple[PidInput, ...], IntervalSpan | None]:
    """The PIDs of one host capture, restricted to the sub-window when one is asked for (a capture
    without a timeline is a ConfigError here, before any stack is read)."""
    info = capture.read_capture(capture_dir)
    span = None
    if window is not None and window.requested:
        problem = timeline.timeline_problem(info.meta)
        if problem is not None:
            raise ConfigError(
                f"{capture_dir}: {problem}; --from/--to need a format_version 2 capture with stack_collection "
                "ringbuf, analyse this one without them"
            )
        span = timeline.resolve_span(window, info.meta, str(capture_dir))
    pids = []
    for offset, process in enumerate(sorted(info.processes, key=lambda p: p.pid)):
        stacks = capture.stacks_path(capture_dir, process.pid)
        pid = PidInput(
            key=first_key + offset,
            run=run,
            host=host,
            process=process,
            stacks=stacks if process.sampled and stacks.is_file() else None,
            counters=info.counters.get(process.pid),
            net=info.net.get(process.pid),
        )
        if span is not None:
            pid = _restrict_pid(pid, capture_dir, span)
        pids.append(pid)
    return tuple(pids), span


def _restrict_pid(pid: PidInput, capture_dir: Path, span: IntervalSpan) -> PidInput:
    """A PID restricted to the span: stacks from timeline.folded, counters from counters_timeline.json.
    Without a counters timeline the counters stay the window totals, marked COUNTERS_SCALED (see
    _apply_sample_fractions); network bytes have no timeline and become "not measured"."""
    if span.whole:  # the same numbers as no sub-window at all: counters.json is exact
        return replace(pid, counters_source=timeline.COUNTERS_WHOLE if pid.counters is not None else None)
    stacks = None
    if pid.stacks is not None:
        stacks = capture.timeline_path(capture_dir, pid.process.pid)
        if not stacks.is_file():
            raise ConfigError(f"{stacks}: missing beside {pid.stacks.name}; re-run the capture or drop --from/--to")
    deltas = capture.read_counters_timeline(capture_dir, pid.process.pid)
    counters, source = pid.counters, None
    if counters is None:
        source = None
    elif deltas is not None:
        counters, source = timeline.window_counters(counters, deltas, span), timeline.COUNTERS_TIMELINE
    elif stacks is not None:
        source = timeline.COUNTERS_SCALED  # scaled once every input is known to be valid
    else:
        counters, source = timeline.unmeasured_counters(counters), timeline.COUNTERS_NONE
    return replace(
        pid, stacks=stacks, intervals=(span.first, span.last), counters=counters, net=None, counters_source=source
    )


def _apply_sample_fractions(run: RunInput) -> RunInput:
    """Counters of PIDs without a counters timeline: window totals × the PID's sub-window share of
    its samples (reads those PIDs' timeline.folded)."""
    hosts = []
    for host in run.hosts:
        if host.span is None or host.span.whole:
            hosts.append(host)
            continue
        pids = []
        for pid in host.pids:
            counters = pid.counters
            if pid.counters_source == timeline.COUNTERS_SCALED and counters is not None and pid.stacks:
                per_interval = timeline.interval_samples(capture.iter_timeline(pid.stacks))
                fraction = timeline.sample_fraction(per_interval, host.span)
                if fraction is None:
                    pid = replace(
                        pid, counters=timeline.unmeasured_counters(counters), counters_source=timeline.COUNTERS_NONE
                    )
                else:
                    pid = replace(pid, counters=timeline.scaled_counters(counters, fraction))
            pids.append(pid)
        hosts.append(replace(host, pids=tuple(pids)))
    return replace(run, hosts=tuple(hosts))


def read_pid_stacks(path: Path, intervals: tuple[int, int] | None) -> Counter[str]:
    """The stacks of one PID: the whole stacks.folded, or the timeline.folded lines of the
    intervals ``first..last`` merged. Both engines read through this one function."""
    if intervals is None:
        return read_folded(path)
    first, last = intervals
    counts: Counter[str] = Counter()
    for interval, stack, count in capture.iter_timeline(path):
        if first <= interval <= last:
            counts[stack] += count
    return counts


def _read_run_json(run_dir: Path) -> tuple[str, dict[str, str], list[tuple[str, str, str]]]:
    """(run id, labels, [(host, state, reason)]) from run.json; the one place that reads it."""
    from coordinator.rundir import read_run

    info = read_run(run_dir)
    hosts = [(h.host, h.state, h.reason) for h in info.hosts]
    if not hosts:  # an interrupted run may not have listed its hosts yet: trust the directories
        hosts = [(p.name, "ok", "") for p in sorted((run_dir / "hosts").glob("*")) if p.is_dir()]
    return info.run_id or run_dir.name, {str(k): str(v) for k, v in info.labels.items()}, hosts


def read_inputs(
    paths: Sequence[Path], labels: Mapping[str, str] | None = None, window: SubWindow | None = None
) -> list[RunInput]:
    """Every run directory (run.json) or bare host capture (meta.json) as typed inputs, in the
    given order. PID keys are unique over all inputs. With a ``window`` every host is restricted
    to the intervals overlapping it (HostInput.span); events (engine totals for the whole window)
    are then unknown unless the span is the whole window."""
    from coordinator.rundir import RUN_FILE, host_capture_dir

    runs: list[RunInput] = []
    next_key = 0
    seen: dict[str, Path] = {}
    for raw_path in paths:
        path = Path(raw_path)
        if (path / RUN_FILE).is_file():
            run_id, run_labels, host_list = _read_run_json(path)
            hosts = []
            copies = [path / capture.PROFILE_COPY]
            for host, state, reason in sorted(host_list):
                capture_dir = host_capture_dir(path, host)
                if state == "failed" or not capture.is_capture_dir(capture_dir):
                    why = reason or ("no capture in " + str(capture_dir) if state != "failed" else "")
                    hosts.append(HostInput(host, "failed", why, None, None))
                    continue
                pids, span = _capture_pids(run_id, host, capture_dir, next_key, window)
                next_key += len(pids)
                events = capture.read_events(capture_dir) if span is None or span.whole else None
                hosts.append(HostInput(host, state, reason, capture_dir, events, pids, span))
                copies.append(capture_dir / capture.PROFILE_COPY)
        elif capture.is_capture_dir(path):
            meta = capture.read_meta(path)
            run_id, run_labels = path.resolve().name, {}
            pids, span = _capture_pids(run_id, meta.host, path, next_key, window)
            next_key += len(pids)
            state = "ok" if meta.stopped_by != "error" else "partial"
            events = capture.read_events(path) if span is None or span.whole else None
            hosts = [HostInput(meta.host, state, "", path, events, pids, span)]
            copies = [path / capture.PROFILE_COPY]
        else:
            raise ConfigError(
                f"{path}: neither a run directory (run.json) nor a host capture (meta.json); "
                "give a directory written by `coordinator profile` or `profiler run`"
            )
        if run_id in seen:
            raise ConfigError(
                f"{path}: run id {run_id!r} is also the run id of {seen[run_id]}; analyse them separately"
            )
        seen[run_id] = path
        merged_labels = dict(run_labels)
        merged_labels.update(labels or {})
        runs.append(RunInput(run_id, path, merged_labels, tuple(hosts), tuple(c for c in copies if c.is_file())))
    return [_apply_sample_fractions(run) for run in runs]


def resolve_profile_text(runs: Sequence[RunInput], profile: Path | None) -> tuple[str, str]:
    """(profile text, where it came from): ``profile`` when given, else the runs' own copy, which
    must be the same text in every run."""
    if profile is not None:
        try:
            return Path(profile).read_text(encoding="utf-8"), str(profile)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{profile}: cannot read the application profile ({exc}); check the path") from None
    texts: dict[str, Path] = {}
    for run in runs:
        if not run.profile_copies:
            raise ConfigError(f"{run.directory}: no application_profile.txt copy in the run; pass --profile FILE")
        copy = capture.contained(run.directory, run.profile_copies[0])
        try:
            texts.setdefault(copy.read_text(encoding="utf-8"), copy)
        except (OSError, UnicodeDecodeError) as exc:
            raise CaptureFormatError(f"{copy}: cannot read the profile copy ({exc}); pass --profile FILE") from None
    if len(texts) > 1:
        names = ", ".join(str(p) for p in texts.values())
        raise ConfigError(f"{names}: the runs were profiled with different application profiles; pass --profile FILE")
    ((text, source),) = texts.items()
    return text, str(source)


# ---------------------------------------------------------------- pure row math


def run_events(counts: Iterable[EventCount | None]) -> int | None:
    """Events of a run: the largest count any host reported. Engine metrics (Spark driver, Flink
    REST) count the whole query, so several hosts report the same number; never add them."""
    known = [c.count for c in counts if c is not None and c.count is not None]
    return max(known) if known else None


def match_result(task_names: Sequence[str], counts: PidTaskCounts) -> MatchResult:
    """A MatchResult for aggregate_pid from the Spark job's counts (every task, zeros included)."""
    samples = {name: int(counts.samples.get(name, 0)) for name in task_names}
    multi = {name: int(counts.multi.get(name, 0)) for name in task_names}
    return MatchResult(
        task_samples=samples,
        total_samples=sum(samples.values()),
        unmatched=Counter(),
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
) -> list[dict[str, Any]]:
    """summary.csv rows of one PID: the host agent's own row math (profiler.aggregate), plus run,
    stall cycles, multi-task samples and events."""
    result = match_result(task_names, counts or PidTaskCounts()) if pid.process.sampled else None
    rows = aggregate_pid(pid.host, pid.process, result, pid.counters, pid.net)
    for row in rows:
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


def run_rows(run: RunInput, task_names: Sequence[str], counts: Mapping[int, PidTaskCounts]) -> list[dict[str, Any]]:
    """Every summary row of one run, in summary order: cluster rows (host ``*``), then per host its
    host rows (pid ``*``) and its PIDs in ascending order. ``task_names`` ends with ``unmatched``."""
    events = run.events
    host_blocks: list[list[dict[str, Any]]] = []
    all_pid_rows: list[dict[str, Any]] = []
    for host in sorted(run.hosts, key=lambda h: h.host):
        if host.capture_dir is None:
            host_blocks.append([failed_host_row(run.run, host)])
            continue
        rows_of_host: list[dict[str, Any]] = []
        for pid in sorted(host.pids, key=lambda p: p.process.pid):
            rows_of_host.extend(pid_rows(pid, task_names, counts.get(pid.key), events, host.state))
        all_pid_rows.extend(rows_of_host)
        host_blocks.append(group_rows(run.run, host.host, task_names, rows_of_host, events, host.state) + rows_of_host)
    out = group_rows(run.run, ALL, task_names, all_pid_rows, events, None)
    for block in host_blocks:
        out.extend(block)
    for row in out:
        row["_labels"] = run.labels
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


def read_summary(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise CaptureFormatError(
            f"{path}: cannot read ({exc.strerror or exc}); run `coordinator analyze` first"
        ) from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CaptureFormatError(f"{path}: not a summary.csv ({exc}); re-run `coordinator analyze`") from None
    if rows and not {"run", "host", "pid", "task", "samples", "cycles"} <= set(rows[0]):
        raise CaptureFormatError(f"{path}: not a summary.csv (missing columns); re-run `coordinator analyze`")
    return rows


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
    all_samples = next((_int(r.get("samples")) for r in cluster if r.get("task") == ALL), None)
    if all_samples is None:
        all_samples = sum(_int(r.get("samples")) for r in cluster if r.get("task") != ALL)
    out: dict[str, TaskTotals] = {}
    for row in cluster:
        samples = _int(row.get("samples"))
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


def _int(value: Any) -> int:
    return int(cell_number(value) or 0)


def compare_runs(
    a: Mapping[str, TaskTotals], b: Mapping[str, TaskTotals], level: float = SIGNIFICANCE_LEVEL
) -> list[dict[str, Any]]:
    """Per task (A's order, then tasks only B has, ``*`` last): cycles and share in both runs, deltas
    (B − A), and the pooled two-proportion z-test of the shares; ``significant`` when p < ``level``."""
    tasks = [t for t in a if t != ALL] + [t for t in b if t not in a and t != ALL]
    if ALL in a or ALL in b:
        tasks.append(ALL)
    empty = TaskTotals(0, 0, None, None)
    rows = []
    for task in tasks:
        ta, tb = a.get(task, empty), b.get(task, empty)
        n_a = ta.all_samples or next((t.all_samples for t in a.values()), 0)
        n_b = tb.all_samples or next((t.all_samples for t in b.values()), 0)
        row: dict[str, Any] = dict.fromkeys(COMPARE_COLUMNS)
        row.update(task=task, samples_a=ta.samples, samples_b=tb.samples)
        row["cycles_a"], row["cycles_b"] = ta.cycles, tb.cycles
        if ta.cycles is not None and tb.cycles is not None:
            row["cycles_delta"] = tb.cycles - ta.cycles
            row["cycles_relative_delta"] = (tb.cycles - ta.cycles) / ta.cycles if ta.cycles else None
        share_a = ta.samples / n_a if n_a else None
        share_b = tb.samples / n_b if n_b else None
        row["share_a"], row["share_b"] = share_a, share_b
        if share_a is not None and share_b is not None:
            row["share_delta"] = share_b - share_a
        if task != ALL and n_a and n_b:
            z, p = two_proportion_z(tb.samples, n_b, ta.samples, n_a)
            row["z"], row["p_value"] = z, p
            row["significant"] = p < level
        rows.append(row)
    return rows


def format_compare_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    return capture.format_result_csv(rows, COMPARE_COLUMNS)


def format_compare_table(rows: Sequence[Mapping[str, Any]], name_a: str, name_b: str) -> str:
    """A plain-text table for the terminal (the CSV has full precision)."""
    header = (
        "task",
        f"cycles {name_a}",
        f"cycles {name_b}",
        "Δ cycles",
        "Δ %",
        f"share {name_a}",
        f"share {name_b}",
        "p",
        "",
    )
    lines = [header]
    for row in rows:
        rel = row.get("cycles_relative_delta")
        lines.append(
            (
                str(row["task"]),
                _human(row.get("cycles_a")),
                _human(row.get("cycles_b")),
                _human(row.get("cycles_delta")),
                "" if rel is None else f"{rel * 100:+.1f}%",
                _pct(row.get("share_a")),
                _pct(row.get("share_b")),
                "" if row.get("p_value") is None else f"{row['p_value']:.3g}",
                "*" if row.get("significant") else "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines) + "\n"


def _pct(value: Any) -> str:
    return "" if value is None else f"{value * 100:.2f}%"


def _human(value: Any) -> str:
    if value is None:
        return ""
    magnitude = abs(value)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}" if not float(value).is_integer() else str(int(value))
