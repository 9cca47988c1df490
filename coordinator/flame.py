"""Folded stacks → compact flamegraph trees for the HTML report, each frame attributed to a task.

Pure: counts and a classifier in, plain JSON-ready structures out. Frame names are interned in one
table shared by every graph of a report, so a frame repeated in many graphs is stored once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profiler.capture import UNMATCHED

FRAME_SEPARATOR = ";"
# Colour index of a frame whose samples went to more than one task (drawn neutral).
MIXED = -1
# Default limit of distinct stacks per flamegraph; the smallest stacks beyond it are merged away.
DEFAULT_MAX_STACKS = 3000

# (task name, index of the deciding frame or None) for the frames of one stack, root first.
Classifier = Callable[[Sequence[str]], "tuple[str, int | None]"]


class FrameTable:
    """Interned frame strings: each distinct name is stored once and referred to by its index."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def intern(self, name: str) -> int:
        index = self._index.get(name)
        if index is None:
            index = len(self.names)
            self._index[name] = index
            self.names.append(name)
        return index

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Pruned:
    """What ``prune_stacks`` kept and what it dropped."""

    kept: dict[str, int]
    dropped_stacks: int
    dropped_samples: int


def prune_stacks(counts: Mapping[str, int], max_stacks: int) -> Pruned:
    """Keep the ``max_stacks`` largest stacks (ties by stack text); ``max_stacks <= 0`` keeps all."""
    positive = {stack: count for stack, count in counts.items() if count > 0}
    if max_stacks <= 0 or len(positive) <= max_stacks:
        return Pruned(positive, 0, 0)
    ordered = sorted(positive.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ordered[:max_stacks])
    dropped = ordered[max_stacks:]
    return Pruned(kept, len(dropped), sum(count for _, count in dropped))


@dataclass
class _Node:
    frame: int
    value: int = 0
    tasks: dict[int, int] = field(default_factory=dict)  # task index -> samples through this frame
    decides: dict[int, int] = field(default_factory=dict)  # task index -> samples this frame decided
    children: dict[int, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class FlameGraph:
    """One flamegraph: a compact tree plus what was left out.

    ``tree`` is ``[frame, value, task, children]`` with ``task`` an index into the report's task
    list or ``MIXED``; a mixed node carries a fifth element ``{task: samples}`` (its breakdown), and
    a node that decided a task for some of its samples a sixth ``{task: samples}``. ``value`` is the
    number of samples through the frame (inclusive), as d3-flame-graph expects.
    """

    key: str
    title: str
    kind: str  # "host", "pid", "task", "unmatched"
    tree: list[Any]
    samples: int
    stacks: int
    dropped_stacks: int
    dropped_samples: int
    max_depth: int

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "kind": self.kind,
            "tree": self.tree,
            "samples": self.samples,
            "stacks": self.stacks,
            "droppedStacks": self.dropped_stacks,
            "droppedSamples": self.dropped_samples,
            "maxDepth": self.max_depth,
        }


def dropped_frame_name(dropped_stacks: int, dropped_samples: int) -> str:
    return (
        f"[{dropped_stacks} smallest stacks, {dropped_samples} samples, not drawn: "
        "raise --max-stacks to see them]"
    )


class StackClassifications:
    """Memo of classifier results per distinct stack, shared by every graph of one report."""

    def __init__(self, classifier: Classifier, task_names: Sequence[str]) -> None:
        self._classifier = classifier
        self.task_names: tuple[str, ...] = tuple(task_names)
        self._task_index = {name: index for index, name in enumerate(self.task_names)}
        self._memo: dict[str, tuple[int, int | None]] = {}

    def task_index(self, task: str) -> int:
        try:
            return self._task_index[task]
        except KeyError:
            raise ValueError(f"classifier returned task {task!r} that is not in the report's task list") from None

    def classify(self, stack: str, frames: Sequence[str]) -> tuple[int, int | None]:
        found = self._memo.get(stack)
        if found is None:
            task, decider = self._classifier(frames)
            found = (self.task_index(task), decider)
            self._memo[stack] = found
        return found


def build_flamegraph(
    counts: Mapping[str, int],
    classifications: StackClassifications,
    frames: FrameTable,
    *,
    key: str,
    title: str,
    kind: str,
    root_name: str,
    max_stacks: int = DEFAULT_MAX_STACKS,
) -> FlameGraph:
    """Merge folded stacks into a tree whose nodes know which tasks their samples went to.

    Colour rule: a frame takes the colour of a task when every sample passing through it was
    attributed to that task; a frame shared by stacks of several tasks (thread roots, event loops)
    is MIXED and carries its breakdown. The deciding frame of a stack (the leaf-most frame matching
    a pattern) and everything above it in that stack therefore share the task's colour unless other
    tasks' stacks pass through the same frame.
    """
    pruned = prune_stacks(counts, max_stacks)
    root = _Node(frames.intern(root_name))
    max_depth = 0
    for stack, count in pruned.kept.items():
        names = stack.split(FRAME_SEPARATOR)
        task, decider = classifications.classify(stack, names)
        node = root
        _add(node, task, count)
        for depth, name in enumerate(names):
            child = node.children.get(index := frames.intern(name))
            if child is None:
                child = node.children[index] = _Node(index)
            _add(child, task, count)
            if depth == decider:
                child.decides[task] = child.decides.get(task, 0) + count
            node = child
        max_depth = max(max_depth, len(names))
    if pruned.dropped_stacks:
        marker = _Node(frames.intern(dropped_frame_name(pruned.dropped_stacks, pruned.dropped_samples)))
        marker.value = pruned.dropped_samples
        marker.tasks = {MIXED: pruned.dropped_samples}
        root.children[marker.frame] = marker
        root.value += pruned.dropped_samples
        root.tasks[MIXED] = root.tasks.get(MIXED, 0) + pruned.dropped_samples
    return FlameGraph(
        key=key,
        title=title,
        kind=kind,
        tree=_compact(root),
        samples=root.value,
        stacks=len(pruned.kept),
        dropped_stacks=pruned.dropped_stacks,
        dropped_samples=pruned.dropped_samples,
        max_depth=max_depth,
    )


def _add(node: _Node, task: int, count: int) -> None:
    node.value += count
    node.tasks[task] = node.tasks.get(task, 0) + count


def _compact(root: _Node) -> list[Any]:
    """Nested lists, largest child first; iterative so deep stacks cannot hit the recursion limit."""
    out: list[Any] = _compact_one(root)
    pending: list[tuple[_Node, list[Any]]] = [(root, out)]
    while pending:
        node, target = pending.pop()
        for child in sorted(node.children.values(), key=lambda c: (-c.value, c.frame)):
            compact_child = _compact_one(child)
            target[3].append(compact_child)
            if child.children:
                pending.append((child, compact_child))
    return out


def _compact_one(node: _Node) -> list[Any]:
    task = next(iter(node.tasks)) if len(node.tasks) == 1 else MIXED
    compact: list[Any] = [node.frame, node.value, task, []]
    if task == MIXED or node.decides:
        compact.append({str(t): n for t, n in sorted(node.tasks.items())} if task == MIXED else None)
    if node.decides:
        compact.append({str(t): n for t, n in sorted(node.decides.items())})
    return compact


def merge_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for part in parts:
        for stack, count in part.items():
            merged[stack] = merged.get(stack, 0) + count
    return merged


def stacks_of_task(
    counts: Mapping[str, int], classifications: StackClassifications, task: str
) -> dict[str, int]:
    """The stacks of ``counts`` attributed to ``task`` (drill-down flamegraphs)."""
    wanted = classifications.task_index(task)
    return {
        stack: count
        for stack, count in counts.items()
        if count > 0 and classifications.classify(stack, stack.split(FRAME_SEPARATOR))[0] == wanted
    }


def leaf_first_classifier(frame_tasks: Callable[[str], Sequence[str]]) -> Classifier:
    """Algorithm 1 of the paper as a classifier: the leaf-most frame matching any task decides,
    and among its tasks the earliest in the profile wins. ``frame_tasks`` is the matcher's."""

    def classify(frames: Sequence[str]) -> tuple[str, int | None]:
        for index in range(len(frames) - 1, -1, -1):
            tasks = frame_tasks(frames[index])
            if tasks:
                return tasks[0], index
        return UNMATCHED, None

    return classify
