"""The on-disk capture format: the one contract between the host agent and the coordinator.

docs/capture-format.md describes the same layout for people; this module is its typed reading
and writing. Everything here is plain JSON/CSV/text so a capture can be re-analysed offline.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import CaptureFormatError
from ..files.atomic import atomic_write_text
from ..files.textinput import TEXT_ENCODING, open_text
from .checks import not_a_link, open_regular, present, row_interval_error
from .folded import MAX_COUNT, is_count, iter_folded, parse_line, read_folded
from .offcpu import (
    CAUSES,
    OFFCPU_CONTEXTS_FILE,
    OFFCPU_FILE,
    OFFCPU_THREADS_FILE,
    OffCpuEntry,
    folded_lines,
    format_offcpu_contexts,
    format_offcpu_lines,
    format_offcpu_threads,
    merge_entries,
    parse_offcpu_lines,
    read_offcpu_lines,
    with_threads,
)
from .stacktable import STACK_TABLE_FILE, StackTable, read_table

FORMAT_VERSION = 5
# v1: no timeline, no perf-map refresh; v2: no full thread names, no contexts.json; v1-v3: folded stacks
# (stacks.folded, timeline.folded, contexts.json) instead of the stack table (stacks.tpc); the rest reads the same
READABLE_VERSIONS = (1, 2, 3, 4, 5)

META_FILE = "meta.json"
SCOPE_FILE = "scope.json"
PROFILE_COPY = "application_profile.txt"
OVERHEAD_FILE = "overhead.json"
PIDS_DIR = "pids"
STACKS_FILE = "stacks.folded"
COUNTERS_FILE = "counters.json"
SAMPLER_FILE = "sampler.json"
NET_FILE = "net.json"
EVENTS_FILE = "events.json"
FLINK_FILE = "flink.json"
TIMELINE_FILE = "timeline.folded"
COUNTERS_TIMELINE_FILE = "counters_timeline.json"
CONTEXTS_FILE = "contexts.json"
SPARK_FILE = "spark.json"
DEFAULT_INTERVAL = 10.0

# Blocked seconds per task (profiler run --off-cpu): in all, then per cause (profiler/capture/offcpu.py).
# Wall seconds per task (async-profiler's wall-clock view: every thread's time whatever its state), with
# --off-cpu: its threads' on-CPU seconds plus their off-CPU seconds (blocked, and runnable but waiting for a CPU).
OFFCPU_COLUMNS: tuple[str, ...] = (
    "offcpu_seconds", *(f"offcpu_{cause}_seconds" for cause in CAUSES), "wall_seconds",
)

# Columns of <host>_result.csv, in order. Rows with task "*" carry the PID's totals.
RESULT_COLUMNS: tuple[str, ...] = (
    "host",
    "pid",
    "role",
    "engine",
    "task",
    "samples",
    "share",
    "share_ci95",
    "cycles",
    "cycles_estimated",
    "cpu_seconds",
    "instructions",
    "ipc",
    "bytes_sent",
    "bytes_received",
    "bytes_sent_external",
    "bytes_received_external",
    *OFFCPU_COLUMNS,
)
ALL_TASKS = "*"
UNMATCHED = "unmatched"


def result_file_name(host: str) -> str:
    return f"{host}_result.csv"


def unmatched_file_name(host: str) -> str:
    return f"{host}_unmatched.folded"


@dataclass(frozen=True)
class ProcessInfo:
    """One process of the scope: what the scope analyzer found and how long it was observed."""

    pid: int
    role: str  # "workload" or "managing"
    engine: str  # "spark", "flink", ... or "manual" for --pid
    kind: str  # the known_spes.txt entry that matched, e.g. "executor"
    user: str
    cmdline: str  # summary, at most a few hundred characters
    first_seen: float  # unix time the process entered the scope
    last_seen: float  # unix time of the last observation (exit or end of the window)
    exited: bool = False
    source: str = "scan"  # "scan", "exec" (found by the exec watcher), "manual"
    jvm_version: str | None = None
    preserve_frame_pointer: bool | None = None  # None: not a JVM or unknown

    @property
    def sampled(self) -> bool:
        return self.role == "workload"


@dataclass(frozen=True)
class CounterValue:
    """One perf event of one PID over the window; ``value`` is None when unsupported."""

    value: float | None
    supported: bool
    enabled_ns: int = 0
    running_ns: int = 0
    note: str = ""  # why unsupported, or "scaled" when multiplexed

    @property
    def scaled(self) -> bool:
        return self.supported and 0 < self.running_ns < self.enabled_ns


@dataclass(frozen=True)
class PidCounters:
    """Counters of one PID. ``cycles`` is measured or estimated; ``cycles_estimated`` says which."""

    pid: int
    events: Mapping[str, CounterValue]
    cycles: float | None
    cycles_estimated: bool
    nominal_hz: float | None = None
    cpu_seconds: float | None = None  # task-clock over the window

    def get(self, event: str) -> float | None:
        counter = self.events.get(event)
        return counter.value if counter is not None and counter.supported else None


@dataclass(frozen=True)
class SamplerStats:
    """What the stack sampler saw for one PID, including everything it could not store."""

    pid: int
    samples: int = 0  # samples taken (stored or not)
    lost_user_stack: int = 0  # stack id < 0 for the user stack (map full, collision, fault)
    lost_kernel_stack: int = 0
    truncated: int = 0  # stacks that hit the depth limit
    java_unwalkable: int = 0  # samples whose Java part could not be walked (no frame pointers)
    max_stack_depth: int = 127
    dropped: int = 0  # samples not counted at all: ring buffer (or counts map) full; in `samples` only
    interpreted_only: int = 0  # samples whose Java frames are all the one symbol "Interpreter"
    java_frames: int = 0  # Java (JIT-memory) frames seen, weighted by samples
    java_frames_unresolved: int = 0  # of those, frames no perf map named ([unknown])
    perf_map_snapshots: int = 0  # perf-map versions used to symbolize this PID
    # Our walker (stack_walk "bpf"): interpreted frames and how many got their Method* named, weighted by samples;
    # frames left unnamed and samples whose stack was cut (never reached a thread's start), each by cause.
    interpreted_frames: int = 0
    interpreted_named: int = 0
    interpreted_unnamed: dict[str, int] = field(default_factory=dict)
    stacks_cut: dict[str, int] = field(default_factory=dict)
    thread_names_kernel: int = 0  # (v3) samples whose thread is named by the kernel's 15 bytes only
    # The HotSpot unwinder (issue 30): compiled frames the walker stored with their nmethod's compile id,
    # how many the JVM's own metadata named, how many the perf map named instead, the rest by cause; and
    # the walker's steps through the JVM's code cache (compiled, interpreted, no_blob, bad_return).
    compiled_frames: int = 0
    compiled_named: int = 0
    compiled_perf_map: int = 0
    compiled_unnamed: dict[str, int] = field(default_factory=dict)
    hotspot_steps: dict[str, int] = field(default_factory=dict)

    def stack_health(self) -> str | None:
        """One line: samples cut before the thread's start and interpreted frames unnamed, each by cause
        (None when there is nothing to say: no samples, nothing cut, nothing unnamed)."""
        parts = []
        cut = sum(self.stacks_cut.values())
        if self.samples and cut:
            causes = ", ".join(
                f"{cause} {100 * n / self.samples:.1f} %" for cause, n in sorted(self.stacks_cut.items(), key=_by_count)
            )
            parts.append(f"{100 * cut / self.samples:.1f} % of samples cut ({causes})")
        for kind, frames, unnamed_by_cause in (
            ("compiled", self.compiled_frames, self.compiled_unnamed),
            ("interpreted", self.interpreted_frames, self.interpreted_unnamed),
        ):
            unnamed = sum(unnamed_by_cause.values())
            if frames and unnamed:
                causes = ", ".join(f"{cause}: {n}" for cause, n in sorted(unnamed_by_cause.items(), key=_by_count))
                parts.append(f"{100 * unnamed / frames:.1f} % of {frames} {kind} frames unnamed ({causes})")
        return "; ".join(parts) or None


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


@dataclass(frozen=True)
class NetStats:
    """Bytes and calls of one PID, split by peer class."""

    pid: int
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_sent_external: int = 0
    bytes_received_external: int = 0
    calls_sent: int = 0
    calls_received: int = 0


@dataclass(frozen=True)
class EventCount:
    """Events the engine processed during the window (events.json of a host capture).

    ``count`` is None when no source could tell; ``source`` says where the number came from
    (e.g. "--events", "spark-rest:http://127.0.0.1:4040", "flink-rest:..."), ``detail`` how,
    ``method`` the estimation in a few words, and ``uncertainty`` the count's likely error (± events,
    about one standard error; None when unknown).
    """

    count: int | None
    source: str
    detail: str = ""
    window_start: float | None = None
    window_end: float | None = None
    method: str = ""
    uncertainty: float | None = None
    # Events read from Kafka (None: not from Kafka, or unknown): the records produced into the topic over
    # a span of the window, and the records the engine says it read over the same span (its own count,
    # which may place the ends of the window apart from ``count``'s); the span and how, in produced_detail.
    produced: int | None = None
    produced_read: int | None = None
    produced_detail: str = ""


@dataclass(frozen=True)
class VertexWindow:
    """One job vertex over the window, from Flink's own metrics (flink.json of a host capture)."""

    job: str
    job_name: str
    vertex: str
    name: str  # the chain's name, as in its task threads: "Source: GenSource -> ToKeyed"
    parallelism: int
    source: bool
    records_in: float | None = None  # numRecordsIn of the task (summed over subtasks) in the window
    records_in_uncertainty: float | None = None
    records_out: float | None = None  # numRecordsOut of the task
    records_out_uncertainty: float | None = None
    source_records: float | None = None  # source vertices: what the source operators emitted
    source_records_uncertainty: float | None = None
    busy_ms_per_s: float | None = None  # mean over subtasks and over the window
    backpressured_ms_per_s: float | None = None
    idle_ms_per_s: float | None = None


@dataclass(frozen=True)
class FlinkSubtask:
    """Where one subtask of a job vertex ran (flink.json v2, from the JobManager's REST API)."""

    job: str
    vertex: str
    name: str  # the vertex's chain, as in its task threads
    subtask: int  # from 1, as in the thread name "<chain> (<subtask>/<parallelism>)#<attempt>"
    attempt: int
    taskmanager: str  # the TaskManager's id ("127.0.0.1:40935-75c27a")
    endpoint: str = ""  # "host:data port"


@dataclass(frozen=True)
class FlinkTaskManager:
    """A TaskManager of the cluster (flink.json v2) and, when it runs on this host, its PID."""

    id: str
    data_port: int | None
    rpc_port: int | None  # of its RPC address ("pekko.tcp://flink@127.0.0.1:40935/...")
    host: str  # the RPC address's host
    pid: int | None = None  # the sampled process listening on the data and RPC ports, on this host


FLINK_FORMAT_VERSION = 2  # v2 adds subtasks and taskmanagers beside the vertices


@dataclass(frozen=True)
class RunMeta:
    """meta.json of a host capture."""

    host: str  # the label the capture is keyed by (cluster.txt entry, or the hostname)
    hostname: str
    kernel: str
    profiler_version: str
    frequency: int
    duration_requested: float
    start_time: float
    end_time: float
    stopped_by: str  # "duration", "signal", "error"
    cycles_source: str  # "hardware" or "estimated"
    exec_watch: str  # "tracepoint" or "polling"
    net: str | None = None  # "tracepoint", "kprobe" or None when off
    max_stack_depth: int = 127
    stack_storage_size: int = 16384
    profile_name: str = ""
    warnings: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION
    stack_collection: str = "stackmap"  # "ringbuf" (every sample to user space) or "stackmap" (v1 way)
    stack_walk: str = "kernel"  # "bpf" (our walker, profiler/sampling/stack_walk.c) or "kernel" (bpf_get_stack)
    interval: float = DEFAULT_INTERVAL  # seconds per timeline slice
    intervals: int = 0  # timeline slices of the window (0: no timeline, e.g. v1)
    perf_map_refresh: float = 0.0  # seconds between Java perf-map refreshes; 0 = at the end only
    thread_names: str = "comm"  # (v3) "uprobe" (renames watched), "jcmd" (names at start only), "comm"
    # --off-cpu's minimum blocked time (pids/<pid>/offcpu.folded); None: the run had no --off-cpu
    off_cpu_min_block_ms: float | None = None
    off_cpu_sample_every: int | None = None  # beyond 100/s per thread one switch-out in N, counted N times

    @property
    def duration(self) -> float:
        return self.end_time - self.start_time


@dataclass(frozen=True)
class Overhead:
    """The profiler's own cost during the window."""

    profiler_cpu_seconds: float = 0.0
    bpf_run_time_ns: int | None = None  # None when kernel.bpf_stats_enabled could not be used
    bpf_run_count: int | None = None
    # the seconds of the window the statistics were on (1 s in 10: profiler/bpf/stats.py); bpf_run_* are the
    # slices' counts scaled to the window. None: on all window (captures made before the slices)
    bpf_stats_seconds: float | None = None
    post_run_seconds: float = 0.0  # wall time from the window's end to overhead.json
    post_run_cpu_seconds: float | None = None  # the process's CPU over the same span (None: older captures)
    peak_rss_bytes: int = 0
    rss_baseline_bytes: int | None = None  # RSS when the window started (BPF compiled, LLVM heap returned)
    timeline: tuple[OverheadPoint, ...] = ()
    checkpoints: int = 0  # checkpoint-journal records written during the window (--checkpoint)
    checkpoint_cpu_seconds: float = 0.0  # the profiler CPU they took (in profiler_cpu_seconds too)
    checkpoint_seconds: float = 0.0  # their wall time, fsync included
    checkpoint_bytes: int = 0  # journal bytes written
    name_batches: int = 0  # batches that named native frames during the window (profiler/symbols/batches.py)
    name_batch_stacks: int = 0  # distinct stacks they named
    name_batch_cpu_seconds: float = 0.0  # the profiler CPU they took (in profiler_cpu_seconds too)


@dataclass(frozen=True)
class OverheadPoint:
    """The profiler's own footprint at one moment of the window."""

    t: float  # seconds into the window
    rss_bytes: int
    cpu_seconds: float  # cumulative profiler CPU since the window started


@dataclass(frozen=True)
class CounterDelta:
    """Counter increments of one PID over one timeline interval (None: not measured)."""

    interval: int
    cycles: float | None
    instructions: float | None
    cpu_seconds: float | None


# ---------------------------------------------------------------- writing


def _json_dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def pid_dir(capture_dir: Path, pid: int) -> Path:
    return capture_dir / PIDS_DIR / str(pid)


# A host label, as a directory name of a run and a file name prefix: one path level, no control characters.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,254}")


def is_safe_name(text: object) -> bool:
    return isinstance(text, str) and _SAFE_NAME.fullmatch(text) is not None and ".." not in text


def contained(root: Path, path: Path) -> Path:
    """``path`` when it resolves inside ``root`` (a capture or run directory). A capture never holds
    links, so one that leads out (to /etc/shadow, another run) is refused before it is read."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise CaptureFormatError(
            f"{path}: a link out of {root}; a capture holds its own files only, copy the file in instead"
        )
    return path


def write_meta(capture_dir: Path, meta: RunMeta) -> None:
    atomic_write_text(capture_dir / META_FILE, _json_dump(asdict(meta)))


def write_scope(capture_dir: Path, processes: Iterable[ProcessInfo]) -> None:
    rows = [asdict(p) for p in sorted(processes, key=lambda p: p.pid)]
    atomic_write_text(capture_dir / SCOPE_FILE, _json_dump(rows))


def write_counters(capture_dir: Path, counters: PidCounters) -> None:
    payload = asdict(counters)
    payload["events"] = {name: asdict(value) for name, value in counters.events.items()}
    atomic_write_text(pid_dir(capture_dir, counters.pid) / COUNTERS_FILE, _json_dump(payload))


def write_sampler_stats(capture_dir: Path, stats: SamplerStats) -> None:
    atomic_write_text(pid_dir(capture_dir, stats.pid) / SAMPLER_FILE, _json_dump(asdict(stats)))


def write_net(capture_dir: Path, stats: NetStats) -> None:
    atomic_write_text(pid_dir(capture_dir, stats.pid) / NET_FILE, _json_dump(asdict(stats)))


def write_events(capture_dir: Path, events: EventCount) -> None:
    atomic_write_text(capture_dir / EVENTS_FILE, _json_dump(asdict(events)))


def write_spark_plans(capture_dir: Path, payload: Mapping[str, Any]) -> None:
    atomic_write_text(capture_dir / SPARK_FILE, _json_dump(payload))


def read_spark_plans(capture_dir: Path) -> dict[str, Any] | None:
    """spark.json (v3): the Spark drivers' stages, jobs and codegen operators; None when absent.
    Only its shape is checked here; profiler/engines/sparkplan.py's readers skip entries they cannot use."""
    path = capture_dir / SPARK_FILE
    if not os.path.lexists(path):
        return None
    payload = _versioned(_load_json(capture_dir, path), path, SPARK_READABLE_VERSIONS)
    expect_json(payload.get("plans", []), list, path, "plans")
    return dict(payload)
def write_flink_vertices(
    capture_dir: Path,
    vertices: Iterable[VertexWindow],
    subtasks: Iterable[FlinkSubtask] = (),
    taskmanagers: Iterable[FlinkTaskManager] = (),
) -> None:
    payload = {
        "format_version": FLINK_FORMAT_VERSION,
        "vertices": [asdict(v) for v in vertices],
        "subtasks": [asdict(s) for s in subtasks],
        "taskmanagers": [asdict(t) for t in taskmanagers],
    }
    atomic_write_text(capture_dir / FLINK_FILE, _json_dump(payload))


def write_overhead(capture_dir: Path, overhead: Overhead) -> None:
    atomic_write_text(capture_dir / OVERHEAD_FILE, _json_dump(asdict(overhead)))


def timeline_path(capture_dir: Path, pid: int) -> Path:
    return _pid_file(capture_dir, pid, TIMELINE_FILE)


def format_timeline(counts: Mapping[tuple[int, str], int]) -> str:
    """``<interval> <stack> <count>`` lines, by interval, then most samples first."""
    ordered = sorted(counts.items(), key=lambda item: (item[0][0], -item[1], item[0][1]))
    return "".join(f"{interval} {stack} {count}\n" for (interval, stack), count in ordered if count > 0)


def format_contexts(folded_text: str, contexts: Mapping[tuple[str, str], int]) -> str:
    """contexts.json: each (context, stack) count, the stack given by its line (1-based) in ``folded_text``
    (the stacks.folded written beside it), each context once: a stack is not repeated per task."""
    lines = {stack: number for number, (stack, _count) in enumerate(iter_folded(folded_text.splitlines()), 1)}
    names = sorted({context for context, _stack in contexts})
    ids = {name: index for index, name in enumerate(names)}
    rows = sorted(
        [ids[context], lines[stack], count] for (context, stack), count in contexts.items() if count > 0
    )
    return json.dumps({"stacks": STACKS_FILE, "contexts": names, "rows": rows}, separators=(",", ":")) + "\n"


def write_counters_timeline(capture_dir: Path, pid: int, interval: float, rows: Iterable[CounterDelta]) -> None:
    payload = {"interval": interval, "rows": [asdict(row) for row in rows]}
    atomic_write_text(pid_dir(capture_dir, pid) / COUNTERS_TIMELINE_FILE, _json_dump(payload))


def format_result_csv(rows: Iterable[Mapping[str, Any]], columns: tuple[str, ...] = RESULT_COLUMNS) -> str:
    """CSV text with a fixed column order; None becomes an empty cell, floats keep 6 significant digits."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(column)) for column in columns])
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}"
    return str(value)


# ---------------------------------------------------------------- reading


def read_json_file(path: Path, if_missing: str, if_invalid: str, follow: bool = True) -> Any:
    """The JSON of one file of a capture, run or report. A missing or unparsable file, or one that is not
    a regular file (a directory, a FIFO; with ``follow`` False a link), is a CaptureFormatError naming the
    file (and line) followed by the caller's advice."""
    if not os.path.lexists(path):
        raise CaptureFormatError(f"{path}: missing; {if_missing}")
    try:
        with open_regular(path, follow=follow, advice=if_invalid) as handle:
            return json.loads(handle.read().decode(TEXT_ENCODING))  # a BOM is not part of the JSON
    except json.JSONDecodeError as exc:
        raise CaptureFormatError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); {if_invalid}") from None
    except UnicodeDecodeError as exc:
        raise CaptureFormatError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}); {if_invalid}") from None
    except OSError as exc:
        raise CaptureFormatError(f"{path}: cannot read ({exc.strerror or exc}); {if_missing}") from None


def _load_json(capture_dir: Path, path: Path) -> Any:
    return read_json_file(
        contained(capture_dir, path),
        "is this a capture directory written by `profiler run`?",
        "re-run the capture",
        follow=False,
    )


_JSON_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "true/false"),
    (int, "a number"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)
# Field annotations (strings: `from __future__ import annotations`) checked against JSON values;
# containers (tuple[...], Mapping[...]) are converted and checked by the reader that builds them.
_SIMPLE_TYPES: Mapping[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "None": (type(None),),
}


def json_kind(value: Any) -> str:
    return next((name for kind, name in _JSON_KINDS if isinstance(value, kind)), "null")


def expect_json(value: Any, kind: type, path: Path, what: str, advice: str = "re-run the capture") -> Any:
    """``value`` when it is of JSON ``kind`` (dict or list), else a CaptureFormatError naming ``path``."""
    if not isinstance(value, kind):
        wanted = dict((k, n) for k, n in _JSON_KINDS)[kind]
        raise CaptureFormatError(f"{path}: {what} is {json_kind(value)}, expected {wanted}; {advice}")
    return value


def _type_problem(cls: type, payload: Mapping[str, Any]) -> str | None:
    for item in fields(cls):
        names = [part.strip() for part in str(item.type).split("|")]
        if item.name not in payload or not all(name in _SIMPLE_TYPES for name in names):
            continue
        value = payload[item.name]
        allowed = tuple(kind for name in names for kind in _SIMPLE_TYPES[name])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            return f"{item.name} is {json_kind(value)}, expected {' or '.join(names)}"
    return None


def from_json_object(
    cls: type, payload: Any, path: Path, advice: str = "the capture was written by an incompatible version"
) -> Any:
    """A record dataclass from a JSON object: unknown keys ignored, wrong JSON types a CaptureFormatError."""
    payload = expect_json(payload, dict, path, "a record", advice)
    problem = _type_problem(cls, payload)
    if problem is not None:
        raise CaptureFormatError(f"{path}: {problem}; {advice}")
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in payload.items() if k in known})
    except TypeError as exc:
        raise CaptureFormatError(f"{path}: {exc}; {advice}") from None


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


# Unix times a capture can hold: after 1970, before the year 3000 (time.localtime of 1e300 overflows).
LATEST_TIME = 32503680000.0


MAX_FREQUENCY = 10000  # Hz, profiler.argtypes.frequency's bound
MAX_DURATION = 7 * 24 * 3600.0  # seconds, profiler.argtypes.duration's bound


def check_rate(path: Path, frequency: int, duration: float, advice: str) -> None:
    """A sampling frequency and a requested duration that a run can have (every --frequency and
    --duration passes argparse's bounds); else a CaptureFormatError naming ``path``."""
    if not 1 <= frequency <= MAX_FREQUENCY:
        raise CaptureFormatError(f"{path}: frequency {frequency!r} is not 1 to {MAX_FREQUENCY} Hz; {advice}")
    if not (math.isfinite(duration) and 0 <= duration <= MAX_DURATION):
        raise CaptureFormatError(f"{path}: duration {duration!r} is not 0 to {MAX_DURATION:g} seconds; {advice}")


def check_times(
    path: Path, start: float | None, end: float | None, advice: str, what: str = "", early_end: float = 0.0
) -> None:
    """A window's start and end (either may be None): finite, between 1970 and 3000, start <= end (or at
    most ``early_end`` seconds before it: a run stopped before its window opened); else a
    CaptureFormatError naming ``path`` (and ``what``, e.g. the host)."""
    for name, value in (("start_time", start), ("end_time", end)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= LATEST_TIME):
            raise CaptureFormatError(f"{path}: {what}{name} {value!r} is not a possible time; {advice}")
    if start is not None and end is not None and end < start - early_end:
        raise CaptureFormatError(f"{path}: {what}end_time {end!r} is before start_time {start!r}; {advice}")


def read_scope(capture_dir: Path) -> list[ProcessInfo]:
    path = capture_dir / SCOPE_FILE
    rows = expect_json(_load_json(capture_dir, path), list, path, "the file")
    return [from_json_object(ProcessInfo, row, path) for row in rows]


def _pid_file(capture_dir: Path, pid: int, name: str) -> Path:
    directory = pid_dir(capture_dir, pid)
    not_a_link(directory.parent)
    return contained(capture_dir, not_a_link(directory) / name)


def read_counters(capture_dir: Path, pid: int) -> PidCounters | None:
    path = _pid_file(capture_dir, pid, COUNTERS_FILE)
    if not os.path.lexists(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    events = expect_json(payload.get("events"), dict, path, "events")
    payload["events"] = {name: from_json_object(CounterValue, value, path) for name, value in events.items()}
    counters: PidCounters = from_json_object(PidCounters, payload, path)
    return counters


def read_sampler_stats(capture_dir: Path, pid: int) -> SamplerStats | None:
    path = _pid_file(capture_dir, pid, SAMPLER_FILE)
    return from_json_object(SamplerStats, _load_json(capture_dir, path), path) if os.path.lexists(path) else None


def read_net(capture_dir: Path, pid: int) -> NetStats | None:
    path = _pid_file(capture_dir, pid, NET_FILE)
    return from_json_object(NetStats, _load_json(capture_dir, path), path) if os.path.lexists(path) else None


def write_offcpu(capture_dir: Path, pid: int, entries: Iterable[OffCpuEntry]) -> None:
    """offcpu.folded, and beside it offcpu_threads.json when the entries know their threads."""
    lines = folded_lines(entries)  # merged once for both files
    atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_FILE, format_offcpu_lines(lines))
    threads = format_offcpu_threads(lines)
    if threads is not None:
        atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_THREADS_FILE, threads)


def read_pid_offcpu(capture_dir: Path, pid: int) -> list[OffCpuEntry] | None:
    """``pid``'s off-CPU entries, with their threads where offcpu_threads.json gives them; None when the run
    had no --off-cpu (or an older profiler wrote it)."""
    path = _pid_file(capture_dir, pid, OFFCPU_FILE)
    if not present(path):
        return None
    lines = read_offcpu_lines(path)
    threads_path = _pid_file(capture_dir, pid, OFFCPU_THREADS_FILE)
    if present(threads_path):
        lines = with_threads(lines, _load_json(capture_dir, threads_path), str(threads_path))
    return merge_entries(lines)


OFFCPU_TIMELINE_FILE = "offcpu_timeline.folded"  # v5: blocked time per interval (--off-cpu)
# the threads per line of offcpu_timeline.folded, as offcpu_threads.json's per line of offcpu.folded
OFFCPU_TIMELINE_THREADS_FILE = "offcpu_timeline_threads.json"
MAX_OFFCPU_INTERVAL = 10_000_000


def write_offcpu_timeline(capture_dir: Path, pid: int, by_interval: Mapping[int, Iterable[OffCpuEntry]]) -> None:
    """``interval cause blocked_ns switches stack`` per line: ``offcpu.folded`` split by interval; and the
    part of each line's time whose thread carried a context (a Spark task, a Flink subtask) in
    offcpu_contexts.json (rows may be none: the run measured it, no thread had one)."""
    by_interval = {interval: list(entries) for interval, entries in by_interval.items()}
    lines = [(interval, folded_lines(entries)) for interval, entries in sorted(by_interval.items())]
    text = "".join(format_offcpu_lines(entries, f"{interval} ") for interval, entries in lines)
    atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_TIMELINE_FILE, text)
    threads = format_offcpu_threads([entry for _interval, entries in lines for entry in entries], OFFCPU_TIMELINE_FILE)
    if threads is not None:
        atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_TIMELINE_THREADS_FILE, threads)
    atomic_write_text(
        pid_dir(capture_dir, pid) / OFFCPU_CONTEXTS_FILE, format_offcpu_contexts(by_interval, OFFCPU_TIMELINE_FILE)
    )


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
    path = _pid_file(capture_dir, pid, OFFCPU_TIMELINE_FILE)
    if not present(path):
        return None
    lines = _offcpu_timeline_lines(path)
    threads_path = _pid_file(capture_dir, pid, OFFCPU_TIMELINE_THREADS_FILE)
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
    path = _pid_file(capture_dir, pid, OFFCPU_CONTEXTS_FILE)
    if not present(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    names = expect_json(payload.get("contexts", []), list, path, "contexts")
    rows = expect_json(payload.get("rows", []), list, path, "rows")
    timeline = _pid_file(capture_dir, pid, OFFCPU_TIMELINE_FILE)
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


def read_overhead(capture_dir: Path) -> Overhead | None:
    path = capture_dir / OVERHEAD_FILE
    if not os.path.lexists(path):
        return None
    payload = expect_json(_load_json(capture_dir, path), dict, path, "the file")
    points = expect_json(payload.get("timeline") or [], list, path, "timeline")
    payload["timeline"] = tuple(from_json_object(OverheadPoint, point, path) for point in points)
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
    path = _pid_file(capture_dir, pid, COUNTERS_TIMELINE_FILE)
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


def contexts_path(capture_dir: Path, pid: int) -> Path:
    return _pid_file(capture_dir, pid, CONTEXTS_FILE)


def stacks_path(capture_dir: Path, pid: int) -> Path:
    """A folded capture's (format 1-3) stacks.folded; ``pid_stacks_file`` finds either form."""
    return _pid_file(capture_dir, pid, STACKS_FILE)


def table_path(capture_dir: Path, pid: int) -> Path:
    """The stack table of a format 4 capture (profiler/capture/stacktable.py)."""
    return _pid_file(capture_dir, pid, STACK_TABLE_FILE)


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
