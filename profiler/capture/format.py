"""The on-disk capture format: the one contract between the host agent and the coordinator.

docs/capture-format.md describes the same layout for people; this module is its typed records, its file
names and paths, and the host agent's writing of them (read.py reads them back, checked). Everything here
is plain JSON/CSV/text so a capture can be re-analysed offline.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..files.atomic import atomic_write_text
from .checks import contained, not_a_link
from .folded import iter_folded
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
)
from .stacktable import STACK_TABLE_FILE

FORMAT_VERSION = 5

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
OFFCPU_TIMELINE_FILE = "offcpu_timeline.folded"  # v5: blocked time per interval (--off-cpu)
# the threads per line of offcpu_timeline.folded, as offcpu_threads.json's per line of offcpu.folded
OFFCPU_TIMELINE_THREADS_FILE = "offcpu_timeline_threads.json"
MAX_OFFCPU_INTERVAL = 10_000_000
DEFAULT_INTERVAL = 10.0

# Blocked seconds per task (profiler run --off-cpu): in all, then per cause (profiler/capture/offcpu.py).
# Wall seconds per task (async-profiler's wall-clock view: every thread's time whatever its state), with
# --off-cpu: its threads' on-CPU seconds plus their off-CPU seconds (blocked, and runnable but waiting for a CPU).
OFFCPU_COLUMNS: tuple[str, ...] = (
    "offcpu_seconds", *(f"offcpu_{cause}_seconds" for cause in CAUSES), "wall_seconds",
)

# What a task's row measures first, in every table that has task rows (result, summary, campaign).
TASK_MEASURES: tuple[str, ...] = ("samples", "share", "share_ci95", "cycles", "cycles_estimated", "cpu_seconds")

# Columns of <host>_result.csv, in order. Rows with task "*" carry the PID's totals.
RESULT_COLUMNS: tuple[str, ...] = (
    "host",
    "pid",
    "role",
    "engine",
    "task",
    *TASK_MEASURES,
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
    # the JVM of the scope this process works for (a PySpark python worker: its executor), found through
    # its parents; None for a JVM, or when no ancestor within SERVES_HOPS is a JVM of the scope
    serves: int | None = None

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


# A JVM's compiled samples named from a borrowed scope past this share: a warning (run, report, match).
APPROXIMATE_WARN = 0.10


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
    # (issue 51) samples with a compiled frame named from its nmethod, those whose leaf-most compiled frame
    # borrowed a later PcDesc's scope (named with APPROXIMATE_MARK: code without exact debug information), and
    # the bytes from their pcs to the PcDescs they borrowed, summed (a mean distance)
    compiled_samples: int = 0
    compiled_approximate: int = 0
    approximate_bytes: int = 0

    def inlining_health(self) -> str | None:
        """One line: the share of compiled samples named from a borrowed scope, and what to do about it
        (None: no compiled sample, or none approximate)."""
        if not self.compiled_samples or not self.compiled_approximate:
            return None
        mean = self.approximate_bytes / self.compiled_approximate
        return (
            f"{100 * self.compiled_approximate / self.compiled_samples:.0f} % of {self.compiled_samples} compiled "
            "samples in code without exact debug information (the scope of a safepoint or call a mean "
            f"{mean:.0f} bytes further on, frames marked [approx]): methods inlined there may be charged to their "
            "caller; use profiler run --exact-inlining (code compiled from then on) or start the JVM with "
            "-XX:+UnlockDiagnosticVMOptions -XX:+DebugNonSafepoints"
        )

    def approximate_share(self) -> float:
        return self.compiled_approximate / self.compiled_samples if self.compiled_samples else 0.0

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
    # YSB's latency per 10 s window (coordinator demo with the Redis sink; None otherwise), over the windows
    # that closed inside the window: the wall-clock time of a window's last update in Redis minus its end
    # (event time), in ms; how it was read, in latency_detail.
    latency_windows: int | None = None
    latency_median_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_max_ms: float | None = None
    latency_min_ms: float | None = None
    latency_detail: str = ""


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
    # the start-up, in seconds since the command's process began (its exec: /proc/self/stat starttime, 10 ms ticks)
    window_start_at: float | None = None  # the window began: every program loaded, the scope's first listing done
    first_sample_at: float | None = None  # the first sample's kernel time (None: no sample, or the stack map)
    first_sample_cpu_seconds: float | None = None  # the agent's CPU (every thread) when it filed that sample
    # profiler_cpu_seconds by component (its threads' CPU, profiler/run/threadcpu.py); () in older captures
    cpu_by_component: tuple[ComponentCpu, ...] = ()


@dataclass(frozen=True)
class ComponentCpu:
    """The agent's CPU seconds in the window in one component: reading (the ring buffer), preparation (unwind
    tables, vmStructs), naming (symbols, thread names, name batches), scope, checkpoint, engines, off-cpu,
    window (the rest of the runner's thread) and other (threads that ended between readings, unnamed ones)."""

    component: str
    cpu_seconds: float


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


# ---------------------------------------------------------------- paths


def pid_dir(capture_dir: Path, pid: int) -> Path:
    return capture_dir / PIDS_DIR / str(pid)


def pid_file(capture_dir: Path, pid: int, name: str) -> Path:
    directory = pid_dir(capture_dir, pid)
    not_a_link(directory.parent)
    return contained(capture_dir, not_a_link(directory) / name)


def timeline_path(capture_dir: Path, pid: int) -> Path:
    return pid_file(capture_dir, pid, TIMELINE_FILE)


def contexts_path(capture_dir: Path, pid: int) -> Path:
    return pid_file(capture_dir, pid, CONTEXTS_FILE)


def stacks_path(capture_dir: Path, pid: int) -> Path:
    """A folded capture's (format 1-3) stacks.folded; ``pid_stacks_file`` finds either form."""
    return pid_file(capture_dir, pid, STACKS_FILE)


def table_path(capture_dir: Path, pid: int) -> Path:
    """The stack table of a format 4 capture (profiler/capture/stacktable.py)."""
    return pid_file(capture_dir, pid, STACK_TABLE_FILE)


# A host label, as a directory name of a run and a file name prefix: one path level, no control characters.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,254}")


def is_safe_name(text: object) -> bool:
    return isinstance(text, str) and _SAFE_NAME.fullmatch(text) is not None and ".." not in text


# ---------------------------------------------------------------- writing


def _json_dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


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


def write_offcpu(capture_dir: Path, pid: int, entries: Iterable[OffCpuEntry]) -> None:
    """offcpu.folded, and beside it offcpu_threads.json when the entries know their threads."""
    lines = folded_lines(entries)  # merged once for both files
    atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_FILE, format_offcpu_lines(lines))
    threads = format_offcpu_threads(lines)
    if threads is not None:
        atomic_write_text(pid_dir(capture_dir, pid) / OFFCPU_THREADS_FILE, threads)


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
