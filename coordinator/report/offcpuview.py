"""The report's off-CPU view (``profiler run --off-cpu``, docs/offcpu.md): blocked seconds per task and
cause beside the on-CPU seconds, from the same result rows as the task table, where each task waited (the
methods that decided its blocked stacks, per cause), and the blocked stacks as flamegraphs per PID and per
task. Pure: rows and entries in, lines and graphs out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from coordinator.analysis.rows import cell_number, pid_rows_by_task, sum_known
from coordinator.report.flame import FlameGraph, FrameTable, StackClassifications, build_flamegraph
from profiler.capture.folded import FRAME_SEPARATOR, KERNEL_SUFFIX
from profiler.capture.format import ALL_TASKS, ProcessInfo
from profiler.capture.offcpu import CAUSES, WHOLE_WINDOW_FRAME, OffCpuEntry
from profiler.matching.matcher import Matcher

OFFCPU_UNIT = "ms blocked"  # the width of an off-CPU flamegraph's frames
SITES_PER_TASK = 4  # the report lists a task's largest wait sites; the flamegraph has the rest
SITE_CHARS = 90  # a wait site's name is the target's text: cut to this length
THREAD_NAME_SITE = "(by thread name)"  # the root frame decided: no method of the task was on the stack
WHOLE_WINDOW_SITE = "(by thread name, blocked all window)"  # the same for a thread read from /proc, not walked
NO_SITE = "(no frame matched)"  # an unmatched stack


@dataclass(frozen=True)
class WaitSite:
    """Where one task waited for one cause: the frame that gave the blocked stacks to the task (the
    method that waited, by the off-CPU rule of docs/offcpu.md), summed over threads and processes."""

    cause: str
    frame: str  # short: a Java method's class and name, a native function without its arguments
    seconds: float


@dataclass(frozen=True)
class OffCpuLine:
    """One task: its on-CPU seconds, its blocked seconds (summed over its threads) and their split."""

    task: str
    color: str
    cpu_seconds: float | None
    offcpu_seconds: float | None
    by_cause: tuple[float | None, ...]  # in the order of OffCpuTable.causes
    threads: float | None = None  # distinct threads blocked in the task (summary.csv's offcpu_threads)
    sites: tuple[WaitSite, ...] = ()  # its largest wait sites (of the drawn entries), largest first


@dataclass(frozen=True)
class OffCpuTable:
    causes: tuple[str, ...]  # the causes any task was blocked by, in profiler.capture.offcpu.CAUSES order
    lines: tuple[OffCpuLine, ...]
    source: str  # where the rows came from

    @property
    def shown(self) -> bool:
        return bool(self.lines)

    @property
    def with_threads(self) -> bool:
        """Whether the rows counted the tasks' threads (summary.csv of a capture with offcpu_threads.json)."""
        return any(line.threads is not None for line in self.lines)

    @property
    def with_sites(self) -> bool:
        """Whether the lines name where their tasks waited (the report had the blocked stacks)."""
        return any(line.sites for line in self.lines)


def _num(value: Any) -> float | None:
    return cell_number(value, lenient=True)


def offcpu_table(
    rows: Sequence[Mapping[str, str]],
    task_names: Sequence[str],
    colors: Mapping[str, str],
    sites: Mapping[str, Sequence[WaitSite]] | None = None,
) -> OffCpuTable:
    """The cluster's rows (summary.csv) when there are, else the PID rows summed per task; empty when no
    row measured off-CPU time (a run without --off-cpu, or cut with --from/--to). ``sites``: each task's
    wait sites (``wait_sites``), shown beside its causes."""
    cluster = {r.get("task"): r for r in rows if r.get("host") == ALL_TASKS and r.get("pid") == ALL_TASKS}
    columns = ("cpu_seconds", "offcpu_seconds", "offcpu_threads", *(f"offcpu_{cause}_seconds" for cause in CAUSES))
    sums: dict[str, dict[str, float | None]] = {}
    if any(_num(r.get("offcpu_seconds")) is not None for r in cluster.values()):
        source = "summary.csv (coordinator analyze)"
        for task in task_names:
            row = cluster.get(task, {})
            sums[task] = {column: _num(row.get(column)) for column in columns}
    else:
        source = "the PID rows"
        by_task = pid_rows_by_task(rows, task_names)
        for task in task_names:
            sums[task] = {column: sum_known(_num(r.get(column)) for r in by_task[task]) for column in columns}
    if not any(values["offcpu_seconds"] is not None for values in sums.values()):
        return OffCpuTable((), (), source)
    causes = tuple(c for c in CAUSES if any((v[f"offcpu_{c}_seconds"] or 0) > 0 for v in sums.values()))
    lines = tuple(
        OffCpuLine(
            task=task,
            color=colors.get(task, ""),
            cpu_seconds=values["cpu_seconds"],
            offcpu_seconds=values["offcpu_seconds"],
            by_cause=tuple(values[f"offcpu_{cause}_seconds"] for cause in causes),
            threads=values["offcpu_threads"],
            sites=tuple((sites or {}).get(task, ())),
        )
        for task, values in sums.items()
        if values["offcpu_seconds"] or values["cpu_seconds"]
    )
    return OffCpuTable(causes, lines, source)


_MARKS = re.compile(r"(?:\s*\[[^\]]*\])+$")  # the walker's marks: ` [i]`, ` [inlined]`, ` [approx]`


def short_frame(frame: str) -> str:
    """A wait site's name: a Java frame's class and method (``MailboxProcessor::runMailboxLoop``), a native
    frame without its argument list, a kernel frame without its mark, cut to SITE_CHARS (a frame is the
    target's text; the page escapes it)."""
    name = frame.strip().removesuffix(KERNEL_SUFFIX)
    name = _MARKS.sub("", name)
    if name.endswith(")") and "(" in name:
        name = name[: name.index("(")]
    owner, sep, method = name.rpartition("::")
    if sep and "." in owner and " " not in owner:
        name = f"{owner.rsplit('.', 1)[1]}::{method}"
    return name[:SITE_CHARS] or frame[:SITE_CHARS]


def _thread_name_site(frames: Sequence[str], matcher: Matcher | None) -> str:
    """The site of a stack only its thread's name decided: the name's mark and, for a walked stack, the
    method that called the wait (the leaf-most frame that does not only say how it waits:
    ``ForkJoinPool::awaitWork``, ``VMThread::wait_for_operation``), which tells an idle pool from a loop."""
    if WHOLE_WINDOW_FRAME in frames:
        return WHOLE_WINDOW_SITE
    for frame in reversed(frames[1:]):
        if frame.startswith("[") or (matcher is not None and matcher.says_how_it_waits(frame)):
            continue  # a marker ([stub], [unknown]) or a wait frame
        return f"{THREAD_NAME_SITE} in {short_frame(frame)}"
    return THREAD_NAME_SITE


def wait_sites(
    offcpu: Mapping[str, Mapping[int, Sequence[OffCpuEntry]]],
    classifications: StackClassifications,
    limit: int = SITES_PER_TASK,
) -> dict[str, tuple[WaitSite, ...]]:
    """Each task's blocked seconds per (cause, deciding frame) over every host and PID, its ``limit``
    largest: the frame the off-CPU rule decided the stack by (the method of the task that waited above the
    JVM's and the kernel's wait frames), the thread's name where only the root matched (with the method that
    called the wait, ``_thread_name_site``), NO_SITE for an unmatched stack. The same decisions as the
    task's off-CPU flamegraph and summary.csv's columns."""
    found: dict[str, dict[tuple[str, str], int]] = {}
    for by_pid in offcpu.values():
        for entries in by_pid.values():
            for entry in entries:
                frames = entry.stack.split(FRAME_SEPARATOR)
                index, decider = classifications.classify(entry.stack, frames)
                if decider is None:
                    site = NO_SITE
                elif decider == 0:
                    site = _thread_name_site(frames, classifications.matcher)
                else:
                    site = short_frame(frames[decider])
                sums = found.setdefault(classifications.task_names[index], {})
                sums[(entry.cause, site)] = sums.get((entry.cause, site), 0) + entry.blocked_ns
    return {
        task: tuple(
            WaitSite(cause, site, ns / 1e9)
            for (cause, site), ns in sorted(sums.items(), key=lambda item: (-item[1], item[0]))[:limit]
        )
        for task, sums in found.items()
    }


def blocked_counts(entries: Sequence[OffCpuEntry]) -> dict[str, int]:
    """Folded stack -> whole milliseconds blocked (a flamegraph's counts), summed over the causes: the
    cause is in the table and, for most waits, in the kernel frames at the stack's tip."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.stack] = counts.get(entry.stack, 0) + entry.blocked_ns
    return {stack: round(ns / 1e6) for stack, ns in counts.items() if round(ns / 1e6) > 0}


def offcpu_flamegraphs(
    offcpu: Mapping[str, Mapping[int, Sequence[OffCpuEntry]]],
    classifications: StackClassifications,
    frames: FrameTable,
    processes_by_host: Mapping[str, Mapping[int, ProcessInfo]],
    max_stacks: int,
) -> list[FlameGraph]:
    """An off-CPU flamegraph per PID and per task (width: milliseconds blocked, the task colours by the
    same leaf-first rule as the samples'); none for a run without --off-cpu."""
    graphs: list[FlameGraph] = []

    def graph(counts: Mapping[str, int], key: str, title: str, kind: str, root: str) -> None:
        built = build_flamegraph(
            counts, classifications, frames, key=key, title=title, kind=kind, root_name=root, max_stacks=max_stacks
        )
        graphs.append(replace(built, unit=OFFCPU_UNIT))

    all_counts: dict[str, int] = {}
    for host_name in sorted(offcpu):
        for pid, entries in sorted(offcpu[host_name].items()):
            counts = blocked_counts(entries)
            if not counts:
                continue
            process = processes_by_host.get(host_name, {}).get(pid)
            what = f" ({process.engine} {process.kind})" if process is not None else ""
            title = f"{host_name} PID {pid}{what}: off-CPU"
            graph(counts, f"offcpu-pid:{host_name}:{pid}", title, "offcpu-pid", f"PID {pid} off-CPU")
            for stack, count in counts.items():
                all_counts[stack] = all_counts.get(stack, 0) + count
    if not all_counts:
        return graphs
    by_task = classifications.split_by_task(all_counts)
    for task in classifications.task_names:
        if by_task[task]:
            graph(by_task[task], f"offcpu-task:{task}", f"task {task}: off-CPU", "offcpu-task", f"{task} off-CPU")
    return graphs
