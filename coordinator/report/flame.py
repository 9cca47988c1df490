"""Folded stacks → compact flamegraph trees for the HTML report, each frame attributed to a task.

Pure: counts and the run's ``Matcher`` in, plain JSON-ready structures out. Frame names are interned in one
table shared by every graph of a report, so a frame repeated in many graphs is stored once.
"""

from __future__ import annotations

import functools
import gc
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from profiler.capture.folded import FRAME_SEPARATOR
from profiler.capture.format import UNMATCHED
from profiler.matching.matcher import Matcher
from profiler.matching.stats import two_proportion_z

_Builder = TypeVar("_Builder", bound=Callable[..., Any])

# Colour index of a frame whose samples went to more than one task (drawn neutral).
MIXED = -1
# Default limit of distinct stacks per flamegraph; the smallest stacks beyond it are merged away.
DEFAULT_MAX_STACKS = 3000


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
    # The smallest count that still makes the cut, found in O(n log k) on the counts alone.
    threshold = heapq.nlargest(max_stacks, positive.values())[-1]
    kept = {stack: count for stack, count in positive.items() if count > threshold}
    ties = sorted(stack for stack, count in positive.items() if count == threshold)
    for stack in ties[: max_stacks - len(kept)]:
        kept[stack] = threshold
    dropped_samples = sum(positive.values()) - sum(kept.values())
    return Pruned(kept, len(positive) - len(kept), dropped_samples)


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
    unit: str = "samples"  # what a frame's width counts (off-CPU graphs: milliseconds blocked)

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
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
    """Memo of ``Matcher.decide`` per distinct stack, shared by every graph of one report.

    The matcher is the summary's own, so a frame's colour is the task the summary counted its
    samples in; without a profile (``None``) every stack is unmatched. ``off_cpu``: the stacks are blocked
    stacks, decided by the off-CPU rule (``Matcher.decide_offcpu``) as summary.csv's offcpu columns are.
    """

    def __init__(self, matcher: Matcher | None, task_names: Sequence[str], off_cpu: bool = False) -> None:
        self.matcher = matcher
        self._decide = None if matcher is None else matcher.decide_offcpu if off_cpu else matcher.decide
        self.task_names: tuple[str, ...] = tuple(task_names)
        self._task_index = {name: index for index, name in enumerate(self.task_names)}
        self._memo: dict[str, tuple[int, int | None]] = {}

    def task_index(self, task: str) -> int:
        try:
            return self._task_index[task]
        except KeyError:
            raise ValueError(f"matcher returned task {task!r} that is not in the report's task list") from None

    def classify(self, stack: str, frames: Sequence[str] | None = None) -> tuple[int, int | None]:
        """(task index, deciding frame index) of a folded stack; ``frames`` saves a split if known."""
        found = self._memo.get(stack)
        if found is None:
            if self._decide is None:
                task, decider = UNMATCHED, None
            else:
                task, decider = self._decide(frames if frames is not None else stack.split(FRAME_SEPARATOR))
            found = (self.task_index(task), decider)
            self._memo[stack] = found
        return found

    def split_by_task(self, counts: Mapping[str, int]) -> dict[str, dict[str, int]]:
        """The stacks of ``counts`` grouped by task (every task present, possibly empty)."""
        groups: list[dict[str, int]] = [{} for _ in self.task_names]
        classify = self.classify
        for stack, count in counts.items():
            if count > 0:
                groups[classify(stack)[0]][stack] = count
        return dict(zip(self.task_names, groups))


def _without_cyclic_gc(build: _Builder) -> _Builder:
    """Building creates up to millions of small lists that never form cycles; the cyclic garbage
    collector would rescan them again and again (most of the time for large captures)."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            return build(*args, **kwargs)
        finally:
            if gc_enabled:
                gc.enable()

    return cast(_Builder, wrapper)


@_without_cyclic_gc
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
    # Nodes are lists for speed: [frame, value, task, breakdown | None, decides | None, children | None].
    root: list[Any] = [frames.intern(root_name), 0, _UNSET, None, None, None]
    intern = frames.intern
    classify = classifications.classify
    max_depth = 0
    for stack, count in pruned.kept.items():
        names = stack.split(FRAME_SEPARATOR)
        task, decider = classify(stack, names)  # on the whole stack: a cut changes no colour
        if len(names) > max_depth:
            max_depth = len(names)
        if len(names) > MAX_DRAWN_DEPTH:
            names, decider = _cut_deep(names, decider)
        _add(root, task, count)
        node = root
        for depth, name in enumerate(names):
            index = intern(name)
            children = node[5]
            if children is None:
                children = node[5] = {}
            child = children.get(index)
            if child is None:
                child = children[index] = [index, 0, _UNSET, None, None, None]
            _add(child, task, count)
            if depth == decider:
                decides = child[4]
                if decides is None:
                    decides = child[4] = {}
                decides[task] = decides.get(task, 0) + count
            node = child
    if pruned.dropped_stacks:
        marker_frame = intern(dropped_frame_name(pruned.dropped_stacks, pruned.dropped_samples))
        if root[5] is None:
            root[5] = {}
        root[5][marker_frame] = [marker_frame, pruned.dropped_samples, MIXED, {}, None, None]
        _add(root, MIXED, pruned.dropped_samples)
    return FlameGraph(
        key=key,
        title=title,
        kind=kind,
        tree=_compact(root),
        samples=root[1],
        stacks=len(pruned.kept),
        dropped_stacks=pruned.dropped_stacks,
        dropped_samples=pruned.dropped_samples,
        max_depth=max_depth,
    )


_UNSET = -2
# Frames of a stack drawn in a flame graph: a deeper stack (a runaway recursion, a hostile capture of 10^6
# frames) keeps both ends, root and leaf, around one frame saying how many are not drawn; a browser draws
# it, and the page stays a few MB.
MAX_DRAWN_DEPTH = 2048


def _cut_deep(names: list[str], decider: int | None) -> tuple[list[str], int | None]:
    """A stack deeper than MAX_DRAWN_DEPTH as drawn, and where its deciding frame is drawn (the cut's frame
    when the decider lies in the cut)."""
    half = MAX_DRAWN_DEPTH // 2
    cut = len(names) - 2 * half
    drawn = names[:half] + [f"[{cut} frames not drawn]"] + names[-half:]
    if decider is not None and decider >= half:
        decider = half if decider < len(names) - half else decider - cut + 1
    return drawn, decider


def _add(node: list[Any], task: int, count: int) -> None:
    """Count ``count`` samples of ``task`` through ``node``; a second task makes it MIXED."""
    previous = node[1]
    node[1] = previous + count
    current = node[2]
    if current == task:
        return
    if current == _UNSET:
        node[2] = task
    elif node[3] is None:
        node[3] = {current: previous, task: count}
        node[2] = MIXED
    else:
        breakdown = node[3]
        breakdown[task] = breakdown.get(task, 0) + count


def _compact(root: list[Any]) -> list[Any]:
    """Nested lists, largest child first; iterative so deep stacks cannot hit the recursion limit."""
    out = _compact_one(root)
    pending: list[tuple[list[Any], list[Any]]] = [(root, out)] if root[5] else []
    while pending:
        node, target = pending.pop()
        children = node[5].values()
        if len(children) > 1:
            children = sorted(children, key=_child_order)
        append = target[3].append
        for child in children:
            compact_child = _compact_one(child)
            append(compact_child)
            if child[5]:
                pending.append((child, compact_child))
    return out


def _child_order(node: list[Any]) -> tuple[int, int]:
    return (-node[1], node[0])


def _compact_one(node: list[Any]) -> list[Any]:
    task, breakdown, decides = node[2], node[3] or {}, node[4]
    if task == _UNSET:  # no samples at all (an empty graph): neutral
        task = MIXED
    if task == MIXED or decides:
        return [
            node[0], node[1], task, [],
            {str(t): n for t, n in sorted(breakdown.items())} if task == MIXED else None,
            *([{str(t): n for t, n in sorted(decides.items())}] if decides else []),
        ]
    return [node[0], node[1], task, []]


def merge_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for part in parts:
        for stack, count in part.items():
            merged[stack] = merged.get(stack, 0) + count
    return merged


# ---------------------------------------------------------------- differential flamegraph (compare)


@dataclass(frozen=True)
class DiffFlameGraph:
    """Two runs' stacks in one tree, for `coordinator compare`.

    ``tree`` is ``[frame, a, b, delta, significant, children]``: samples through the frame in run A
    and run B (inclusive), the change of its share of all samples (B − A, as a fraction) and 1 when
    the pooled two-proportion z-test (profiler.matching.stats) rejects equal shares at the given level.
    """

    tree: list[Any]
    samples_a: int
    samples_b: int
    dropped_stacks: int  # stacks left out of either side by max_stacks (their samples still count in the totals)
    level: float


def build_diff_flamegraph(
    stacks_a: Mapping[str, int],
    stacks_b: Mapping[str, int],
    frames: FrameTable,
    level: float = 0.05,
    max_stacks: int = DEFAULT_MAX_STACKS,
) -> DiffFlameGraph:
    """Merge both runs' folded stacks into one tree; shares are of each run's total samples."""
    kept_a, kept_b = prune_stacks(stacks_a, max_stacks), prune_stacks(stacks_b, max_stacks)
    total_a = sum(c for c in stacks_a.values() if c > 0)
    total_b = sum(c for c in stacks_b.values() if c > 0)
    root: list[Any] = [0, 0, {}]  # a, b, children by frame name
    for side, kept in ((0, kept_a.kept), (1, kept_b.kept)):
        for stack, count in kept.items():
            node = root
            node[side] += count
            for frame in stack.split(FRAME_SEPARATOR):
                node = node[2].setdefault(frame, [0, 0, {}])
                node[side] += count
    tree = _diff_node(frames, "all", root, total_a, total_b, level)
    return DiffFlameGraph(tree, total_a, total_b, kept_a.dropped_stacks + kept_b.dropped_stacks, level)


def _diff_node(frames: FrameTable, name: str, node: list[Any], total_a: int, total_b: int, level: float) -> list[Any]:
    """One node and its subtree (depth: a stack's frames, at most a few hundred)."""
    a, b = node[0], node[1]
    share_a = a / total_a if total_a else 0.0
    share_b = b / total_b if total_b else 0.0
    _, p_value = two_proportion_z(b, total_b, a, total_a)
    # Widest first, then by name: the same inputs draw the same picture.
    children = sorted(node[2].items(), key=lambda item: (-(item[1][0] + item[1][1]), item[0]))
    return [
        frames.intern(name),
        a,
        b,
        round(share_b - share_a, 6),
        1 if p_value < level else 0,
        [_diff_node(frames, child_name, child, total_a, total_b, level) for child_name, child in children],
    ]
