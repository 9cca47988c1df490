"""Addresses to frame names: native code by our own ELF reader (profiler/symbols/procsyms.py: in batches during the
window, profiler/symbols/batches.py, and after it for what they left), JIT code through perf maps after the window,
the kernel's through bcc's /proc/kallsyms cache.

A frame and its naming rules are in frames.py; here, the kernel's symbols and the StackFolder that turns
a sampled stack's raw values into named frames and folded lines or stack-table rows.

``java_unwalkable`` heuristic: a user stack is counted as unwalkable when it holds at least one frame in
JIT code (perf-map hit, or in a JVM an address in no file-backed mapping) and none of its three outermost frames
is a thread or process start frame (start_thread, clone/clone3, _start, __libc_start_main, HotSpot's
thread_native_entry...). Without -XX:+PreserveFramePointer, JIT code uses the frame pointer register for
data, so the kernel's frame-pointer walk stops (or wanders into garbage) at the first JIT frame and never
reaches the thread's start; with it, Java stacks reach start_thread. The outermost three, not just the
root, because glibc's start_thread has no frame pointer and the walk may add a garbage frame after it.
Stacks cut by the depth limit are counted as truncated instead, never as unwalkable.
"""

from __future__ import annotations

import ctypes as ct
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, lshift
from typing import TYPE_CHECKING, Any, Protocol

from ..capture.folded import sanitize_frame
from ..capture.stackstore import (
    CUT_CFI,
    CUT_DEPTH,
    CUT_DEPTH_LEAF,
    CUT_HOTSPOT,
    CUT_JAVA,
    CUT_NATIVE,
    GAP_TAG,
    PYTHON_MASK,
    PYTHON_TAG,
    TAG_MASK,
    WALK_ENDS,
    StackKey,
    StackStore,
    StoredStack,
    split_epoch,
    stack_bytes,
)
from ..capture.stacktable import KERNEL, LOST, THREAD, StackTable, StackTableBuilder
from ..unwind.codecache import COMPILED_TAG
from ..unwind.hotspot import APPROXIMATE_MARK, INTERPRETED_MARK, NO_METHOD_SLOT, NO_VMSTRUCTS
from .frames import (
    INTERPRETER,
    LOST_KERNEL,
    LOST_USER,
    ROOT_WINDOW,
    UNKNOWN,
    Frame,
    fold_stack,
    java_frame_kinds,
    reaches_thread_start,
)
from .perfmap import PerfMapLike
from .stackhealth import StackHealth, UserStack

if TYPE_CHECKING:
    from .perfmap_history import PerfMapHistory


def is_java_unwalkable(user_frames_leaf_first: Sequence[Frame], truncated: bool, java_process: bool = True) -> bool:
    """See the module docstring: Java code on the stack, yet the walk never reached a thread start.

    Outside a JVM nothing is Java: garbage frames of code built without frame pointers land in
    anonymous memory too, and must not count.
    """
    if not java_process or truncated or not any(frame.in_jit_code for frame in user_frames_leaf_first):
        return False
    return not reaches_thread_start(user_frames_leaf_first)


# ---------------------------------------------------------------- symbol caches (I/O)


def _bcc() -> Any:
    from bcc import libbcc  # heavy: imported only where symbols are needed

    return libbcc


class KernelSymbols:
    """bcc's /proc/kallsyms cache; one per sampler."""

    def __init__(self) -> None:
        libbcc = _bcc()
        self._lib = libbcc.lib
        self._sym_type = libbcc.bcc_symbol
        self._cache: int | None = self._lib.bcc_symcache_new(-1, None)
        self._memo: dict[int, str] = {}
        self._reopen = False  # name_all closed the table: a later address not named opens it again

    def name_all(self, stacks: Iterable[bytes | tuple[bytes, ...]]) -> None:
        """Name every address of these kernel stacks now, then free bcc's table of /proc/kallsyms (all the
        kernel's symbols, ~18 MB with 120 k of them): only the names used stay, so the table is not held
        while user stacks are named (the post-run step's peak)."""
        for stack in stacks:
            for addr in raw_addresses(stack_bytes(stack)):
                self.resolve(addr)
        self.release_table()

    def release_table(self) -> None:
        """Free bcc's table and keep the names resolved so far; an address not named yet opens it again."""
        self.close()
        self._reopen = True

    def resolve(self, addr: int) -> str:
        name = self._memo.get(addr)
        if name is None:
            if self._cache is None and self._reopen:
                self._cache, self._reopen = self._lib.bcc_symcache_new(-1, None), False
            sym = self._sym_type()
            if self._cache is not None and self._lib.bcc_symcache_resolve(self._cache, addr, ct.byref(sym)) == 0:
                raw = ct.cast(sym.name, ct.c_char_p).value
                name = raw.decode("utf-8", "replace") if raw else UNKNOWN
            else:
                name = UNKNOWN
            self._memo[addr] = name
        return name

    def close(self) -> None:
        if self._cache is not None:
            self._lib.bcc_free_symcache(ct.c_void_p(self._cache), -1)
            self._cache = None


WALK_CFI_FAIL = WALK_ENDS.index("CFI step failed")
WALK_HOTSPOT_FAIL = WALK_ENDS.index("HotSpot step failed")


def gap_frame(frames_cut: int) -> str:
    """The frame standing for the middle of a stack too deep to keep whole."""
    return f"[… {frames_cut} frames cut …]"


@dataclass(frozen=True, slots=True)
class _ValueNames:
    """What one stored user value (a pc, a tagged Method*, a compiled frame, a gap) names in an epoch: its
    frames, leaf first (a compiled frame's inlined methods), and what it adds to its stack's counts
    (VALUE_COUNTS packed by ``pack_counts``: a stack's counts are one sum). Equal records name the same
    frames the same way."""

    frames: tuple[Frame, ...]
    counts: int  # a gap value's frames cut from the middle of the stack are its last field
    unnamed: str | None = None  # why the interpreter frame stays unnamed
    compiled_unnamed: str | None = None  # why the compiled frame stays unnamed


VALUE_COUNTS = (
    "interpreted", "interpreted_named", "compiled", "compiled_named", "compiled_perf_map",
    "compiled_approximate", "approximate_bytes",
    "java", "unresolved", "interpreter_frames", "compiled_methods", "with_cause", "gap",
)  # fmt: skip  # with_cause: a value with a cause it stays unnamed; gap last: its sum is read unmasked
_COUNT_BITS = 32  # a field of a packed sum: a stack's frames (at most a few thousand) never carry into the next
_COUNT_SHIFTS = tuple(_COUNT_BITS * index for index in range(len(VALUE_COUNTS)))


def pack_counts(counts: Sequence[int]) -> int:
    """Small counts in one int, so that adding packed ints adds each count."""
    return sum(map(lshift, counts, _COUNT_SHIFTS))  # no generator: called once per value and epoch


def unpack_counts(packed: int) -> list[int]:
    """The counts of a packed sum; the last field is unbounded (no count after it to carry into)."""
    mask = (1 << _COUNT_BITS) - 1
    return [(packed >> shift) & mask for shift in _COUNT_SHIFTS[:-1]] + [packed >> _COUNT_SHIFTS[-1]]


def cut_cause(frames: Sequence[Frame], gap: int, truncated: bool, walk_end: int) -> str | None:
    """Why a walk did not reach the thread's start frame, or None when it did (or holds nothing)."""
    if gap:
        return CUT_DEPTH
    if truncated:
        return CUT_DEPTH_LEAF
    if walk_end == WALK_CFI_FAIL:
        return CUT_CFI
    if walk_end == WALK_HOTSPOT_FAIL:
        return CUT_HOTSPOT
    if not frames or reaches_thread_start(frames):
        return None
    return CUT_JAVA if frames[-1].in_jit_code else CUT_NATIVE


class SymbolResolver(Protocol):
    """What StackFolder needs of a process's symbols: ProcessSymbols (procsyms.py, live process) or
    OfflineSymbols (profiler/symbols/elfsyms.py: saved maps and ELF files, process gone)."""

    def resolve(self, addr: int) -> Frame: ...
    def set_perf_map(self, perf_map: PerfMapLike | None) -> None: ...
    def close(self) -> None: ...


class KernelResolver(Protocol):
    def resolve(self, addr: int) -> str: ...


class JavaNamer(Protocol):
    """Names of a JVM's Java frames: a live JVM's (unwind.hotspot.MethodNamer) or a journal's
    (unwind.recorded.RecordedNames), per generation of names."""

    def name(self, method: int, generation: int | None = None) -> str | None: ...
    def cause(self, method: int, generation: int | None, default: str) -> str: ...
    def code_name(self, pc: int) -> str | None: ...
    def compiled_names(self, value: int, generation: int | None = None) -> tuple[int, list[str], str]: ...
    def borrowed(self, value: int) -> int: ...


def _root_frames(records: Sequence[_ValueNames]) -> tuple[Frame, ...]:
    """The outermost ROOT_WINDOW frames (or all, when fewer) of a stack of value records, leaf first."""
    frames: tuple[Frame, ...] = ()
    for record in reversed(records):
        frames = record.frames + frames
        if len(frames) >= ROOT_WINDOW:
            break
    return frames


class PythonNamer(Protocol):
    """Names of a CPython process's frames (unwind.cpython.PyNamer)."""

    def name(self, value: int) -> str | None: ...


PYTHON_UNNAMED = "[python]"  # a CPython frame whose code object could not be read


class StackFolder:
    """Raw stacks of one process to folded lines, counting what the health panel reports.

    Each distinct stored value (pc, Method*, compiled frame) is named once per epoch in which it occurs, and
    a distinct raw stack is named once: ``use_perf_map`` and ``use_generation`` begin a new epoch (the JIT
    map, the JVM's generation of method names), in which a stack seen before is named again only when one
    of its values names something else than when it was last named (code freed and its address reused,
    a method's name changed).
    """

    def __init__(
        self,
        symbols: SymbolResolver,
        kernel: KernelResolver,
        depth: int,
        java_process: bool,
        kernel_depth: int = 127,
        walker: bool = False,
        methods: JavaNamer | None = None,
        no_methods_cause: str = NO_METHOD_SLOT,
        native_cause: Callable[[int], str | None] | None = None,
        python: PythonNamer | None = None,
    ) -> None:
        self.symbols = symbols
        self.kernel = kernel
        self.depth = depth
        self.kernel_depth = min(kernel_depth, depth)
        self.java_process = java_process
        self.walker = walker  # stacks of our walker: tagged frames, truncation by gap frame
        self.methods = methods
        self.python = python  # names CPython frames spliced into the walker's stacks
        self.generation: int | None = None  # of the JVM's Method* names (None: its current one)
        self.no_methods_cause = no_methods_cause  # why interpreter frames stay unnamed when methods is None
        self.native_cause = native_cause  # outermost pc -> a CUT_* cause finer than CUT_NATIVE, or None
        self._user: dict[tuple[StoredStack, int], UserStack] = {}
        # epochs: a serial per use_perf_map/use_generation; the values named in the current one; per serial,
        # the values that named something else in it than before (a stack named before one of them is stale)
        self._serial = 0
        self._checked: set[int] = set()
        self._fixed: set[int] = set()  # values no perf map or generation renames (gap, native): checked for good
        self._checked_chunks: set[bytes] = set()  # stored chunks whose every value is in _checked
        self._changes: list[set[int]] = [set()]
        self._values: dict[int, _ValueNames] = {}  # bounded by the distinct values of the process's stacks
        self._value_ids: dict[int, tuple[int, ...]] = {}  # a value's frame ids in _ids_table, root first
        self.health = StackHealth()  # the health panel's counts (SamplerStats fields), per sample
        self._kernel: dict[StoredStack, list[str] | None] = {}
        # stack_id: the table frames and stacks are interned into, the frame id of each Frame (bounded by the
        # distinct frames) and of each kernel stack (a named user stack keeps only its ids: UserStack.ids)
        self._ids_table: StackTableBuilder | None = None
        self._kernel_ids: dict[StoredStack, tuple[int, ...]] = {}
        self._last_values: tuple[StoredStack | None, tuple[int, ...]] = (None, ())  # _user_stack's, for _user_ids
        self._frame_id_of: dict[Frame, int] = {}
    @property
    def stats_fields(self) -> dict[str, object]:
        """The SamplerStats fields counted so far."""
        return self.health.fields

    def use_perf_map(self, perf_map: PerfMapLike | None) -> None:
        self.symbols.set_perf_map(perf_map)
        self._new_epoch()

    def use_generation(self, generation: int) -> None:
        """Name Java methods as the JVM's ``generation`` of names does (profiler/unwind/hotspot.py)."""
        if generation != self.generation:
            self.generation = generation
            self._new_epoch()

    def forget_names(self) -> None:
        """Drop what was named (stacks, values, their ids): kept only while a table is being built."""
        for names in (self._user, self._values, self._value_ids, self._frame_id_of, self._kernel_ids):
            names.clear()
        self._checked, self._fixed, self._checked_chunks = set(), set(), set()
        self._changes = [set() for _ in self._changes]
        self._last_values = (None, ())

    def _new_epoch(self) -> None:
        """Every value is named again when it next occurs; the stacks keep their names until one of their
        values changes (StackFolder._user_stack)."""
        self._serial += 1
        self._changes.append(set())
        self._checked = set(self._fixed)
        self._checked_chunks = set()

    def _name_value(self, value: int) -> _ValueNames:
        """What ``value`` names now (the folder's perf map and generation)."""
        scratch = UserStack()
        unnamed: Counter[str] = Counter()
        if self.walker:
            frames, gap = self._walker_frame(value, scratch, unnamed)
        else:
            frames, gap = [self.symbols.resolve(value)], 0
        compiled_unnamed = next(iter(scratch.compiled_unnamed or ()), None)
        unnamed_cause = next(iter(unnamed), None)
        counts = pack_counts((
            scratch.interpreted, scratch.interpreted_named, scratch.compiled, scratch.compiled_named,
            scratch.compiled_perf_map, scratch.compiled_approximate, scratch.approximate_bytes,
            *java_frame_kinds(frames),
            int(unnamed_cause is not None or compiled_unnamed is not None), gap,
        ))  # fmt: skip
        return _ValueNames(tuple(frames), counts, unnamed_cause, compiled_unnamed)

    def _check_values(self, values: Sequence[int]) -> None:
        """Name the values not yet named in this epoch; note those that name something else than before."""
        checked = self._checked
        if all(map(checked.__contains__, values)):  # the usual case: other stacks of the epoch had them
            return
        unchecked = set(values).difference(checked)
        changes, known = self._changes[-1], self._values
        for value in unchecked:
            named = self._name_value(value)
            old = known.get(value)
            if old is None:
                known[value] = named
                if self._never_renamed(value, named):
                    self._fixed.add(value)
            elif old != named:
                known[value] = named
                changes.add(value)
                self._value_ids.pop(value, None)
        self._checked |= unchecked

    def _never_renamed(self, value: int, named: _ValueNames) -> bool:
        """``value`` names the same in every epoch: a gap, or a pc whose every frame is a symbol of a file
        (FrameMemo.resolve_native); a Method*, a compiled frame or code named by a perf map can change."""
        if self.walker:
            tag = value & TAG_MASK
            if value & PYTHON_MASK == PYTHON_TAG:
                return False
            if tag == GAP_TAG:
                return True
            if tag:
                return False
        return all(frame.kind == "native" and frame.module and frame.name != INTERPRETER for frame in named.frames)

    def _unchanged_since(self, serial: int, values: Sequence[int]) -> bool:
        """No value of ``values`` has named something else since the epoch ``serial``."""
        return all(not changed or changed.isdisjoint(values) for changed in self._changes[serial + 1 :])

    def _walker_frame(self, value: int, stack: UserStack, unnamed: Counter[str]) -> tuple[list[Frame], int]:
        """(frames, frames cut) of one stored value of the walker: pc, tagged Method*, compiled frame
        (with its inlined methods), or gap."""
        tag = value & TAG_MASK
        if value & PYTHON_MASK == PYTHON_TAG:
            name = self.python.name(value) if self.python is not None else None
            return [Frame(name or PYTHON_UNNAMED, "python")], 0
        if tag == GAP_TAG:
            cut = value & ~TAG_MASK
            return [Frame(gap_frame(cut), "gap")], cut
        if tag == COMPILED_TAG:
            return self._compiled_frames(value, stack), 0
        frame, cut = self._walker_value(value, tag, stack, unnamed)
        return [frame], cut

    def _walker_value(self, value: int, tag: int, stack: UserStack, unnamed: Counter[str]) -> tuple[Frame, int]:
        """A pc or an interpreted frame's tagged Method*."""
        if tag:
            stack.interpreted += 1
            method = value & ~TAG_MASK
            name = self.methods.name(method, self.generation) if self.methods is not None else None
            if name is not None:
                stack.interpreted_named += 1
                return Frame(name + INTERPRETED_MARK, "jit"), 0
            cause = (
                self.methods.cause(method, self.generation, NO_METHOD_SLOT) if self.methods else self.no_methods_cause
            )
            unnamed[cause] += 1
            return Frame(INTERPRETER, "jit"), 0
        frame = self.symbols.resolve(value)
        if frame.kind == "anon" and self.methods is not None:
            stub = self.methods.code_name(value)  # no perf map: the JVM's own name of its stub
            if stub is not None:
                frame = Frame(stub, "jit")
        if frame.name == INTERPRETER:  # the walker read no Method* for it
            stack.interpreted += 1
            unnamed[self.no_methods_cause if self.methods is None else NO_METHOD_SLOT] += 1
        return frame, 0

    @staticmethod
    def _count_unnamed(stack: UserStack, cause: str) -> None:
        if stack.compiled_unnamed is None:
            stack.compiled_unnamed = {}
        stack.compiled_unnamed[cause] = stack.compiled_unnamed.get(cause, 0) + 1

    def _compiled_frames(self, value: int, stack: UserStack) -> list[Frame]:
        """A compiled frame, innermost first: the methods inlined at its pc and the compiled method, named
        from the JVM's nmethod (vmStructs), else the compiled method by the perf map at its pc."""
        stack.compiled += 1
        if self.methods is None:
            self._count_unnamed(stack, NO_VMSTRUCTS)
            return [Frame(UNKNOWN, "anon")]
        pc, names, cause = self.methods.compiled_names(value, self.generation)
        if names:
            stack.compiled_named += 1
            if names[0].endswith(APPROXIMATE_MARK):
                stack.compiled_approximate += 1
                stack.approximate_bytes += self.methods.borrowed(value)
            return [Frame(name, "jit") for name in names]
        frame = self.symbols.resolve(pc)
        if frame.kind == "jit":
            stack.compiled_perf_map += 1
            return [frame]
        self._count_unnamed(stack, cause)
        return [Frame(UNKNOWN, "anon")]

    def _user_stack(self, raw: StoredStack, walk_end: int) -> UserStack:
        """The stack named in this epoch: as named before when none of its values names something else now."""
        known = self._user.get((raw, walk_end))
        if known is not None and (known.lost or known.named_in == self._serial):
            return known
        if isinstance(raw, int):
            stack = self._user[(raw, walk_end)] = UserStack(lost=True)
            return stack
        values = raw_addresses(stack_bytes(raw))
        self._last_values = (raw, values)
        chunks = (raw,) if isinstance(raw, bytes) else raw
        if not self._checked_chunks.issuperset(chunks):  # stacks share chunks (their roots): looked at once
            self._check_values(values)
            if sum(map(len, chunks)) == 8 * len(values):  # no zero cut the stack short: all its chunks named
                self._checked_chunks.update(chunks)
        if known is not None and self._unchanged_since(known.named_in, values):
            known.named_in = self._serial
            return known
        stack = self._user[(raw, walk_end)] = self._resolve_user(values, walk_end)
        return stack

    def _resolve_user(self, values: tuple[int, ...], walk_end: int) -> UserStack:
        """A stack of values all named in this epoch (``_check_values``)."""
        record = self._values.__getitem__
        sums = unpack_counts(sum(map(attrgetter("counts"), map(record, values))))  # one pass over the records
        interpreted, interpreted_named, compiled, compiled_named, compiled_perf_map = sums[:5]
        compiled_approximate, approximate_bytes = sums[5:7]
        java, unresolved, interpreter_frames, compiled_methods, with_cause, gap = sums[7:]
        # all that reaches_thread_start and cut_cause look at (each value names one frame or more)
        root_side = _root_frames(list(map(record, values[-ROOT_WINDOW:])))
        stack = UserStack(named_in=self._serial, interpreted=interpreted)
        stack.interpreted_named, stack.compiled, stack.compiled_named = interpreted_named, compiled, compiled_named
        stack.compiled_perf_map = compiled_perf_map
        stack.compiled_approximate, stack.approximate_bytes = compiled_approximate, approximate_bytes
        if self.walker:
            stack.unnamed, stack.compiled_unnamed = {}, None
            if with_cause:  # the causes' Counters only for the stacks with a value left unnamed
                records = list(map(record, values))
                unnamed, compiled_unnamed = attrgetter("unnamed"), attrgetter("compiled_unnamed")
                stack.unnamed = dict(Counter(map(unnamed, filter(unnamed, records))))
                causes = Counter(map(compiled_unnamed, filter(compiled_unnamed, records)))
                stack.compiled_unnamed = dict(causes) if causes else None
            truncated = gap > 0
        else:
            truncated = len(values) >= self.depth
        stack.truncated = truncated
        stack.unwalkable = self.java_process and not truncated and java > 0 and not reaches_thread_start(root_side)
        stack.interpreted_only = interpreter_frames > 0 and compiled_methods == 0
        # outside a JVM nothing is Java: a frame-pointer walk's garbage frames land in anonymous memory too
        stack.java_frames = java if self.java_process else 0
        stack.unresolved = unresolved if self.java_process else 0
        stack.cut = cut_cause(root_side, gap, truncated and not self.walker, walk_end)
        if stack.cut == CUT_NATIVE and self.native_cause is not None and values:
            stack.cut = self.native_cause(values[-1]) or CUT_NATIVE
        return stack

    def _kernel_stack(self, raw: StoredStack) -> tuple[list[str] | None, bool]:
        if isinstance(raw, int):
            return ([] if raw == STACK_NONE else None), False
        names = self._kernel.get(raw)
        flat = stack_bytes(raw)
        if names is None:
            names = self._kernel[raw] = [self.kernel.resolve(a) for a in raw_addresses(flat)]
        return names, len(flat) // 8 >= self.kernel_depth

    def fold(self, comm: bytes, user_raw: StoredStack, kernel_raw: StoredStack, count: int, walk_end: int = 0) -> str:
        user = self._user_stack(user_raw, walk_end)
        kernel_names, kernel_truncated = self._kernel_stack(kernel_raw)
        self.health.add(user, kernel_names, kernel_truncated, count)
        names = None
        if not user.lost:  # its values are named in this epoch (_user_stack)
            values = raw_addresses(stack_bytes(user_raw))  # type: ignore[arg-type]
            names = [frame.name for value in values for frame in self._values[value].frames]
        return fold_stack(comm.decode("utf-8", "replace"), names, kernel_names)

    def walked_names(self, values: Sequence[int]) -> list[str]:
        """The frame names of one stack of the walker's values (leaf first; a compiled frame gives its inlined
        methods too), named by this folder's symbols, perf map and generation: the off-CPU stacks' naming."""
        self._check_values(values)
        return [frame.name for value in values for frame in self._values[value].frames]

    def fold_ids_again(self, key: StackKey, count: int) -> tuple[UserStack, list[str] | None]:
        """Count ``count`` more samples of a stack already folded; its user part and kernel names."""
        user = self._user_stack(key.user, key.walk_end)
        kernel_names, kernel_truncated = self._kernel_stack(key.kernel)
        self.health.add(user, kernel_names, kernel_truncated, count)
        return user, kernel_names

    def _frame_ids(self, table: StackTableBuilder, frames_leaf_first: Sequence[Frame]) -> tuple[int, ...]:
        """Frame ids, root first. Memoized by the Frame's value: one entry per distinct frame (a compiled
        frame's Frames are new objects in every stack)."""
        known = self._frame_id_of
        ids = []
        for frame in reversed(frames_leaf_first):
            frame_id = known.get(frame)
            if frame_id is None:
                frame_id = known[frame] = table.frame(sanitize_frame(frame.name), frame.kind, frame.module)
            ids.append(frame_id)
        return tuple(ids)

    def _user_ids(self, table: StackTableBuilder, raw: bytes | tuple[bytes, ...]) -> tuple[int, ...]:
        """The frame ids of a user stack whose values are named in this epoch, root first: each value's ids
        taken once from its frames (in the stack's order, so frames get the ids a frame-by-frame pass gives)."""
        last_raw, values = self._last_values
        root_first = (values if last_raw is raw else raw_addresses(stack_bytes(raw)))[::-1]
        ids_of = self._value_ids
        found = list(map(ids_of.get, root_first))
        if None in found:
            for index, value in enumerate(root_first):
                if found[index] is None:
                    ids = ids_of.get(value)
                    if ids is None:
                        ids = ids_of[value] = self._frame_ids(table, self._values[value].frames)
                    found[index] = ids
        return tuple(chain.from_iterable(found))  # type: ignore[arg-type]

    def stack_id(self, table: StackTableBuilder, key: StackKey, count: int) -> int:
        """``fold`` into ``table``: the id of the stack of the stack's frames, root first. Each named user
        stack and kernel stack is interned once (not once per interval, context or perf-map epoch it appears
        in). A user stack keeps only where its frame ids are in the table (not its Frames and names: a
        distinct stack costs the table's tuple and no more), so ``fold`` must not be asked for it afterwards."""
        if table is not self._ids_table:
            self._ids_table = table
            self.forget_names()  # their ids are another table's
        user, kernel_names = self.fold_ids_again(key, count)
        root = table.frame(sanitize_frame(key.comm.decode("utf-8", "replace")) or "[unnamed]", THREAD)
        if user.ids is not None:
            first, frames = user.ids
            user_ids = table.stack_frames(first)[1 : 1 + frames]
        elif user.lost:
            user_ids = (table.frame(LOST_USER, LOST),)
        else:
            user_ids = self._user_ids(table, key.user)  # type: ignore[arg-type]
        kernel_ids = self._kernel_ids.get(key.kernel)
        if kernel_ids is None:
            if kernel_names is None:
                kernel_ids = (table.frame(LOST_KERNEL, LOST),)
            else:
                kernel_ids = tuple(table.frame(sanitize_frame(name), KERNEL) for name in reversed(kernel_names))
            self._kernel_ids[key.kernel] = kernel_ids
        stack_id = table.stack((root, *user_ids, *kernel_ids))
        if user.ids is None:
            user.ids = (stack_id, len(user_ids))
        return stack_id


def tabulate_store(
    store: StackStore,
    pid: int,
    folder: StackFolder,
    history: PerfMapHistory | None,
    last: int | None,
    table: StackTableBuilder | None = None,
) -> StackTable:
    """One process's stored samples as a stack table: each frame and stack interned once as it is named,
    no folded text. Each epoch is named by its perf-map version from ``history`` and its generation of Java
    method names (the folder's namer); intervals past ``last``
    count in it."""
    table = table if table is not None else StackTableBuilder()
    for epoch in store.epochs(pid):
        perf_map_epoch, generation = split_epoch(epoch)
        if history is not None:
            folder.use_perf_map(history.map_for(perf_map_epoch))
        folder.use_generation(generation)
        stack_ids: dict[StackKey, int] = {}  # within one epoch a stored stack always names the same frames
        for key, interval, context, count in store.context_entries(pid, epoch):
            stack_id = stack_ids.get(key)
            if stack_id is None:
                stack_id = stack_ids[key] = folder.stack_id(table, key, count)
            else:
                folder.fold_ids_again(key, count)
            table.add(interval if last is None else min(interval, last), stack_id, context, count)
    folder.forget_names()  # before the table is built: the folder's memos do not stack on its arrays
    return table.build()


STACK_NONE = -1  # no kernel stack asked for (user-mode sample); see sampling/stack_ringbuf.c


def raw_addresses(raw: bytes) -> tuple[int, ...]:
    """Addresses of a raw stack (8-byte little-endian each), leaf first, up to the first zero."""
    count = len(raw) // 8
    values = struct.unpack(f"<{count}Q", raw[: count * 8])
    return values[: values.index(0)] if 0 in values else values
