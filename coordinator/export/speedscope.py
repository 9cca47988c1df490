"""speedscope export: the file format's "sampled" profiles (https://www.speedscope.app/file-format-schema.json),
one per process, or one per process and task. Pure: an ExportSet in, the JSON document out.

Why the task is a root frame: speedscope shows one profile at a time, so a profile per task would
hide how the tasks of a process compare; with ``[task: NAME]`` as the root frame, "Left Heavy" shows
each process's tasks side by side with their exact widths, "Sandwich" still sums a function over
every task, and the profile list stays one entry per process (docs/exports.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coordinator.export.stacks import ExportProcess, ExportSet, OffCpuStack, TaskStack, frame_names
from profiler import __version__

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


class FrameTable:
    """speedscope's shared frame list: each frame name stored once."""

    def __init__(self) -> None:
        self.frames: list[dict[str, str]] = []
        self._index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            index = self._index[name] = len(self.frames)
            self.frames.append({"name": name})
        return index


def _profile(
    name: str, stacks: Iterable[TaskStack | OffCpuStack], frames: FrameTable, with_task: bool
) -> dict[str, Any]:
    """One sampled profile; samples are root first, grouped by task in profile order, so "Time
    Order" (which has no time here: the stacks are aggregated) shows the tasks as blocks. On-CPU
    stacks weigh their sample counts (unit none), off-CPU stacks their blocked nanoseconds."""
    samples: list[list[int]] = []
    weights: list[int] = []
    unit = "none"
    for stack in stacks:
        samples.append([frames(name) for name in frame_names(stack, with_task)])
        if isinstance(stack, OffCpuStack):
            weights.append(stack.blocked_ns)
            unit = "nanoseconds"
        else:
            weights.append(stack.count)
    return {
        "type": "sampled",
        "name": name,
        "unit": unit,
        "startValue": 0,
        "endValue": sum(weights),
        "samples": samples,
        "weights": weights,
    }


def _process_profiles(
    label: str, stacks: list[Any], task_names: Iterable[str], frames: FrameTable, per_task: bool, suffix: str
) -> list[dict[str, Any]]:
    if not per_task:
        return [_profile(label + suffix, stacks, frames, with_task=True)] if stacks else []
    profiles = []
    for task in task_names:
        task_stacks = [s for s in stacks if s.task == task]
        if task_stacks:
            profiles.append(_profile(f"{label}: task {task}{suffix}", task_stacks, frames, with_task=False))
    return profiles


def build_speedscope(export: ExportSet, per_task: bool = False) -> dict[str, Any]:
    """The speedscope document: a profile per process (samples weighted by sample counts, the task
    as root frame), or with ``per_task`` a profile per process and task with the stacks as they are.
    A run with --off-cpu adds, after each, the same for the blocked time (``… off-CPU``, weights in
    nanoseconds). Processes without samples (in the selection) get no profile."""
    frames = FrameTable()
    order = {task: index for index, task in enumerate(export.task_names)}
    by_process: dict[ExportProcess, list[TaskStack]] = {p: [] for p in export.processes}
    blocked: dict[ExportProcess, list[OffCpuStack]] = {p: [] for p in export.processes}
    for stack in export.stacks:
        by_process[stack.process].append(stack)
    for entry in export.offcpu:
        blocked[entry.process].append(entry)
    profiles = []
    for process, stacks in by_process.items():
        stacks.sort(key=lambda s: order.get(s.task, len(order)))  # stable: most samples first per task
        profiles += _process_profiles(process.label, stacks, export.task_names, frames, per_task, "")
        waits = sorted(blocked[process], key=lambda s: order.get(s.task, len(order)))
        profiles += _process_profiles(process.label, waits, export.task_names, frames, per_task, " off-CPU")
    title = f"spe-taskprof run {export.run_id}" + (f" ({export.window})" if export.window else "")
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames.frames},
        "profiles": profiles,
        "name": title,
        "activeProfileIndex": 0,
        "exporter": f"spe-taskprof {__version__}",
    }
