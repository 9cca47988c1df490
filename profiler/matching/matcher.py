"""Algorithm 1 of the paper: map every folded stack onto one task of an application profile.

Leaf-first: the frame nearest the leaf that matches any pattern decides; within that frame the task
listed earliest in the profile wins. Pure and deterministic; the host agent, the analysis (on Spark
or in process) and the report call the same code. docs/matching.md states every rule.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture.folded import FRAME_SEPARATOR, KERNEL_SUFFIX, format_folded, parse_source_line
from ..capture.format import ALL_TASKS, UNMATCHED
from ..capture.offcpu import OffCpuEntry
from ..capture.stacktable import StackTable, ordered_folded
from ..files.textinput import open_text
from .appprofile import ApplicationProfile, Pattern, literal_key

# Stacks of a stack table kept for a task until its Counter is built: (the table, its frame texts, ids, counts).
DeferredStacks = tuple[StackTable, list[str], list[int], list[int]]

MAX_TRIE_NESTING = 100  # deeper tries compile slowly (and recursively) in ``re``: use plain scans

# User frames that only say *how* a thread blocks (docs/offcpu.md, "Which task a blocked stack goes to"):
# the JVM's blocking natives and their Java callers, HotSpot's and glibc's wait primitives. Off-CPU
# matching passes them over, as it does kernel frames and the patterns of a profile's waiting tasks.
# Substrings of a frame's text; these frames sit at the leaf of nearly every blocked stack.
OFFCPU_WAIT_FRAMES: tuple[str, ...] = (
    "jdk.internal.misc.Unsafe::park", "sun.misc.Unsafe::park", "java.util.concurrent.locks.LockSupport::park",
    "java.lang.Thread::sleep", "java.lang.Thread::yield", "java.lang.Object::wait",
    "Unsafe_Park", "Parker::park", "JVM_Sleep", "JVM_MonitorWait", "JavaThread::sleep", "ObjectMonitor::",
    "Monitor::wait", "PlatformMonitor::", "PlatformEvent::park", "PlatformParker::",
    "pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait", "__futex_abstimed_wait",
    "futex_wait", "__lll_lock_wait", "pthread_mutex_lock", "epoll_wait", "__poll", "__select",
    "nanosleep", "sched_yield",
    # a blocking socket read (JDK 13+: NioSocketImpl polls; older: SocketInputStream; channels: SocketDispatcher)
    "sun.nio.ch.NioSocketImpl::", "java.net.SocketInputStream::", "java.net.Socket$SocketInputStream::read",
    "sun.nio.ch.SocketDispatcher::read",
    "sun.nio.ch.Net::poll", "Java_sun_nio_ch_Net_poll", "sun.nio.ch.EPoll::wait", "NET_Read", "__libc_recv",
    # entering a contended monitor (synchronized) from the interpreter or compiled code
    "ObjectSynchronizer::", "InterpreterRuntime::monitorenter", "SharedRuntime::complete_monitor_locking",
)


def literal_alternation(words: Iterable[str]) -> str | None:
    """One regex that finds any of ``words`` (literal substrings), factored as a trie; None when
    the trie nests deeper than MAX_TRIE_NESTING (hostile profiles), see ``literal_searcher``.

    Python's ``re`` tries the branches of a flat alternation one by one at every position; a trie
    shares prefixes, so each position costs about one branch test. Words that extend another word
    are dropped because the shorter one already answers "does any word occur?". The trie is built
    from the sorted words a shared prefix at a time, never a node per character: linear in the
    words' length for the nesting it allows.
    """
    unique = sorted(set(words))
    if not unique:
        raise ValueError("no words")
    return _alternation(unique, 0)


def _alternation(words: list[str], nesting: int) -> str | None:
    """The trie regex of sorted, distinct ``words``; None beyond MAX_TRIE_NESTING branchings."""
    if words[0] == "":  # a word ends here: the search already succeeded
        return ""
    if len(words) == 1:
        return re.escape(words[0])
    prefix = os.path.commonprefix([words[0], words[-1]])  # sorted: the prefix of all of them
    if prefix:
        rest = _alternation([word[len(prefix):] for word in words], nesting)
        return None if rest is None else re.escape(prefix) + rest
    if nesting >= MAX_TRIE_NESTING:
        return None
    branches = []
    for _char, group in itertools.groupby(words, key=lambda word: word[0]):
        branch = _alternation(list(group), nesting + 1)
        if branch is None:
            return None
        branches.append(branch)
    return "(?:" + "|".join(branches) + ")"


def literal_searcher(words: Iterable[str]) -> Callable[[str], bool]:
    """A predicate: does any of ``words`` occur in the text?"""
    words = sorted(set(words))
    expression = literal_alternation(words)
    if expression is not None:
        search = re.compile(expression).search
        return lambda text: search(text) is not None
    return lambda text: any(word in text for word in words)


@dataclass(frozen=True)
class FrameMatch:
    """One frame of a stack that matched patterns (``index`` 0 is the root, the thread name)."""

    index: int
    frame: str
    tasks: tuple[str, ...]  # profile order
    patterns: tuple[str, ...]  # as spelled in the profile


@dataclass(frozen=True)
class MatchExplanation:
    """Why a stack went to its task: the deciding frame and every other frame that matched."""

    task: str
    frame_index: int | None  # None when unmatched
    frame: str | None
    patterns: tuple[str, ...]  # patterns of ``task`` that matched the deciding frame
    other_tasks: tuple[str, ...]  # tasks matched by other frames, not chosen (profile order)
    matches: tuple[FrameMatch, ...]  # every frame that matched any task, leaf first

    @property
    def multi_task(self) -> bool:
        return bool(self.other_tasks)

    def describe(self) -> str:
        if self.frame_index is None:
            return f"{self.task}: no frame matches any pattern"
        lines = [
            f"{self.task}: frame {self.frame_index} {self.frame!r} matches {', '.join(self.patterns)}"
        ]
        for match in self.matches:
            if match.index != self.frame_index or len(match.tasks) > 1:
                lines.append(
                    f"  frame {match.index} {match.frame!r} also matches task(s) {', '.join(match.tasks)}"
                    f" via {', '.join(match.patterns)}"
                )
        return "\n".join(lines)


class _Memo(dict):  # type: ignore[type-arg]
    """A dict that computes missing values once; lookups stay C-speed (``dict.__getitem__``)."""

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key: Any) -> Any:
        value = self._compute(key)
        self[key] = value
        return value


class Matcher:
    """Compiled application profile. ``match`` maps a folded stack (root first, ';'-separated,
    without the count) to a task name, or ``unmatched``."""

    def __init__(self, profile: ApplicationProfile) -> None:
        self.profile = profile
        self.task_names: tuple[str, ...] = profile.task_names
        self.result_names: tuple[str, ...] = (*self.task_names, UNMATCHED)
        self.unmatched_index = len(self.task_names)
        literal_by_task: list[list[str]] = [[] for _ in self.task_names]
        regexes: list[tuple[int, re.Pattern[str]]] = []
        for index, task in enumerate(profile.tasks):
            for pattern in task.patterns:
                if pattern.regex:
                    regexes.append((1 << index, re.compile(pattern.text)))
                else:
                    literal_by_task[index].append(literal_key(pattern.text))
        all_literals = [word for words in literal_by_task for word in words]
        self._any_literal = literal_searcher(all_literals) if all_literals else None
        self._task_literals = [
            (1 << index, literal_searcher(words))
            for index, words in enumerate(literal_by_task)
            if words
        ]
        self._regexes = [(bit, compiled.search) for bit, compiled in regexes]
        self._frame_masks = _Memo(self._frame_mask)
        self._frame_mask_of = self._frame_masks.__getitem__
        self._decisions = _Memo(self._decide)
        self._decision_of = self._decisions.__getitem__
        self._waiting_bits = sum(1 << i for i, task in enumerate(profile.tasks) if task.waiting)
        self._is_wait_frame = literal_searcher(literal_key(frame) for frame in OFFCPU_WAIT_FRAMES)
        self._offcpu_frame_masks = _Memo(self._offcpu_frame_mask)
        self._offcpu_frame_mask_of = self._offcpu_frame_masks.__getitem__

    # -- pickling (Spark ships the matcher to executors): rebuild the compiled state from the profile
    def __getstate__(self) -> dict[str, Any]:
        return {"profile": self.profile}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["profile"])  # type: ignore[misc]

    def _frame_mask(self, frame: str) -> int:
        """Bit i set when task i has a pattern matching ``frame``; computed once per distinct frame."""
        mask = 0
        if self._any_literal is not None:
            normalized = literal_key(frame)
            if self._any_literal(normalized):
                for bit, search in self._task_literals:
                    if search(normalized):
                        mask |= bit
        for bit, regex_search in self._regexes:
            if not mask & bit and regex_search(frame) is not None:
                mask |= bit
        return mask

    def says_how_it_waits(self, frame: str) -> bool:
        """Whether a blocked stack's frame only says how the thread waits (a kernel frame or a blocking
        primitive of OFFCPU_WAIT_FRAMES): the frames the off-CPU rule passes over."""
        return frame.endswith(KERNEL_SUFFIX) or bool(self._is_wait_frame(literal_key(frame)))

    def _offcpu_frame_mask(self, frame: str) -> int:
        """``_frame_mask`` without what only says how a thread waits: 0 for a kernel frame or a blocking
        primitive (OFFCPU_WAIT_FRAMES), and never the bits of waiting tasks."""
        if self.says_how_it_waits(frame):
            return 0
        return self._frame_mask_of(frame) & ~self._waiting_bits

    def _decide(self, masks: tuple[int, ...]) -> tuple[int, int]:
        """(task index, mask of the other tasks matched by other frames) for the non-zero frame
        masks of a stack, root first."""
        if not masks:
            return self.unmatched_index, 0
        leaf_mask = masks[-1]
        chosen = (leaf_mask & -leaf_mask).bit_length() - 1  # lowest bit: earliest task in the profile
        others = 0
        for mask in masks[:-1]:
            others |= mask
        return chosen, others & ~(1 << chosen)

    def classify_mask(self, stack: str) -> tuple[int, int]:
        """(index into ``result_names``, bit mask of the other tasks that other frames matched).

        The hot path: one C-level split, a memo lookup per frame, one memo lookup for the
        combination of matching frames; Python code runs only for frames and combinations not
        seen before.
        """
        return self._decision_of(tuple(filter(None, map(self._frame_mask_of, stack.split(FRAME_SEPARATOR)))))

    def frame_mask(self, frame: str) -> int:
        """Bit i set when task i has a pattern matching ``frame`` (one frame as folded text shows it);
        memoized per distinct frame."""
        return self._frame_mask_of(frame)

    def decide_masks(self, masks: tuple[int, ...]) -> tuple[int, int]:
        """``classify_mask``'s answer for a stack given as the non-zero ``frame_mask`` of its frames, root
        first: how a reader that interned frames decides its stacks without their text."""
        return self._decision_of(masks)

    def classify_offcpu_mask(self, stack: str) -> tuple[int, int]:
        """``classify_mask`` for a blocked (off-CPU) stack: frames that only say how the thread waits
        (kernel frames, OFFCPU_WAIT_FRAMES, waiting tasks' patterns) are passed over, so the first other
        task from the leaf decides; when no frame names one, the on-CPU rule decides (a waiting task)."""
        frames = stack.split(FRAME_SEPARATOR)
        masks = tuple(filter(None, map(self._offcpu_frame_mask_of, frames)))
        if not masks:
            return self._decision_of(tuple(filter(None, map(self._frame_mask_of, frames))))
        return self._decision_of(masks)

    def classify(self, stack: str) -> tuple[int, bool]:
        """(index into ``result_names``, whether other frames matched other tasks)."""
        index, others = self.classify_mask(stack)
        return index, others != 0

    def match(self, stack: str) -> str:
        return self.result_names[self.classify_mask(stack)[0]]

    def decide(self, frames: Sequence[str]) -> tuple[str, int | None]:
        """(task, index of the deciding frame or None) of a stack given as its frames, root first.

        The rule of ``classify_mask`` (same memos, same choice), also naming the leaf-most matching
        frame: the report colours flamegraphs with it, so its colours are the summary's tasks.
        """
        masks = list(map(self._frame_mask_of, frames))
        decider = len(masks) - 1
        while decider >= 0 and not masks[decider]:
            decider -= 1
        if decider < 0:
            return UNMATCHED, None
        return self.result_names[self._decision_of(tuple(filter(None, masks)))[0]], decider

    def decide_offcpu(self, frames: Sequence[str]) -> tuple[str, int | None]:
        """``decide`` by the off-CPU rule of ``classify_offcpu_mask``: the task and its deciding frame."""
        masks = list(map(self._offcpu_frame_mask_of, frames))
        if not any(masks):
            return self.decide(frames)
        decider = len(masks) - 1
        while not masks[decider]:
            decider -= 1
        return self.result_names[self._decision_of(tuple(filter(None, masks)))[0]], decider

    def task_names_of(self, mask: int) -> tuple[str, ...]:
        """Task names of the bits set in ``mask``, in profile order."""
        return tuple(name for index, name in enumerate(self.task_names) if mask >> index & 1)

    def frame_tasks(self, frame: str) -> tuple[str, ...]:
        """Every task with a pattern matching this one frame, in profile order."""
        return self.task_names_of(self._frame_mask_of(frame))

    def matching_patterns(self, frame: str) -> list[tuple[str, Pattern]]:
        """(task, pattern) for every pattern matching ``frame`` (slow; for explanations)."""
        normalized = literal_key(frame)
        found = []
        for task in self.profile.tasks:
            for pattern in task.patterns:
                hit = (
                    re.search(pattern.text, frame) is not None
                    if pattern.regex
                    else literal_key(pattern.text) in normalized
                )
                if hit:
                    found.append((task.name, pattern))
        return found

    def explain(self, stack: str) -> MatchExplanation:
        frames = stack.split(FRAME_SEPARATOR)
        matches = []
        for index in range(len(frames) - 1, -1, -1):
            hits = self.matching_patterns(frames[index])
            if hits:
                tasks = tuple(dict.fromkeys(task for task, _ in hits))
                matches.append(FrameMatch(index, frames[index], tasks, tuple(p.spelled for _, p in hits)))
        if not matches:
            return MatchExplanation(UNMATCHED, None, None, (), (), ())
        decider = matches[0]
        task = decider.tasks[0]
        patterns = tuple(p.spelled for name, p in self.matching_patterns(decider.frame) if name == task)
        other = {name for match in matches[1:] for name in match.tasks} - {task}
        other_tasks = tuple(name for name in self.task_names if name in other)
        return MatchExplanation(task, decider.index, decider.frame, patterns, other_tasks, tuple(matches))

    @property
    def distinct_frames_seen(self) -> int:
        return len(self._frame_masks)


@dataclass(frozen=True)
class MatchResult:
    """Samples per task of one set of stacks (one PID, or anything merged)."""

    task_samples: dict[str, int]  # every profile task in profile order, then "unmatched"; zeros included
    total_samples: int
    multi_task_samples: int  # samples whose stack matched patterns of >1 task in different frames
    task_stacks: Mapping[str, Counter[str]]  # task -> its stacks (drill-down flamegraphs); may be lazy
    task_multi_samples: dict[str, int] = field(default_factory=dict)  # multi-task samples per chosen task
    # (chosen task, task another frame matched) -> samples: what the leaf-first rule decided
    decided_over: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def unmatched(self) -> Counter[str]:
        """Unmatched stack -> samples (built on first use: ``task_stacks``)."""
        stacks = self.task_stacks.get(UNMATCHED)
        return stacks if stacks is not None else Counter()

    def share(self, task: str) -> float | None:
        """Task samples / all samples; None when there are no samples."""
        if self.total_samples <= 0:
            return None
        return self.task_samples[task] / self.total_samples


class TaskStacks(Mapping[str, "Counter[str]"]):
    """Stacks per task (task -> Counter of folded stacks), each Counter built on first access:
    most consumers need only the sample counts, and building a table of ~1 KB stack strings costs
    about as much as matching them. Holds (stack, count) pairs and raw folded lines."""

    def __init__(
        self,
        names: Sequence[str],
        stacks: Sequence[list[str]],
        counts: Sequence[list[int]],
        lines: Sequence[list[str]] | None = None,
        line_counts: Sequence[list[int]] | None = None,
        deferred: Sequence[list[DeferredStacks]] | None = None,
    ) -> None:
        self._names = tuple(names)
        no_lines: list[str] = []
        no_counts: list[int] = []
        self._pending = {
            name: (
                stacks[i],
                counts[i],
                lines[i] if lines is not None else no_lines,
                line_counts[i] if line_counts is not None else no_counts,
            )
            for i, name in enumerate(self._names)
        }
        self._deferred = {name: deferred[i] for i, name in enumerate(self._names)} if deferred is not None else {}
        self._built: dict[str, Counter[str]] = {}

    def __getitem__(self, task: str) -> Counter[str]:
        built = self._built.get(task)
        if built is None:
            stacks, counts, lines, line_counts = self._pending[task]
            if lines:
                stacks = stacks + [line.rstrip("\r\n").rpartition(" ")[0] for line in lines]
                counts = counts + line_counts
            for table, texts, ids, id_counts in self._deferred.pop(task, ()):
                text_of = table.stack_text(texts)
                stacks = stacks + [text_of(stack_id) for stack_id in ids]
                counts = counts + id_counts
            merged = dict(zip(stacks, counts))
            if len(merged) == len(stacks):
                built = Counter(merged)
            else:  # the same stack arrived more than once: add the counts
                built = Counter()
                for stack, count in zip(stacks, counts):
                    built[stack] += count
            self._built[task] = built
            del self._pending[task]
        return built

    def table_parts(self, task: str) -> list[DeferredStacks] | None:
        """A task's stacks as the table ids they came as, without their texts (``ordered_folded``); None
        when some of them came as text or its Counter was built already."""
        pending = self._pending.get(task)
        if pending is None or pending[0] or pending[2]:
            return None
        return list(self._deferred.get(task, ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"TaskStacks({dict(self)!r})"


class StackAccumulator:
    """Assigns stacks to tasks as they arrive and sums them; ``result()`` builds the MatchResult.

    One accumulator can take several inputs (all PIDs of a host, all files given to
    ``profiler match``); a stack seen twice has its counts added.
    """

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        size = len(matcher.result_names)
        self._stacks: list[list[str]] = [[] for _ in range(size)]
        self._counts: list[list[int]] = [[] for _ in range(size)]
        # Folded lines are kept whole: cutting the stack out of a ~1 KB line costs a copy per line.
        self._lines: list[list[str]] = [[] for _ in range(size)]
        self._line_counts: list[list[int]] = [[] for _ in range(size)]
        # Stacks of stack tables stay ids until a task's Counter is asked for (most callers need only counts).
        self._deferred: list[list[DeferredStacks]] = [[] for _ in range(size)]
        self._overrides: dict[tuple[int, int], int] = {}

    @property
    def entries(self) -> int:
        """Stack entries taken so far (lines or pairs with a positive count; repeats included)."""
        deferred = sum(len(ids) for per_task in self._deferred for _table, _texts, ids, _counts in per_task)
        return sum(map(len, self._counts)) + sum(map(len, self._line_counts)) + deferred

    def add_table(self, table: StackTable, first: int | None = None, last: int | None = None) -> None:
        """A stack table's stacks (over intervals ``first..last``; None: open): each distinct frame is
        matched once, then each stack is decided from its frame ids, without building its text."""
        frame_mask_of = self.matcher._frame_mask_of
        decision_of = self.matcher._decision_of
        texts = table.frame_texts()
        mask_of = [frame_mask_of(text) for text in texts].__getitem__
        stacks = table.stacks
        ids: list[list[int]] = [[] for _ in self._deferred]
        counts: list[list[int]] = [[] for _ in self._deferred]
        overrides = self._overrides
        for stack_id, count in table.stack_counts(first, last).items():
            if count <= 0:
                continue
            index, others = decision_of(tuple(filter(None, map(mask_of, stacks[stack_id]))))
            ids[index].append(stack_id)
            counts[index].append(count)
            if others:
                key = (index, others)
                overrides[key] = overrides.get(key, 0) + count
        for index, task_ids in enumerate(ids):
            if task_ids:
                self._deferred[index].append((table, texts, task_ids, counts[index]))

    def add(self, stack: str, count: int) -> None:
        self.add_items(((stack, count),))

    def add_items(self, items: Iterable[tuple[str, int]]) -> None:
        """(stack, count) pairs; non-positive counts are ignored."""
        classify = self.matcher.classify_mask
        stacks = self._stacks
        counts = self._counts
        overrides = self._overrides
        for stack, count in items:
            if count <= 0:
                continue
            index, others = classify(stack)
            stacks[index].append(stack)
            counts[index].append(count)
            if others:
                key = (index, others)
                overrides[key] = overrides.get(key, 0) + count

    def add_folded_lines(self, lines: Iterable[str], source: str = "<input>") -> None:
        """Lines of a folded file (``frame;...;leaf count``); blank lines are skipped and any other
        malformed line raises CaptureFormatError ``source:line: ...`` like profiler.capture.folded."""
        # Matcher.classify_mask inlined on the frames of the raw line: this loop is the matcher's
        # throughput, so it avoids copying the ~1 KB stack out of the line.
        frame_mask_of = self.matcher._frame_mask_of
        decision_of = self.matcher._decision_of
        kept = self._lines
        kept_counts = self._line_counts
        overrides = self._overrides
        for number, raw in enumerate(lines, start=1):
            frames = raw.split(FRAME_SEPARATOR)
            leaf, space, count_text = frames[-1].rpartition(" ")
            count_text = count_text.rstrip("\r\n")
            # isascii: str.isdigit takes '²'; 18 digits stay below folded.MAX_COUNT (the slow path checks more)
            if not (space and count_text.isascii() and count_text.isdigit() and len(count_text) <= 18
                    and (leaf or len(frames) > 1)):
                self._add_unusual_line(raw, number, source)
                continue
            count = int(count_text)
            if count <= 0:
                continue
            frames[-1] = leaf
            index, others = decision_of(tuple(filter(None, map(frame_mask_of, frames))))
            kept[index].append(raw)
            kept_counts[index].append(count)
            if others:
                key = (index, others)
                overrides[key] = overrides.get(key, 0) + count

    def _add_unusual_line(self, raw: str, number: int, source: str) -> None:
        """Blank lines and anything the fast path does not recognise: profiler.capture.folded decides."""
        parsed = parse_source_line(raw, number, source)
        if parsed is not None:
            self.add(*parsed)

    def add_folded_file(self, path: str | Path) -> None:
        with open_text(path, lenient=True) as handle:
            self.add_folded_lines(handle, str(path))

    def result(self) -> MatchResult:
        matcher = self.matcher
        names = matcher.result_names
        samples = [
            sum(c) + sum(lc) + sum(sum(n) for _table, _texts, _ids, n in deferred)
            for c, lc, deferred in zip(self._counts, self._line_counts, self._deferred)
        ]
        multi = [0] * len(names)
        decided_over: Counter[tuple[str, str]] = Counter()
        for (index, others), count in self._overrides.items():
            multi[index] += count
            for other in matcher.task_names_of(others):
                decided_over[names[index], other] += count
        task_stacks = TaskStacks(
            names,
            [list(s) for s in self._stacks],
            [list(c) for c in self._counts],
            [list(s) for s in self._lines],
            [list(c) for c in self._line_counts],
            [list(d) for d in self._deferred],
        )
        return MatchResult(
            task_samples=dict(zip(names, samples)),
            total_samples=sum(samples),
            multi_task_samples=sum(multi),
            task_stacks=task_stacks,
            task_multi_samples=dict(zip(names, multi)),
            decided_over=decided_over,
        )


def match_stacks(matcher: Matcher, counts: Mapping[str, int]) -> MatchResult:
    """Assign every stack of ``counts`` (folded stack -> samples) to its task; non-positive counts are ignored."""
    accumulator = StackAccumulator(matcher)
    accumulator.add_items(counts.items())
    return accumulator.result()


def match_table(matcher: Matcher, table: StackTable) -> MatchResult:
    """Assign every stack of a stack table to its task (frames matched once each, stacks by id)."""
    accumulator = StackAccumulator(matcher)
    accumulator.add_table(table)
    return accumulator.result()


def match_folded_files(matcher: Matcher, paths: Iterable[str | Path]) -> MatchResult:
    """Match folded files as they are read (no intermediate table of all stacks); the files'
    stacks are merged, so a stack in two files counts twice."""
    accumulator = StackAccumulator(matcher)
    for path in paths:
        accumulator.add_folded_file(path)
    return accumulator.result()


def unmatched_folded_lines(results: Iterable[MatchResult]) -> Iterator[str]:
    """``format_folded`` of the unmatched stacks of ``results`` merged, as lines: taken from the stack
    tables' ids a line at a time (``ordered_folded``) when every result came from tables, so a host's
    unmatched stacks are never all texts at once; else the text of their merged Counter."""
    results = list(results)
    parts: list[DeferredStacks] = []
    for result in results:
        stacks = result.task_stacks
        part = stacks.table_parts(UNMATCHED) if isinstance(stacks, TaskStacks) else None
        if part is None:
            unmatched: Counter[str] = Counter()
            for each in results:
                unmatched.update(each.unmatched)
            return iter((format_folded(unmatched),))
        parts.extend(part)
    return ordered_folded(parts)


def offcpu_tasks(matcher: Matcher, entries: Iterable[OffCpuEntry]) -> list[str]:
    """Each off-CPU entry's task, in order: the leaf-first rule that passes over how the thread waits
    (``Matcher.classify_offcpu_mask``)."""
    names = matcher.result_names
    return [names[matcher.classify_offcpu_mask(entry.stack)[0]] for entry in entries]


def match_offcpu(
    matcher: Matcher, entries: Iterable[OffCpuEntry], tasks: Sequence[str] | None = None
) -> dict[str, Counter[str]]:
    """Blocked nanoseconds per task and cause (tasks without blocked time absent); ``tasks``: the entries'
    ``offcpu_tasks`` when the caller has them already."""
    entries = list(entries)
    by_task: dict[str, Counter[str]] = {}
    for entry, task in zip(entries, tasks if tasks is not None else offcpu_tasks(matcher, entries)):
        by_task.setdefault(task, Counter())[entry.cause] += entry.blocked_ns
    return by_task


def match_offcpu_threads(
    matcher: Matcher, entries: Sequence[OffCpuEntry], tasks: Sequence[str] | None = None
) -> dict[str, frozenset[int]] | None:
    """The threads of one PID blocked in each task (by ``match_offcpu``'s rule; ``tasks`` as there), and
    under ALL_TASKS in any: unions of the entries' thread sets, so a thread blocked under several stacks of a
    task counts once. None when an entry's threads are not known (a capture without offcpu_threads.json)."""
    if any(entry.threads is None for entry in entries):
        return None
    by_task: dict[str, set[int]] = {ALL_TASKS: set()}
    for entry, task in zip(entries, tasks if tasks is not None else offcpu_tasks(matcher, entries)):
        by_task.setdefault(task, set()).update(entry.threads or ())
        by_task[ALL_TASKS].update(entry.threads or ())
    return {task: frozenset(threads) for task, threads in by_task.items()}


def _is_pattern_material(frame: str) -> bool:
    # Kernel frames and unresolved placeholders ("[unknown]", "[Missed User Stack]", "[libc.so.6]")
    # are shared by every task, so they make poor patterns.
    return bool(frame) and not frame.endswith(KERNEL_SUFFIX) and not frame.startswith("[")


def leaf_frame(stack: str, user_only: bool = False) -> str:
    """The self frame of a stack; with ``user_only`` the leaf-most frame that is neither a kernel
    frame nor an unresolved placeholder (the plain leaf when there is none)."""
    frames = stack.split(FRAME_SEPARATOR)
    if user_only:
        for frame in reversed(frames):
            if _is_pattern_material(frame):
                return frame
    return frames[-1]


def candidate_patterns(
    unmatched: Mapping[str, int], top: int = 10, user_only: bool = True
) -> list[tuple[str, int]]:
    """The self frames with most samples among unmatched stacks: what to add to the profile.

    With ``user_only`` (default) kernel frames and unresolved placeholders are skipped, so the
    frame is the innermost one a pattern can usefully name. Most samples first, ties by frame
    text, so the list is deterministic.
    """
    self_samples: Counter[str] = Counter()
    for stack, count in unmatched.items():
        if count > 0:
            self_samples[leaf_frame(stack, user_only)] += count
    ordered = sorted(self_samples.items(), key=lambda item: (-item[1], item[0]))
    return ordered[: max(0, top)]
