"""Reading a run directory (or one bare host capture) for the report: outcomes, captures, summary rows,
stacks and time series.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.analysis import timeline
from coordinator.analysis.inputs import read_pid_stacks
from coordinator.analysis.rows import SUMMARY_FILE, existing_summary
from coordinator.rundir import HOST_OK, HostOutcome, RunInfo, host_capture_dir, is_run_dir, read_run
from profiler.capture.checks import contained
from profiler.capture.format import PROFILE_COPY, CounterDelta, result_file_name
from profiler.capture.jsonfile import expect_json, json_kind, read_json_file
from profiler.capture.offcpu import OffCpuEntry, merge_entries
from profiler.capture.read import (
    Capture,
    is_capture_dir,
    pid_stacks_file,
    pid_timeline_file,
    read_capture,
    read_counters_timeline,
    read_pid_offcpu,
    read_pid_offcpu_timeline,
    read_spark_plans,
)
from profiler.errors import CaptureFormatError
from profiler.files.textinput import TEXT_ENCODING, open_text

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
    stage_rows: tuple[Mapping[str, str], ...] = ()  # summary.csv's Spark stage rows (analyze --by stage)
    spark_plans: tuple[Mapping[str, Any], ...] = ()  # the hosts' spark.json (stages, codegen operators)
    vertex_rows: tuple[Mapping[str, str], ...] = ()  # summary.csv's Flink vertex rows (analyze --by vertex)

    @property
    def labels(self) -> Mapping[str, str]:
        return self.info.labels if self.info is not None else {}

    def host_intervals(self, host: str) -> tuple[int, int] | None:
        """The intervals the analysis used for ``host`` (None: the whole window)."""
        for entry in (self.window or {}).get("hosts", ()):
            if entry.get("run") == self.run_id and entry.get("host") == host and not entry.get("whole_window"):
                return int(entry["first_interval"]), int(entry["last_interval"])
        return None


# What the report's tables read from summary.csv and the hosts' <host>_result.csv.
REPORT_COLUMNS = ("host", "pid", "task", "samples", "cycles")


def _read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of summary.csv or a host's result CSV; one without the columns the tables read is a
    CaptureFormatError naming them (never an empty table)."""
    try:
        with open_text(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [name for name in REPORT_COLUMNS if name not in (reader.fieldnames or ())]
            if missing:
                raise CaptureFormatError(
                    f"{path}: no column {', '.join(missing)} (not a summary or result CSV, or cut); "
                    "re-run `coordinator analyze`"
                )
            return [dict(row) for row in reader]
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
    stage_rows = [row for row in rows if row.get("stage")]
    vertex_rows = [row for row in rows if row.get("vertex")]
    rows = [row for row in rows if not row.get("stage") and not row.get("vertex")]
    spark_plans = []
    for host in hosts:
        if host.capture is not None:
            try:
                payload = read_spark_plans(host.capture.directory)
            except CaptureFormatError:
                payload = None  # the report shows what it can; stage names are a bonus
            if payload is not None:
                spark_plans.append(payload)
    profile_text, profile_source, window = read_analysis_record(summary)
    candidates = [path / PROFILE_COPY] + [h.capture.directory / PROFILE_COPY for h in hosts if h.capture]
    for candidate in candidates if profile_text is None else ():
        if contained(path, candidate).is_file():
            profile_text, profile_source = candidate.read_text(encoding=TEXT_ENCODING, errors="replace"), str(candidate)
            break
    return RunData(
        path,
        run_id,
        bare,
        info,
        tuple(hosts),
        tuple(rows),
        source,
        profile_text,
        profile_source,
        window,
        tuple(stage_rows),
        tuple(spark_plans),
        tuple(vertex_rows),
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
        path = (pid_stacks_file if intervals is None else pid_timeline_file)(capture.directory, process.pid)
        if path is None:
            continue
        try:
            stacks[process.pid] = dict(read_pid_stacks(path, intervals))
        except (CaptureFormatError, OSError) as exc:
            if problems is None:
                raise
            problems.append(f"{capture.meta.host} PID {process.pid}: stacks left out: {exc}")
    return stacks


def load_offcpu(
    capture: Capture, problems: list[str], intervals: tuple[int, int] | None = None
) -> dict[int, list[OffCpuEntry]]:
    """Off-CPU entries of every workload PID that has them (a run without --off-cpu: none); an unreadable
    file leaves that PID out and is reported in ``problems``. ``intervals`` (first, last): only the blocked
    time of those intervals (offcpu_timeline.folded; a PID without one is left out: not measured)."""
    entries: dict[int, list[OffCpuEntry]] = {}
    for process in capture.processes:
        if not process.sampled:
            continue
        try:
            if intervals is None:
                found = read_pid_offcpu(capture.directory, process.pid)
            else:
                by_interval = read_pid_offcpu_timeline(capture.directory, process.pid) or {}
                first, last = intervals
                found = merge_entries(e for i, es in by_interval.items() if first <= i <= last for e in es)
        except (CaptureFormatError, OSError) as exc:
            problems.append(f"{capture.meta.host} PID {process.pid}: off-CPU time left out: {exc}")
            continue
        if found:
            entries[process.pid] = found
    return entries


def load_run_stacks(run: RunData, problems: list[str] | None = None) -> dict[str, dict[int, dict[str, int]]]:
    """``load_stacks`` of every host of a run with a capture (host -> pid -> folded stacks), each cut to the
    intervals the analysis used: what the report draws and the exports carry."""
    return {h.name: load_stacks(h.capture, problems, run.host_intervals(h.name)) for h in run.hosts if h.capture}


def load_run_offcpu(run: RunData, problems: list[str]) -> dict[str, dict[int, list[OffCpuEntry]]]:
    """``load_offcpu`` of every host of a run with a capture (host -> pid -> entries), each cut to the
    intervals the analysis used (a run analysed with --from/--to: its sub-window's): what the report draws
    and the exports carry."""
    return {h.name: load_offcpu(h.capture, problems, run.host_intervals(h.name)) for h in run.hosts if h.capture}


@dataclass(frozen=True)
class TimelineInput:
    """What the time chart of one host reads: each workload PID's timeline file (stacks.tpc or
    timeline.folded, read when the chart is built: decide.TaskDecider.interval_tasks) and counters timeline."""

    interval: float
    duration: float
    files: Mapping[int, Path]
    deltas: Mapping[int, Sequence[CounterDelta]] = field(default_factory=dict)
    window_cycles: Mapping[int, float | None] = field(default_factory=dict)  # counters.json, for PIDs without deltas


def load_timeline(capture: Capture, problems: list[str] | None = None) -> TimelineInput | None:
    """The time chart's input of a capture; None when it has no timeline (v1, stack map). An
    unreadable counters timeline is added to ``problems`` (the health panel)."""
    if timeline.timeline_problem(capture.meta) is not None:
        return None
    files: dict[int, Path] = {}
    deltas: dict[int, Sequence[CounterDelta]] = {}
    for process in capture.processes:
        path = pid_timeline_file(capture.directory, process.pid)
        if not process.sampled or path is None:
            continue
        files[process.pid] = path
        try:
            rows = read_counters_timeline(capture.directory, process.pid)
        except CaptureFormatError as exc:
            rows = None  # the chart then shows samples and share only for this host
            if problems is not None:
                problems.append(f"{capture.meta.host} PID {process.pid}: time chart without cycles: {exc}")
        if rows is not None:
            deltas[process.pid] = rows
    window_cycles = {pid: c.cycles for pid, c in capture.counters.items() if pid in files}
    return TimelineInput(capture.meta.interval, capture.meta.duration, files, deltas, window_cycles)


def read_analysis_record(summary: Path | None) -> tuple[str | None, str | None, Mapping[str, Any] | None]:
    """The profile summary.csv was computed with (analysis.json beside it), so that colours and tables
    agree after `coordinator analyze --profile EDITED`, and its sub-window (``--from/--to``);
    (None, None, None) when there is no analysis. A damaged analysis.json is a CaptureFormatError naming
    it: a report must not silently use another profile or the whole window instead of the analysed one."""
    if summary is None:
        return None, None, None
    record = summary.parent / "analysis.json"
    if not record.exists():
        return None, None, None
    advice = f"re-run `coordinator analyze` into {summary.parent}"
    payload = expect_json(read_json_file(record, advice, advice), dict, record, "the file", advice)
    window = payload.get("window")
    if window is not None:
        check_window_record(expect_json(window, dict, record, "window", advice), record, advice)
    text = payload.get("profile_text")
    if text is not None and not isinstance(text, str):
        raise CaptureFormatError(f"{record}: profile_text is {json_kind(text)}, expected a string; {advice}")
    if text is None:
        return None, None, window
    return text, str(payload.get("profile_source") or record), window


# analysis.json's window (rows.window_record): field -> the JSON types it may hold.
_WINDOW_FIELDS: Mapping[str, tuple[type, ...]] = {"from": (int, float, type(None)), "to": (int, float, type(None))}
_WINDOW_HOST_FIELDS: Mapping[str, tuple[type, ...]] = {
    "run": (str,),
    "host": (str,),
    "first_interval": (int,),
    "last_interval": (int,),
    "interval": (int, float),
    "from": (int, float),
    "to": (int, float),
    "whole_window": (bool,),
    "counters": (dict,),
}


def _wrong_field(entry: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]]) -> str | None:
    for name, kinds in fields.items():
        value = entry.get(name)
        if name in entry and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            return f"{name} is {json_kind(value)}"
    return None


def check_window_record(window: Mapping[str, Any], record: Path, advice: str) -> None:
    """analysis.json's window (report, compare): its fields have the types `coordinator analyze` writes (a
    report reads them as numbers)."""
    problem = _wrong_field(window, _WINDOW_FIELDS)
    hosts = window.get("hosts", [])
    if problem is None and not isinstance(hosts, list):
        problem = f"hosts is {json_kind(hosts)}"
    for entry in hosts if problem is None else ():
        if not isinstance(entry, dict):
            problem = f"a host entry is {json_kind(entry)}"
        else:
            problem = _wrong_field(entry, _WINDOW_HOST_FIELDS)
            bounds = {"first_interval", "last_interval"}
            if problem is None and not entry.get("whole_window") and not bounds <= set(entry):
                problem = "a host entry has no first_interval and last_interval"
            if problem is None and not 0 <= entry.get("first_interval", 0) <= entry.get("last_interval", 0):
                problem = "first_interval and last_interval are not 0 <= first <= last"
        if problem is not None:
            break
    if problem is not None:
        raise CaptureFormatError(f"{record}: window: {problem}, not as `coordinator analyze` writes it; {advice}")
