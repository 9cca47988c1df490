"""The report's health panel: hosts, cycles, frame pointers, stacks, matching, overhead and the sampler's
losses, each a line that turns into a warning past its threshold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.analysis.load import RunData
from coordinator.report.model import HealthLine, ProcessLine
from coordinator.rundir import HOST_OK
from profiler.capture.format import APPROXIMATE_WARN, Overhead
from profiler.capture.read import Capture

# Health thresholds: above these a line turns into a warning.
UNMATCHED_WARN = 0.20
LOST_WARN = 0.01
INTERPRETED_WARN = 0.05  # "more than a few percent" of samples only in the interpreter (issue 11)
UNRESOLVED_WARN = 0.05  # Java frames no perf map named
OVERHEAD_WARN = 0.05  # profiler CPU seconds per second of window, i.e. share of one core
CUT_WARN = 0.05  # samples whose user stack does not reach the thread's start (issue 21)
UNNAMED_WARN = 0.05  # interpreted Java frames left unnamed
JIT_WARN = 0.05  # workload samples on HotSpot's compiler threads: the JVMs were still warming up (issue 33)
# HotSpot's compiler threads: "C2 CompilerThread0" with full names, "C2 CompilerThre" with the kernel's 15 bytes.
COMPILER_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")


def is_compiler_thread(name: str) -> bool:
    """A HotSpot JIT compiler thread's name (or a folded stack starting with it), full or cut to 15 bytes;
    also the demo's soak (coordinator/workloads/ysb/jvmstats.py) reads /proc's comm with it."""
    return name.startswith(COMPILER_THREAD_PREFIXES)


def health_lines(
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
        *_frame_pointer_health(processes, captures),
        *_stacks_health(captures),
        *_sampler_health(captures),
        *_walk_health(captures),
        *_inlining_health(captures),
        *_matching_health(unmatched_share, multi_task_share),
        *_overhead_health(captures),
        *_thread_names_health(captures),
        *_flink_placement_health(captures),
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


def warmup_health(
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]], workload: Mapping[str, frozenset[int]]
) -> list[HealthLine]:
    """The share of the workload processes' samples on HotSpot's JIT compiler threads, read from the
    stacks' thread names (whatever the application profile calls its tasks). Above JIT_WARN the JVMs
    were still compiling: the window is not their steady state. ``stacks``: host -> pid -> folded
    stacks, whose first frame is the thread's name; ``workload``: host -> the workload PIDs."""
    jit = total = 0
    for host, pids in stacks.items():
        for pid, folded in pids.items():
            if pid not in workload.get(host, frozenset()):
                continue
            for stack, count in folded.items():
                total += count
                if is_compiler_thread(stack):
                    jit += count
    if not jit:
        return []
    share = jit / total
    text = f"JIT compiler threads took {share:.1%} of the workload processes' samples ({jit:,} of {total:,})"
    if share <= JIT_WARN:
        return [HealthLine("ok", "JIT", text)]
    return [HealthLine(
        "warn", "JIT",
        text + "; the JVMs were still compiling, so this window is not their steady state: profile later in "
        "the executors' life (a demo: a longer --warmup) for steady-state cycles per event (docs/report.md)",
    )]


def _flink_placement_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """Whether Flink's subtasks were mapped to TaskManager ids and those to the sampled PIDs (flink.json v2)."""
    lines = []
    for capture in captures:
        if not capture.flink_vertices:
            continue
        where = f"{capture.meta.host} Flink subtasks"
        if not capture.flink_subtasks:
            lines.append(HealthLine(
                "warn", where,
                "the mapping of subtasks to TaskManager ids is missing (REST API not answering at the end, or a "
                "capture before flink.json v2); vertex and subtask still come from the task threads' names",
            ))
            continue
        local = sum(1 for manager in capture.flink_taskmanagers if manager.pid is not None)
        lines.append(HealthLine(
            "ok", where,
            f"{len(capture.flink_subtasks)} subtasks on {len(capture.flink_taskmanagers)} TaskManagers "
            f"({local} of them sampled on this host, found by their data and RPC ports)",
        ))
    return lines


def _thread_names_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """Where the stacks' thread names came from (captures of format 3; older ones have kernel names)."""
    lines = []
    for capture in captures:
        if capture.meta.format_version < 3:
            continue
        kernel = sum(stats.thread_names_kernel for stats in capture.sampler.values())
        samples = sum(stats.samples for stats in capture.sampler.values())
        share = f"; {kernel / samples:.1%} of samples kept the kernel's 15-character name" if samples else ""
        if capture.meta.thread_names == "uprobe":
            lines.append(HealthLine("ok", f"{capture.meta.host} thread names", f"full Java thread names{share}"))
        else:
            lines.append(HealthLine(
                "warn", f"{capture.meta.host} thread names",
                f"thread names from {capture.meta.thread_names} only (renames not seen){share}; see the warnings",
            ))
    return lines


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


def _frame_pointer_health(processes: Sequence[ProcessLine], captures: Sequence[Capture] = ()) -> list[HealthLine]:
    """JVMs without -XX:+PreserveFramePointer are fine where the HotSpot unwinder stepped their JIT frames
    (sampler.json hotspot_steps); the others' Java stacks break and need the flag."""
    unwound = {
        (capture.meta.host, pid)
        for capture in captures
        for pid, stats in capture.sampler.items()
        if stats.hotspot_steps.get("compiled", 0) > 0
    }
    no_fp_all = [p for p in processes if p.role == "workload" and p.preserve_frame_pointer is False]
    no_fp = [p for p in no_fp_all if (p.host, p.pid) not in unwound]
    unknown_fp = [p for p in processes if p.role == "workload" and p.jvm_version and p.preserve_frame_pointer is None]
    if no_fp_all and not no_fp:
        pids = ", ".join(f"{p.host}:{p.pid}" for p in no_fp_all)
        return [HealthLine(
            "ok", "frame pointers",
            f"JVMs without -XX:+PreserveFramePointer walked by the HotSpot unwinder (vmStructs): {pids}",
        )]
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
        if bpf and overhead.bpf_stats_seconds is not None:  # the statistics were on in slices
            bpf += f" (estimated from {overhead.bpf_stats_seconds:.0f} s of BPF statistics)"
        post_cpu = (
            f" ({overhead.post_run_cpu_seconds:.1f} CPU s)" if overhead.post_run_cpu_seconds is not None else ""
        )
        lines.append(HealthLine(
            "warn" if per_core > OVERHEAD_WARN else "ok",
            "overhead",
            f"{capture.meta.host}: profiler used {overhead.profiler_cpu_seconds:.2f} CPU s "
            f"({per_core:.1%} of one core){bpf}, post-run {overhead.post_run_seconds:.1f} s{post_cpu}, "
            f"peak RSS {overhead.peak_rss_bytes / 2**20:.0f} MiB{_by_component(overhead)}{_start_up(overhead)}",
        ))
    return lines


def _by_component(overhead: Overhead) -> str:
    """'; by component: preparation 2.10, reading 0.40, ...' (largest first), '' for older captures."""
    parts = sorted(overhead.cpu_by_component, key=lambda part: -part.cpu_seconds)
    if not parts:
        return ""
    return "; CPU s by component: " + ", ".join(f"{part.component} {part.cpu_seconds:.2f}" for part in parts)


def _start_up(overhead: Overhead) -> str:
    """'; first sample 1.8 s after the command (1.4 CPU s)', '' when the run did not record it."""
    if overhead.first_sample_at is None:
        return ""
    cpu = overhead.first_sample_cpu_seconds
    return f"; first sample {overhead.first_sample_at:.1f} s after the command" + (
        f" ({cpu:.1f} CPU s)" if cpu is not None else ""
    )


def _walk_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """One line per PID whose stacks were cut before the thread's start or whose interpreted frames stayed
    unnamed, with the causes (SamplerStats.stack_health, the line `profiler match` prints too)."""
    lines = []
    for capture in captures:
        for pid in sorted(capture.sampler):
            stats = capture.sampler[pid]
            text = stats.stack_health()
            if text is None:
                continue
            cut = sum(stats.stacks_cut.values()) / stats.samples if stats.samples else 0.0
            unnamed = (
                sum(stats.interpreted_unnamed.values()) / stats.interpreted_frames if stats.interpreted_frames else 0.0
            )
            level = "warn" if cut > CUT_WARN or unnamed > UNNAMED_WARN else "ok"
            lines.append(HealthLine(level, f"{capture.meta.host} PID {pid} stacks", text))
    return lines


def _inlining_health(captures: Sequence[Capture]) -> list[HealthLine]:
    """One line per JVM with compiled samples named from a borrowed scope (SamplerStats.inlining_health, the
    line `profiler match` prints too): a warning past APPROXIMATE_WARN of its compiled samples."""
    lines = []
    for capture in captures:
        for pid in sorted(capture.sampler):
            stats = capture.sampler[pid]
            text = stats.inlining_health()
            if text is not None:
                level = "warn" if stats.approximate_share() > APPROXIMATE_WARN else "info"
                lines.append(HealthLine(level, f"{capture.meta.host} PID {pid} inlining", text))
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


