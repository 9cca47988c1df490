"""Run directories and bare captures read into typed inputs for the analysis, restricted to a sub-window
when asked; the application profile each run is matched with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict

from coordinator.analysis import timeline
from coordinator.analysis.decide import interval_samples
from coordinator.analysis.timeline import IntervalSpan, SubWindow
from profiler.capture import format as capture
from profiler.capture.checks import contained
from profiler.capture.format import EventCount, NetStats, PidCounters, ProcessInfo
from profiler.capture.offcpu import OffCpuEntry
from profiler.capture.read import (
    is_capture_dir,
    pid_stacks_file,
    pid_timeline_file,
    read_capture,
    read_counters_timeline,
    read_events,
    read_meta,
    read_pid_offcpu,
    read_pid_offcpu_timeline,
    read_stack_counts,
)
from profiler.errors import CaptureFormatError, ConfigError
from profiler.files.textinput import read_text_input
from profiler.matching.appprofile import MAX_PROFILE_BYTES

# ---------------------------------------------------------------- typed inputs


def run_event_count(counts: Iterable[EventCount | None]) -> EventCount | None:
    """The count of a run: the largest any host reported (with its method and uncertainty). Engine
    metrics (Spark driver, Flink REST) count the whole query, so several hosts report the same
    number; never add them."""
    known = [c for c in counts if c is not None and c.count is not None]
    return max(known, key=lambda c: c.count or 0) if known else None


def run_events(counts: Iterable[EventCount | None]) -> int | None:
    """Events of a run (``run_event_count``'s count)."""
    found = run_event_count(counts)
    return found.count if found is not None else None


@dataclass(frozen=True)
class PidInput:
    """One process of one host capture; ``stacks`` is None for managing PIDs or missing files."""

    key: int  # position in the analysis, the join key inside the Spark job
    run: str
    host: str
    process: ProcessInfo
    stacks: Path | None  # stacks.tpc (format 4), else stacks.folded, or timeline.folded when ``intervals`` is set
    counters: PidCounters | None
    net: NetStats | None
    intervals: tuple[int, int] | None = None  # sub-window: read only these intervals (inclusive)
    counters_source: str | None = None  # sub-window: how the counters were restricted (timeline.COUNTERS_*)
    offcpu: tuple[OffCpuEntry, ...] | None = None  # --off-cpu's blocked time (whole window only); None: not measured


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
    def event_count(self) -> EventCount | None:
        return run_event_count(h.events for h in self.hosts)

    @property
    def pids(self) -> tuple[PidInput, ...]:
        return tuple(p for h in self.hosts for p in h.pids)


def sampled_pids(run: RunInput) -> Iterator[tuple[Path, PidInput]]:
    """(capture directory, PID) of every sampled PID of the run whose host has a capture."""
    for host in run.hosts:
        if host.capture_dir is None:
            continue
        for pid in host.pids:
            if pid.stacks is not None:
                yield host.capture_dir, pid


class CostFields(TypedDict):
    cycles: float | None
    cpu_seconds: float | None
    cycles_estimated: bool | None


def cost_fields(counters: PidCounters | None) -> CostFields:
    """What turns a PID's samples into cycles and CPU seconds (None where not measured)."""
    if counters is None:
        return CostFields(cycles=None, cpu_seconds=None, cycles_estimated=None)
    return CostFields(
        cycles=counters.cycles, cpu_seconds=counters.cpu_seconds, cycles_estimated=counters.cycles_estimated
    )


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
    info = read_capture(capture_dir)
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
        stacks = pid_stacks_file(capture_dir, process.pid)
        pid = PidInput(
            key=first_key + offset,
            run=run,
            host=host,
            process=process,
            stacks=stacks if process.sampled else None,
            counters=info.counters.get(process.pid),
            net=info.net.get(process.pid),
            offcpu=_offcpu_of(capture_dir, process),
        )
        if span is not None:
            pid = _restrict_pid(pid, capture_dir, span)
        pids.append(pid)
    return tuple(pids), span


def _offcpu_of(capture_dir: Path, process: ProcessInfo) -> tuple[OffCpuEntry, ...] | None:
    if not process.sampled:
        return None
    entries = read_pid_offcpu(capture_dir, process.pid)
    return tuple(entries) if entries is not None else None


def _restrict_pid(pid: PidInput, capture_dir: Path, span: IntervalSpan) -> PidInput:
    """A PID restricted to the span: stacks from timeline.folded, counters from counters_timeline.json.
    Without a counters timeline the counters stay the window totals, marked COUNTERS_SCALED (see
    _apply_sample_fractions); off-CPU time from offcpu_timeline.folded; network bytes have no timeline and
    become "not measured"."""
    if span.whole:  # the same numbers as no sub-window at all: counters.json is exact
        return replace(pid, counters_source=timeline.COUNTERS_WHOLE if pid.counters is not None else None)
    stacks = None
    if pid.stacks is not None:
        stacks = pid_timeline_file(capture_dir, pid.process.pid)
        if stacks is None:
            missing = capture.timeline_path(capture_dir, pid.process.pid)
            raise ConfigError(f"{missing}: missing beside {pid.stacks.name}; re-run the capture or drop --from/--to")
    deltas = read_counters_timeline(capture_dir, pid.process.pid)
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
        pid, stacks=stacks, intervals=(span.first, span.last), counters=counters, net=None, counters_source=source,
        offcpu=_offcpu_in(pid, capture_dir, span),
    )


def _offcpu_in(pid: PidInput, capture_dir: Path, span: IntervalSpan) -> tuple[OffCpuEntry, ...] | None:
    """The PID's blocked time in the span from offcpu_timeline.folded; None (not measured) without one
    (no --off-cpu, or a capture older than format 5)."""
    if pid.offcpu is None:
        return None
    by_interval = read_pid_offcpu_timeline(capture_dir, pid.process.pid)
    return timeline.window_offcpu(by_interval, span) if by_interval is not None else None


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
                per_interval = interval_samples(pid.stacks)
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
    """The stacks of one PID: its whole stacks.tpc or stacks.folded, or the intervals ``first..last`` of
    its stacks.tpc or timeline.folded merged, as folded text: for what needs the stacks themselves (flame
    graphs, exports, compare, draft-profile). The engines sum tasks without the text (decide.TaskDecider)."""
    return read_stack_counts(path, intervals)


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
                if state == "failed" or not is_capture_dir(capture_dir):
                    why = reason or ("no capture in " + str(capture_dir) if state != "failed" else "")
                    hosts.append(HostInput(host, "failed", why, None, None))
                    continue
                pids, span = _capture_pids(run_id, host, capture_dir, next_key, window)
                next_key += len(pids)
                events = read_events(capture_dir) if span is None or span.whole else None
                hosts.append(HostInput(host, state, reason, capture_dir, events, pids, span))
                copies.append(capture_dir / capture.PROFILE_COPY)
        elif is_capture_dir(path):
            meta = read_meta(path)
            run_id, run_labels = path.resolve().name, {}
            pids, span = _capture_pids(run_id, meta.host, path, next_key, window)
            next_key += len(pids)
            state = "ok" if meta.stopped_by not in ("error", "recovered") else "partial"
            events = read_events(path) if span is None or span.whole else None
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
        fix = "check the path"
        return read_text_input(profile, "the application profile", fix, max_bytes=MAX_PROFILE_BYTES), str(profile)
    texts: dict[str, Path] = {}
    for run in runs:
        if not run.profile_copies:
            raise ConfigError(f"{run.directory}: no application_profile.txt copy in the run; pass --profile FILE")
        copy = contained(run.directory, run.profile_copies[0])
        text = read_text_input(
            copy, "the profile copy", "pass --profile FILE", max_bytes=MAX_PROFILE_BYTES, error=CaptureFormatError
        )
        texts.setdefault(text, copy)
    if len(texts) > 1:
        names = ", ".join(str(p) for p in texts.values())
        raise ConfigError(f"{names}: the runs were profiled with different application profiles; pass --profile FILE")
    ((text, source),) = texts.items()
    return text, str(source)
