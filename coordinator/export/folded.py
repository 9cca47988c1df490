"""Folded export: flamegraph.pl / inferno input (``frame;frame;...;leaf count``, root first), one file
merged over the selected processes with the task as root frame, or one file per task with the stacks as
they are (the layout of the analysis's tasks/). Pure: an ExportSet in, text out.
"""

from __future__ import annotations

from coordinator.analysis.rows import task_file_names
from coordinator.export.stacks import ExportSet, frame_names
from profiler.capture.folded import FRAME_SEPARATOR, format_folded


def folded_text(export: ExportSet) -> str:
    """Every stack with ``[task: NAME]`` as its root frame, summed over processes, most samples first."""
    counts: dict[str, int] = {}
    for stack in export.stacks:
        key = FRAME_SEPARATOR.join(frame_names(stack, with_task=True))
        counts[key] = counts.get(key, 0) + stack.count
    return format_folded(counts)


def folded_per_task(export: ExportSet) -> dict[str, str]:
    """File name -> folded text per task (names as in the analysis's tasks/; empty for a task
    without samples in the selection)."""
    per_task: dict[str, dict[str, int]] = {task: {} for task in export.task_names}
    for stack in export.stacks:
        counts = per_task.setdefault(stack.task, {})
        counts[stack.stack] = counts.get(stack.stack, 0) + stack.count
    names = task_file_names(tuple(per_task))
    return {names[task]: format_folded(counts) for task, counts in per_task.items()}
