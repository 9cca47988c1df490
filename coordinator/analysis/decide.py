"""Each PID's samples summed per task of the application profile, read from its stacks file in the form it is
stored: a stack table's frames matched once and its stacks decided from frame ids (folded text is built for
the unmatched stacks only), folded text (formats 1-3) stack by stack. Both engines read through this module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from itertools import compress
from itertools import count as numbered
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.capture.folded import FRAME_SEPARATOR
from profiler.capture.read import iter_timeline, read_stack_counts
from profiler.capture.stacktable import STACK_TABLE_FILE, StackTable, read_table
from profiler.errors import CaptureFormatError
from profiler.matching.matcher import Matcher

if TYPE_CHECKING:  # numpy is imported where it is used: the CLI starts without it
    import numpy as np

    from coordinator.analysis.tableread import TableArrays

_EXACT_FLOAT = 2**53  # integers up to here are exact in float64


@dataclass
class PidTaskSums:
    """One PID's samples per result task (indexes of ``Matcher.result_names``), the part of them whose other
    frames matched other tasks (``multi``), its unmatched stacks as folded text, and a fingerprint of each
    distinct stack with samples (``stack_fingerprint``: the same for a stack whichever form it came in)."""

    samples: list[int]
    multi: list[int]
    unmatched: Counter[str] = field(default_factory=Counter)
    fingerprints: set[int] = field(default_factory=set)

    @property
    def total(self) -> int:
        return sum(self.samples)

    def by_task(self, names: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
        """(task -> samples, task -> multi-task samples) of the tasks with samples."""
        found = [i for i, count in enumerate(self.samples) if count]
        return {names[i]: self.samples[i] for i in found}, {names[i]: self.multi[i] for i in found}


def stack_samples(table: StackTable, intervals: tuple[int, int] | None = None) -> Iterator[tuple[int, int]]:
    """(stack id, samples) of a table's stacks with samples, over intervals ``first..last`` (None: all)."""
    return row_sums(table.stack_ids, table.counts, table.intervals, len(table.stacks), intervals)


def row_sums(
    stack_ids: Sequence[int] | np.ndarray, counts: Sequence[int] | np.ndarray,
    row_intervals: Sequence[int] | np.ndarray, stacks: int,
    intervals: tuple[int, int] | None = None,
) -> Iterator[tuple[int, int]]:
    """(stack id, samples) of the stacks with samples of a table's rows, over intervals ``first..last``
    (None: all), in stack-id order. numpy sums the rows (a table of a 900 s window has tens of thousands); a
    float64 sum is exact below 2^53, so rows whose counts could exceed it are summed in Python."""
    import numpy as np

    ids = np.asarray(stack_ids, dtype=np.int64)
    values = np.asarray(counts, dtype=np.uint64)
    if intervals is not None:
        slices = np.asarray(row_intervals, dtype=np.int64)
        kept = (slices >= intervals[0]) & (slices <= intervals[1])
        ids, values = ids[kept], values[kept]
    if len(values) and int(values.max()) * len(values) >= _EXACT_FLOAT:
        exact: Counter[int] = Counter()
        for stack_id, count in zip(ids.tolist(), values.tolist()):
            exact[stack_id] += count
        yield from sorted((s, n) for s, n in exact.items() if n > 0)
        return
    totals = np.bincount(ids, weights=values.astype(np.float64), minlength=stacks)
    found = np.flatnonzero(totals > 0)
    yield from zip(found.tolist(), totals[found].astype(np.int64).tolist())


def stack_fingerprint(frame_prints: Iterable[int]) -> int:
    """A 64-bit fingerprint of a stack from its frames' ``frame_fingerprint``s, root first (tuples of ints
    hash the same in every process: Python randomizes the hash of strings only)."""
    return hash(tuple(frame_prints))


def frame_fingerprint(text: str) -> int:
    """A 64-bit fingerprint of one frame's folded text."""
    digest = blake2b(text.encode("utf-8"), digest_size=8).digest()  # a lone surrogate: UnicodeEncodeError
    return int.from_bytes(digest, "little", signed=True)


class _FrameMemo(dict):  # type: ignore[type-arg]
    """frame text -> (Matcher.frame_mask, frame_fingerprint), computed once; hits are one C-level lookup."""

    def __init__(self, matcher: Matcher) -> None:
        super().__init__()
        self._mask = matcher.frame_mask

    def __missing__(self, text: str) -> tuple[int, int]:
        value = self[text] = (self._mask(text), frame_fingerprint(text))
        return value


class TaskDecider:
    """The tasks of stacks under one Matcher, memoized over every file one worker reads: each distinct frame
    text is matched and fingerprinted once; a stack costs a lookup per frame and one per combination of
    matching frames. Memory grows with distinct frames, never with stacks or samples."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self._unmatched_index = matcher.unmatched_index
        self._width = len(matcher.result_names)
        self._prints: dict[str, int] = {}
        self._frames = _FrameMemo(matcher)

    def _print_of(self, text: str) -> int:
        found = self._prints.get(text)
        if found is None:
            found = self._prints[text] = frame_fingerprint(text)
        return found

    def read(self, path: Path, intervals: tuple[int, int] | None = None) -> PidTaskSums:
        """The sums of one PID's stacks file (``capture.pid_stacks_file``, or its timeline file with
        ``intervals``: only the intervals ``first..last``); an unreadable file is a CaptureFormatError."""
        try:
            if path.name == STACK_TABLE_FILE:
                from coordinator.analysis.tableread import read_table_arrays

                return self.arrays(read_table_arrays(path), intervals)
            return self.folded(read_stack_counts(path, intervals))
        except OSError as exc:
            raise CaptureFormatError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from None
        except UnicodeEncodeError:  # JSON's \ud800 escapes decode to text no file can hold
            raise CaptureFormatError(
                f"{path}: a frame name is not UTF-8 text (a lone surrogate); re-run or re-fetch the capture"
            ) from None

    def table(self, table: StackTable, intervals: tuple[int, int] | None = None) -> PidTaskSums:
        """A stack table's sums: frames matched once, each stack decided from its frame ids."""
        texts = table.frame_texts()
        mask_of = list(map(self.matcher.frame_mask, texts)).__getitem__
        print_of = list(map(self._print_of, texts)).__getitem__
        decide = self.matcher.decide_masks
        stacks = table.stacks
        sums = PidTaskSums([0] * self._width, [0] * self._width)
        samples, multi, fingerprints = sums.samples, sums.multi, sums.fingerprints
        unmatched_ids = []
        for stack_id, count in stack_samples(table, intervals):
            frames = stacks[stack_id]
            index, others = decide(tuple(filter(None, map(mask_of, frames))))
            samples[index] += count
            if others:
                multi[index] += count
            fingerprints.add(hash(tuple(map(print_of, frames))))  # stack_fingerprint, inlined: the hot loop
            if index == self._unmatched_index:
                unmatched_ids.append((stack_id, count))
        if unmatched_ids:
            text_of = table.stack_text(texts)
            for stack_id, count in unmatched_ids:
                sums.unmatched[text_of(stack_id)] += count
        return sums

    def arrays(self, table: TableArrays, intervals: tuple[int, int] | None = None) -> PidTaskSums:
        """``table``'s sums from the prefix-coded stacks: a stack's state (the OR of its frames' masks, its
        leaf-most matching frame's mask and the OR of the masks before that one) is the state of the frames
        it shares with the stack before, carried on through its own frames, so each frame of the file is
        looked at once (and in Python only when it matches a task). Decides every stack as ``table()`` does
        (Matcher.decide_masks: the leaf-most matching frame's task, the other frames' tasks as ``multi``)."""
        texts = table.frame_texts()
        frame_masks, frame_prints = zip(*map(self._frames.__getitem__, texts)) if texts else ((), ())
        mask_of, print_of = frame_masks.__getitem__, frame_prints.__getitem__
        decide = self.matcher.decide_masks
        sums = PidTaskSums([0] * self._width, [0] * self._width)
        samples, multi, fingerprints = sums.samples, sums.multi, sums.fingerprints
        totals = row_sums(table.stack_ids, table.counts, table.intervals, table.stack_count, intervals)
        wanted, count = next(totals, (-1, 0))
        path: list[int] = []  # the current stack's frame ids
        prints: list[int] = []  # their frame_fingerprints
        # The state after each matching frame of the current stack: (depth: frames up to and including it,
        # (all masks so far, this leaf mask, the masks before it)); depth 0 is the empty stack's.
        depths, states = [0], [(0, 0, 0)]
        unmatched_ids = []
        for stack_id, (prefix, suffix) in enumerate(table.prefix_coded()):
            del path[prefix:], prints[prefix:]
            path += suffix
            prints += map(print_of, suffix)
            while depths[-1] > prefix:
                depths.pop()
                states.pop()
            state = states[-1]
            masks = list(map(mask_of, suffix))
            if any(masks):  # few frames match: they alone are looked at in Python
                for depth, mask in zip(compress(numbered(prefix + 1), masks), filter(None, masks)):
                    state = (state[0] | mask, mask, state[0])
                    depths.append(depth)
                    states.append(state)
            if stack_id != wanted:
                continue
            index, others = decide(((state[2], state[1]) if state[2] else (state[1],)) if state[1] else ())
            samples[index] += count
            if others:
                multi[index] += count
            fingerprints.add(hash(tuple(prints)))  # stack_fingerprint, inlined: the hot loop
            if index == self._unmatched_index:
                unmatched_ids.append((tuple(path), count))
            wanted, count = next(totals, (-1, 0))
        for frames, count in unmatched_ids:
            sums.unmatched[FRAME_SEPARATOR.join(map(texts.__getitem__, frames))] += count
        return sums

    def folded(self, counts: Mapping[str, int]) -> PidTaskSums:
        """Folded stacks' sums (formats 1-3): each stack split into its frames, decided by the same rule."""
        mask = self.matcher.frame_mask
        decide = self.matcher.decide_masks
        print_of = self._print_of
        sums = PidTaskSums([0] * self._width, [0] * self._width)
        for stack, count in counts.items():
            if count <= 0:
                continue
            frames = stack.split(FRAME_SEPARATOR)
            index, others = decide(tuple(filter(None, map(mask, frames))))
            sums.samples[index] += count
            if others:
                sums.multi[index] += count
            sums.fingerprints.add(stack_fingerprint(map(print_of, frames)))
            if index == self._unmatched_index:
                sums.unmatched[stack] += count
        return sums

    def context_tasks(self, table: StackTable) -> dict[str, Counter[str]]:
        """Thread context (a Spark task's or Flink subtask's full thread name) -> task -> samples of a
        table's rows with a context, each stack decided from its frame ids once."""
        names = self.matcher.result_names
        task_of = self._stack_tasks(table)
        out: dict[str, Counter[str]] = {}
        for stack_id, context_id, count in zip(table.stack_ids, table.context_ids, table.counts):
            if context_id and count > 0:
                out.setdefault(table.contexts[context_id - 1], Counter())[names[task_of(stack_id)]] += count
        return out

    def _stack_tasks(self, table: StackTable) -> Callable[[int], int]:
        """stack id -> task index of a table, each stack decided from its frame ids when first asked."""
        mask_of = list(map(self.matcher.frame_mask, table.frame_texts())).__getitem__
        decide = self.matcher.decide_masks
        stacks = table.stacks
        decided: dict[int, int] = {}

        def task_of(stack_id: int) -> int:
            index = decided.get(stack_id)
            if index is None:
                index = decided[stack_id] = decide(tuple(filter(None, map(mask_of, stacks[stack_id]))))[0]
            return index

        return task_of

    def interval_tasks(self, path: Path) -> dict[int, dict[str, int]]:
        """interval -> task -> samples of one PID's timeline file (the report's time chart): a stack table's
        stacks decided from frame ids, once each; timeline.folded line by line. An unreadable file is a
        CaptureFormatError."""
        names = self.matcher.result_names
        out: dict[int, dict[str, int]] = {}
        try:
            for interval, index, count in self._interval_rows(path):
                if count > 0:
                    slot = out.setdefault(interval, {})
                    slot[names[index]] = slot.get(names[index], 0) + count
        except OSError as exc:
            raise CaptureFormatError(f"{path}: cannot read ({exc.strerror or exc}); check the file") from None
        return out

    def _interval_rows(self, path: Path) -> Iterator[tuple[int, int, int]]:
        """(interval, task index, samples) per row of a stack table or line of a timeline.folded."""
        if path.name != STACK_TABLE_FILE:
            for interval, stack, count in iter_timeline(path):
                yield interval, self.matcher.classify_mask(stack)[0], count
            return
        table = read_table(path)
        task_of = self._stack_tasks(table)
        for interval, stack_id, count in zip(table.intervals, table.stack_ids, table.counts):
            yield interval, task_of(stack_id), count


def interval_samples(path: Path) -> dict[int, int]:
    """Samples per interval of one PID's timeline file (stacks.tpc or timeline.folded), without its stacks' text."""
    if path.name != STACK_TABLE_FILE:
        totals: dict[int, int] = {}
        for interval, _stack, count in iter_timeline(path):
            totals[interval] = totals.get(interval, 0) + count
        return totals
    table = read_table(path)
    by_interval: Counter[int] = Counter()
    for interval, count in zip(table.intervals, table.counts):
        by_interval[interval] += count
    return dict(by_interval)
