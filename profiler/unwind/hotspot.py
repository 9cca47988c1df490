"""Java frames named from outside the JVM: a ``Method*`` (interpreted) or an nmethod's scopes (compiled)
turned into ``pkg.Class::method`` through the JVM's layout (vmstructs.py), per generation of its classes.

A Method* seen in a sample may be stale by the time it is read (its class unloaded, the memory reused):
every name is checked against the pool holder's back-pointer (InstanceKlass::_constants == the
ConstantPool) and the constant pool's bounds; what fails is counted unnamed with its cause, never
named from garbage. Names are read when the reader first sees a stack (while the class is alive).

A JVM's window is cut into *generations* by its class unloads, so that an address freed by one class
and reused by the next names each class's samples right: each generation names its Method*s afresh.
The boundary is exact where the JVM maps its hsperfdata file (the default): the BPF walker reads the
counter ``java.cls.unloadedClasses`` from the sampled process at each sample, the count is the sample's
generation, and a Method* is read only while the counter still holds that count (HotSpot counts an
unload before it frees the class's metaspace, and a frame on a CPU keeps its class alive). A stack
first seen after its generation ended is left unnamed (LATE). Without the mapping, the counter is
polled every drain and a generation begins at the poll; a Method* whose name changed before the poll is
ambiguous and counted unnamed (REUSED) in the generation that ends. A JVM without the counter
(-XX:-UsePerfData) rechecks names on every new stack and starts a generation when one changed.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..capture.stackstore import JavaNamesDelta
from ..errors import VMStructsError
from .codecache import FREED, CompiledNamer, compiled_pc
from .hsperf import UNLOADED_CLASSES, HsPerfCounter
from .keylocks import AttachedProcesses
from .vmstructs import ProcessMemory, VMLayout, read_layout

INTERPRETED_MARK = " [i]"  # appended to interpreted frames: compiled and interpreted time stay apart
INLINED_MARK = " [inlined]"  # appended to methods the JIT inlined into a compiled frame
# appended (after INLINED_MARK) to the innermost name of a compiled frame whose pc borrowed a later PcDesc's
# scope (codecache.borrowed_bytes): methods the JIT inlined there are charged to this one
APPROXIMATE_MARK = " [approx]"

# Causes of an interpreted frame left unnamed (SamplerStats.interpreted_unnamed keys).
UNREADABLE = "Method* unreadable (memory gone or unmapped)"
STALE = "stale Method* (class unloaded or memory reused)"
NO_VMSTRUCTS = "JVM's vmStructs not readable"
NO_METHOD_SLOT = "no Method* read (JVM not attached yet, or its method slot unreadable)"
REUSED = "Method* reused for another method in the window (class unloaded)"
LATE = "Method* first seen after its generation ended (class unload noticed first)"
NO_CODE_CACHE = "JVM's code cache not readable from its vmStructs"
TAG_BITS = 3 << 62
MAX_GENERATIONS = 1 << 16  # generations per JVM and window (the stack store's epoch keeps 16 bits of it)
SEEN_STACKS = 1 << 14  # stacks per JVM remembered as named in the current generation (~1 MB at most)


# ---------------------------------------------------------------- Method* -> name


@dataclass
class MethodNamer:
    """Names of one JVM's Method* pointers per generation (see the module's docstring), memoized; a failed
    name keeps its cause. ``names``/``failures`` are the current generation's; past ones are frozen."""

    memory: ProcessMemory
    layout: VMLayout
    names: dict[int, str] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    unloads: HsPerfCounter | None = None  # the JVM's unloaded-classes counter, when it publishes one
    unloads_seen: int | None = None
    compiled: CompiledNamer | None = None  # compiled frames' Method*s (None: the code cache unreadable)
    unloads_address: int | None = None  # where the JVM keeps that counter (read by the BPF walker)
    generation: int = 0  # the current generation's index
    generations: int = 1  # indices handed out so far
    frozen: dict[int, tuple[dict[int, str], dict[int, str]]] = field(default_factory=dict)  # past (names, failures)
    spellings: dict[str, str] = field(default_factory=dict)  # one string per name across generations
    log: list[tuple[int, int, str | None]] | None = None  # (generation, Method*, name or None: withdrawn)
    # compiled frame values whose Method*s all have a name or a failure in the current ``names``/``failures``
    # (the dicts they belong to kept beside them: a new generation's dicts start the set afresh)
    _compiled_read: set[int] = field(default_factory=set, repr=False)
    _compiled_read_for: dict[int, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.compiled is None and self.layout.code_cache is not None:
            self.compiled = CompiledNamer(self.memory, self.layout.code_cache)

    def new_generation(self) -> int:
        """Classes were unloaded: names read from now on are a new generation's (the old ones freeze)."""
        self.frozen[self.generation] = (self.names, self.failures)
        self.names, self.failures = {}, {}
        self.generation, self.generations = self.generations, self.generations + 1
        return self.generation

    def past_generation(self) -> int:
        """A generation that is over before it was seen (samples of an older count arriving late): it names
        nothing."""
        index, self.generations = self.generations, self.generations + 1
        self.frozen[index] = ({}, {})
        return index

    def _frozen(self, generation: int | None) -> tuple[dict[int, str], dict[int, str]] | None:
        if generation is None or generation == self.generation:
            return None
        return self.frozen.get(generation, ({}, {}))

    def code_name(self, pc: int) -> str | None:
        """A plain pc in the JVM's code cache (stubs, adapters) named by its CodeBlob, or None."""
        return self.compiled.blob_name(pc) if self.compiled is not None else None

    def compiled_names(self, value: int, generation: int | None = None) -> tuple[int, list[str], str]:
        """(pc, names innermost first, cause when unnamed) of a compiled frame stored with COMPILED_TAG:
        the methods the JIT inlined at the pc (marked INLINED_MARK), then the compiled method itself; the
        first marked APPROXIMATE_MARK too when the pc borrowed a later PcDesc's scope.
        An inlined method whose Method* cannot be named is left out; an empty list: the frame is unnamed.
        Compile ids are never reused, so the frame's Method*s are the same in every generation; their
        names are the generation's."""
        if self.compiled is None:
            return value & ~TAG_BITS, [], NO_CODE_CACHE
        pc, compile_id = compiled_pc(self.compiled.layout, value)
        chain = self.compiled.methods_of(pc, compile_id)
        if not chain:
            return pc, [], self.compiled.failures.get((pc, compile_id), FREED)
        outer, inlined = self._chain_names(chain, generation)
        if outer is None:
            return pc, [], self.cause(chain[-1], generation, STALE)
        names = [name + INLINED_MARK for name in inlined if name is not None] + [outer]
        if (pc, compile_id) in self.compiled.borrowed:
            names[0] += APPROXIMATE_MARK
        return pc, names, ""

    def borrowed(self, value: int) -> int:
        """Bytes from a compiled frame's pc to the PcDesc whose scope named it (0: its own, exact; or not
        named yet: ``compiled_names`` first)."""
        if self.compiled is None:
            return 0
        return self.compiled.borrowed.get(compiled_pc(self.compiled.layout, value), 0)

    def _chain_names(self, chain: Sequence[int], generation: int | None) -> tuple[str | None, list[str | None]]:
        """The compiled method's name (the chain's last Method*), then its inlined methods' (none without it)."""
        outer = self.name(chain[-1], generation)
        return outer, [] if outer is None else [self.name(method, generation) for method in chain[:-1]]

    def compiled_read(self) -> set[int]:
        """The compiled values ``read_compiled`` has read into the current generation."""
        if self._compiled_read_for is not self.names:
            self._compiled_read, self._compiled_read_for = set(), self.names
        return self._compiled_read

    def read_compiled(self, value: int) -> None:
        """Read the names of a compiled frame's Method*s into the current generation, once per value: a
        second call would read nothing (``name`` keeps both names and failures), so it is skipped. A frame
        whose code could not be found yet is tried again next time."""
        if value in self.compiled_read() or self.compiled is None:
            return
        pc, compile_id = compiled_pc(self.compiled.layout, value)
        chain = self.compiled.methods_of(pc, compile_id)
        if chain:
            self._chain_names(chain, None)
            self._compiled_read.add(value)

    def _symbol(self, address: int) -> str:
        length = self.memory.u16(address + self.layout.offset("Symbol", "_length"))
        body = self.memory.read(address + self.layout.offset("Symbol", "_body"), length) if length else b""
        return body.decode("utf-8", "replace")

    def _read(self, method: int) -> str | None:
        """The name, or None when the pointers do not hold together (stale); OSError when unreadable."""
        layout, memory = self.layout, self.memory
        const_method = memory.u64(method + layout.offset("Method", "_constMethod"))
        pool = memory.u64(const_method + layout.offset("ConstMethod", "_constants"))
        holder = memory.u64(pool + layout.offset("ConstantPool", "_pool_holder"))
        if memory.u64(holder + layout.offset("InstanceKlass", "_constants")) != pool:
            return None
        name_index = memory.u16(const_method + layout.offset("ConstMethod", "_name_index"))
        pool_length = memory.s32(pool + layout.offset("ConstantPool", "_length"))
        if not 0 < name_index < pool_length:
            return None
        method_symbol = memory.u64(pool + layout.sizes["ConstantPool"] + 8 * name_index)
        method_name = self._symbol(method_symbol)
        class_name = self._symbol(memory.u64(holder + layout.offset("Klass", "_name")))
        if not method_name or not class_name or not method_name.isprintable() or not class_name.isprintable():
            return None
        return f"{class_name.replace('/', '.')}::{method_name}"

    def name(self, method: int, generation: int | None = None) -> str | None:
        """``pkg.Class::method`` in ``generation`` (None: the current one), or None (the cause: ``cause``).
        Only the current generation reads the JVM's memory: a past one's classes may be gone."""
        frozen = self._frozen(generation)
        if frozen is not None:
            return frozen[0].get(method)
        if method in self.names:
            return self.names[method]
        if method in self.failures:
            return None
        try:
            name = self._read(method)
        except OSError:
            self.failures[method] = UNREADABLE
            return None
        if name is None:
            self.failures[method] = STALE
            return None
        name = self.names[method] = self.spellings.setdefault(name, name)
        if self.log is not None:
            self.log.append((self.generation, method, name))
        return name

    def withdraw(self, method: int, cause: str) -> None:
        """The current generation's name of ``method`` is not to be trusted after all (``cause``)."""
        del self.names[method]
        self.failures[method] = cause
        if self.log is not None:
            self.log.append((self.generation, method, None))

    def cause(self, method: int, generation: int | None, default: str) -> str:
        """Why ``method`` has no name in ``generation`` (``default`` when it was never looked at)."""
        frozen = self._frozen(generation)
        if frozen is not None:
            return frozen[1].get(method, LATE)
        return self.failures.get(method, default)

    def recheck(self, method: int) -> bool:
        """Read a named Method* again: another name now means its memory was reused within this generation
        (REUSED in it from now on; True). A read that fails proves nothing (the class may just be gone)."""
        known = self.names.get(method)
        if known is None:
            return False
        try:
            current = self._read(method)
        except OSError:
            return False
        if current is not None and current != known:
            self.withdraw(method, REUSED)
            return True
        return False

    def recheck_all(self) -> None:
        for method in list(self.names):
            self.recheck(method)

    def classes_unloaded(self) -> bool:
        """The JVM unloaded classes since the last call (False when it does not say)."""
        if self.unloads is None:
            return False
        count = self.unloads.read()
        changed = count is not None and self.unloads_seen is not None and count != self.unloads_seen
        self.unloads_seen = count if count is not None else self.unloads_seen
        return changed


def open_namer(pid: int) -> MethodNamer:
    """A namer for ``pid``'s JVM; VMStructsError (or OSError for /proc/PID/mem) when there is none."""
    memory = ProcessMemory(pid)
    try:
        namer = MethodNamer(memory, read_layout(pid, memory), unloads=HsPerfCounter.find(pid, UNLOADED_CLASSES))
    except Exception:
        memory.close()
        raise
    namer.classes_unloaded()  # the count at the start
    if namer.unloads is not None:
        namer.unloads_address = namer.unloads.address_in(pid, memory)
    return namer


class JvmNames(AttachedProcesses["MethodNamer"]):
    """The namers of the sampled JVMs, opened by the symbol worker while the window runs.

    ``publish(pid, layout, unloads_address)`` tells the BPF walker where the JVM's interpreter (and its
    unloaded-class counter) is; ``generation_of`` gives each sample its generation (the module's
    docstring); ``note_stack`` names the Method* pointers of each stack new in its generation as soon as
    the reader sees it, so a class unloaded later in the window still has its name (a name read at
    collection only would find freed memory).
    """

    def __init__(self, publish: Callable[[int, VMLayout, int], None]) -> None:
        super().__init__()
        self._publish = publish
        self._starts: dict[int, list[int]] = {}  # polled: monotonic ns each generation after the first began
        self._by_count: dict[int, dict[int, int]] = {}  # exact: unloaded-class count -> generation
        self._count: dict[int, int] = {}  # exact: the count of the current generation
        # pid -> hashes of user stacks named in the current generation (at most SEEN_STACKS: a deep workload's
        # every sample can be a new stack, and naming one again only re-reads what is not named yet)
        self._seen: dict[int, set[int]] = {}
        self.keep_log = False  # log what is named, for the checkpoint journal (take_names)

    def _attach(self, pid: int) -> bool:
        """Read ``pid``'s vmStructs and publish its interpreter (one attach per JVM at a time: the symbol
        worker and the preparations)."""
        namer = self._open(pid, open_namer, VMStructsError)
        if namer is None:
            return False
        self.add(pid, namer)  # before the walker reads its counter: every count it sends has a generation
        try:
            self._publish(pid, namer.layout, namer.unloads_address or 0)
        except Exception as exc:  # noqa: BLE001 - bcc map errors are plain exceptions
            with self._lock:
                del self.namers[pid]
                for table in (self._starts, self._by_count, self._count, self._seen):
                    table.pop(pid, None)
            namer.memory.close()
            self.errors[pid] = f"pid {pid}: publishing the interpreter range failed ({exc})"
            return False
        return True

    def add(self, pid: int, namer: MethodNamer) -> None:
        """Name ``pid``'s frames with ``namer`` from now on (its first generation begins)."""
        with self._lock:
            if self.keep_log:
                namer.log = []
                if namer.compiled is not None:
                    namer.compiled.log, namer.compiled.borrowed_log = [], []
            self.namers[pid] = namer
            self._starts[pid], self._seen[pid] = [], set()
            if namer.unloads_address is not None and namer.unloads_seen is not None:
                self._by_count[pid] = {namer.unloads_seen: namer.generation}
                self._count[pid] = namer.unloads_seen
            self.errors.pop(pid, None)

    def take_names(self) -> dict[int, JavaNamesDelta]:
        """Per JVM, the names learned (and withdrawn) since the last call; empty unless keep_log."""
        taken = {}
        with self._lock:
            for pid, namer in self.namers.items():
                names, namer.log = tuple(namer.log or ()), [] if namer.log is not None else None
                compiled = namer.compiled
                chains: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
                borrowed: tuple[tuple[int, int, int], ...] = ()
                if compiled is not None and compiled.log is not None:
                    chains, compiled.log = tuple(compiled.log), []
                if compiled is not None and compiled.borrowed_log is not None:
                    borrowed, compiled.borrowed_log = tuple(compiled.borrowed_log), []
                code_low = compiled.layout.low if compiled is not None else None
                taken[pid] = JavaNamesDelta(code_low, names, chains, borrowed)
        return taken

    def generation_of(self, pid: int, time_ns: int, unloads: int) -> int:
        """The generation of ``pid``'s JVM a sample belongs to: by the unloaded-class count the walker read
        with it (NO_UNLOADS: by the sample's time and the polls)."""
        namer = self.namers.get(pid)
        if namer is None:
            return 0
        by_count = self._by_count.get(pid)
        if unloads < 0 or by_count is None:
            starts = self._starts.get(pid)
            return bisect.bisect_right(starts, time_ns) if starts else 0
        generation = by_count.get(unloads)
        if generation is None:
            with self._lock:
                if unloads > self._count[pid]:
                    generation = self._advance(pid, namer, unloads)
                elif namer.generations < MAX_GENERATIONS:
                    generation = by_count[unloads] = namer.past_generation()
                else:
                    generation = MAX_GENERATIONS - 1
        return generation

    def _advance(self, pid: int, namer: MethodNamer, count: int) -> int:
        """The JVM's count moved to ``count``: a new current generation (exact mode)."""
        if namer.generations >= MAX_GENERATIONS - 1:  # the last index names nothing: honest, never wrong
            namer.frozen[namer.generation] = (namer.names, namer.failures)
            namer.names, namer.failures = {}, {}
            namer.generation = MAX_GENERATIONS - 1
            namer.frozen[namer.generation] = ({}, {})
        else:
            namer.new_generation()
        self._by_count[pid][count] = namer.generation
        self._count[pid] = count
        self._seen[pid].clear()
        return namer.generation

    def first_in_generation(self, pid: int, generation: int, user: bytes) -> bool:
        """True once per distinct stack and generation (again after SEEN_STACKS other stacks: naming it twice
        reads only what is not named yet), while that generation is the current one (its Method*s can be read
        now); a stack first seen after its generation ended is not named (LATE)."""
        namer, seen = self.namers.get(pid), self._seen.get(pid)
        if namer is None or seen is None or generation != namer.generation or generation in namer.frozen:
            return False
        key = hash(user)
        if key in seen:
            return False
        if len(seen) >= SEEN_STACKS:
            seen.clear()
        seen.add(key)
        return True

    def note_stack(self, pid: int, methods: Sequence[int], compiled: Sequence[int] = ()) -> None:
        """Name the Method* pointers and compiled frames of a new stack now, while their code is alive."""
        namer = self.namers.get(pid)
        if namer is None:
            return
        with self._lock:
            if pid in self._count:
                self._note_exact(pid, namer, methods, compiled)
                return
            if namer.unloads is None and any(namer.recheck(m) for m in methods if m in namer.names):
                self._next_polled(pid, namer, time.monotonic_ns())
            self._read_names(namer, methods, compiled)

    @staticmethod
    def _read_names(namer: MethodNamer, methods: Sequence[int], compiled: Sequence[int]) -> list[int]:
        """Names of the stack's frames read into the current generation; the Method*s read anew (reading only
        adds to ``names``, which keeps insertion order: the new ones are its last entries)."""
        known = len(namer.names)
        done = namer.compiled_read()
        for value in compiled:
            if value not in done:
                namer.read_compiled(value)
        for method in methods:
            if method not in namer.names:
                namer.name(method)
        return list(itertools.islice(reversed(namer.names), len(namer.names) - known))

    @staticmethod
    def _anything_to_read(namer: MethodNamer, methods: Sequence[int], compiled: Sequence[int]) -> bool:
        """Whether ``_read_names`` would read anything (a frame not named nor failed in this generation)."""
        done = namer.compiled_read()
        names, failures = namer.names, namer.failures
        return any(value not in done for value in compiled) or any(
            method not in names and method not in failures for method in methods
        )

    def _note_exact(self, pid: int, namer: MethodNamer, methods: Sequence[int], compiled: Sequence[int]) -> None:
        """Read names only while the JVM's count is the current generation's, before and after the reads:
        an unload in between may have freed (and a load reused) what was read; those names are dropped."""
        assert namer.unloads is not None
        if not self._anything_to_read(namer, methods, compiled):
            return  # nothing is read, so no unload can spoil it: the two counter reads (syscalls) are saved
        count = namer.unloads.read()
        if count != self._count[pid]:
            if count is not None and count > self._count[pid]:
                self._advance(pid, namer, count)
            return
        fresh = self._read_names(namer, methods, compiled)
        if namer.unloads.read() != count:
            for method in fresh:
                namer.withdraw(method, LATE)

    def _next_polled(self, pid: int, namer: MethodNamer, now_ns: int) -> None:
        if namer.generations >= MAX_GENERATIONS:
            return  # the last generation stays open: a name that changes in it is REUSED, as ever
        namer.new_generation()
        self._starts[pid].append(now_ns)
        self._seen[pid].clear()

    def poll_unloads(self) -> None:
        """Each drain: a JVM whose unloads are not counted per sample starts a new generation when it
        unloaded classes; a name that changed before (unloaded and reused since the last poll) is REUSED
        in the one that ends."""
        now = time.monotonic_ns()
        with self._lock:
            for pid, namer in self.namers.items():
                if pid not in self._count and namer.classes_unloaded():
                    namer.recheck_all()
                    self._next_polled(pid, namer, now)

    def final_check(self, pid: int) -> None:
        """At collection, while the process may still run: every name of the current generation read once
        more (polled generations only: an exact one has no name read after its count moved)."""
        namer = self.namers.get(pid)
        if namer is None:
            return
        with self._lock:
            if pid not in self._count:
                namer.recheck_all()
                return
            count = namer.unloads.read() if namer.unloads is not None else None
            if count != self._count[pid]:  # unloaded since the last sample, or gone: no lazy read from now on
                self._advance(pid, namer, count if count is not None and count > self._count[pid] else -1)

    def unnamed_cause(self, _pid: int) -> str:
        """The cause counted for interpreted frames of a JVM that has no namer (errors[pid] says more)."""
        return NO_VMSTRUCTS

    def close(self) -> None:
        with self._lock:
            for namer in self.namers.values():
                namer.memory.close()
                if namer.unloads is not None:
                    namer.unloads.close()
            self.namers.clear()
            for table in (self._starts, self._by_count, self._count, self._seen):
                table.clear()
