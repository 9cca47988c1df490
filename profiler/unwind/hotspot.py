"""Interpreted Java frames named from outside the JVM: HotSpot's own vmStructs tables read from /proc/PID/mem.

libjvm.so exports ``gHotSpotVMStructs``, ``gHotSpotVMTypes`` and the int/long constant tables (with the
offsets and strides of their entries) for the serviceability agent. From them this module learns, for
the running JVM, where its template interpreter's code is (``AbstractInterpreter::_code``, a StubQueue)
and how to get from a ``Method*`` to ``pkg.Class::method`` (Method → ConstMethod → ConstantPool →
InstanceKlass → Symbol). Nothing is hard-coded for one JDK except the x86_64 interpreter frame's method
slot, used only when the JVM does not export ``frame::interpreter_frame_method_offset`` (JDK 8..21 keep
the Method* three words below the frame pointer; OpenTelemetry's and async-profiler's unwinders rely on
the same layout).

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
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..capture.stackstore import JavaNamesDelta
from ..errors import VMStructsError
from ..files import procread, safeio
from .codecache import (
    CODE_FIELDS,
    FREED,
    KIND_CONSTANTS,
    CodeCacheLayout,
    CompiledNamer,
    compiled_pc,
    read_code_cache,
)

INTERPRETED_MARK = " [i]"  # appended to interpreted frames: compiled and interpreted time stay apart
INLINED_MARK = " [inlined]"  # appended to methods the JIT inlined into a compiled frame
X86_64_METHOD_SLOT = -3  # frame::interpreter_frame_method_offset (words from fp), JDK 8+ on x86_64
X86_64_SENDER_SP_SLOT = -1  # frame::interpreter_frame_sender_sp_offset: the caller's sp (exported by 17 and 25)
_METHOD_SLOT = "frame::interpreter_frame_method_offset"
_SENDER_SP_SLOT = "frame::interpreter_frame_sender_sp_offset"
_MAX_INTERPRETER = 64 << 20  # the template interpreter is a few hundred KiB

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

_WANTED_FIELDS = {
    ("Method", "_constMethod"),
    ("ConstMethod", "_constants"),
    ("ConstMethod", "_name_index"),
    ("ConstantPool", "_pool_holder"),
    ("ConstantPool", "_length"),
    ("InstanceKlass", "_constants"),
    ("Klass", "_name"),
    ("Symbol", "_length"),
    ("Symbol", "_body"),
    ("AbstractInterpreter", "_code"),
    ("StubQueue", "_stub_buffer"),
    ("StubQueue", "_buffer_limit"),
}
# What the off-CPU tracer reads of a JVM's threads (profiler/unwind/javathreads.py); optional.
THREAD_FIELDS = {
    ("ThreadsSMRSupport", "_java_thread_list"),
    ("ThreadsList", "_length"),
    ("ThreadsList", "_threads"),
    ("JavaThread", "_osthread"),  # JDK <= 21
    ("Thread", "_osthread"),  # JDK 25
    ("OSThread", "_thread_id"),
    ("JavaThread", "_anchor"),
    ("JavaFrameAnchor", "_last_Java_sp"),
    ("JavaFrameAnchor", "_last_Java_pc"),
    ("JavaFrameAnchor", "_last_Java_fp"),
    ("JavaThread", "_current_pending_monitor"),
    ("JavaThread", "_current_waiting_monitor"),
}
_TABLE_SYMBOLS = (
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
)
_MAX_ENTRIES = 20000  # a JDK has about 2,000 struct entries: more means we are reading garbage
LIBJVM_MAX_BYTES = 1 << 30
ELF_MAX_SYMBOLS = 1 << 20  # per symbol table (libjvm.so's .symtab: ~70 k, its .dynsym ~500)
ELF_MAX_STRINGS = 32 << 20  # bytes of a string table (libjvm.so's .strtab: ~3 MB)
HSPERFDATA_MAX_BYTES = 4 << 20  # -XX:PerfDataMemorySize is 64 KB by default
HSPERFDATA_MAX_ENTRIES = 1 << 14  # a JDK publishes a few hundred counters


# ---------------------------------------------------------------- ELF (dynamic symbols of libjvm.so)


def elf_symbols(path: str, reader: safeio.BoundedReader, names: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """Values of the named symbols from .dynsym (else .symtab), and the file offset-0 PT_LOAD's vaddr.

    Reads only the headers and the symbol and string tables (libjvm.so is ~20 MB), each inside the file
    and bounded (a crafted header raises ValueError). The work is linear in the tables: a name is compared
    only where a symbol says it starts, never read to its NUL (a crafted string table of one name
    without end, named at every offset, made that quadratic: hours for 128 MiB); a table over
    ELF_MAX_SYMBOLS or ELF_MAX_STRINGS is refused (VMStructsError)."""
    read = reader.read_at
    head = read(0, 64)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise VMStructsError(f"{path}: not a 64-bit little-endian ELF file")
    phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
    base_vaddr = 0
    program_headers = read(phoff, phnum * phentsize)
    for index in range(phnum):
        p_type, _flags, p_offset, p_vaddr = struct.unpack_from("<IIQQ", program_headers, index * phentsize)
        if p_type == 1 and p_offset == 0:  # PT_LOAD mapping the file's start
            base_vaddr = p_vaddr
            break
    section_headers = read(shoff, shnum * shentsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", section_headers, i * shentsize) for i in range(shnum)]
    # names as the string table spells them, each with its NUL: a name at an offset matches only if
    # the bytes there up to the longest wanted name's NUL are one of them
    wanted = {name.encode("ascii") + b"\0": name for name in names}
    longest = max((len(spelled) for spelled in wanted), default=0)
    found: dict[str, int] = {}
    for sh_type in (11, 2):  # SHT_DYNSYM, then SHT_SYMTAB
        for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if kind != sh_type or entsize < 24:  # sizeof(Elf64_Sym): smaller is a crafted table
                continue
            if size // entsize > ELF_MAX_SYMBOLS or not link < shnum or sections[link][5] > ELF_MAX_STRINGS:
                raise VMStructsError(
                    f"{path}: symbol table of {size // entsize} entries or its {sections[min(link, shnum - 1)][5]}"
                    f" bytes of names over the limits ({ELF_MAX_SYMBOLS}, {ELF_MAX_STRINGS}); not read"
                )
            table = read(offset, size)
            strings = read(sections[link][4], sections[link][5])
            for at in range(0, size - 23, entsize):
                st_name, _info_other, _shndx, st_value = struct.unpack_from("<IHHQ", table, at)
                spelled = strings[st_name : st_name + longest]
                name = wanted.get(spelled[: spelled.find(b"\0") + 1])
                if name is not None and name not in found:
                    found[name] = st_value
        if len(found) == len(wanted):
            break
    return found, base_vaddr


def libjvm_mapping(pid: int) -> tuple[str, int, int] | None:
    """(path as the process sees it, load address of its file offset 0, end of that mapping) of
    libjvm.so in ``pid``."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            return libjvm_in_maps(handle)
    except OSError:
        return None


def libjvm_in_maps(lines: Iterable[str]) -> tuple[str, int, int] | None:
    """libjvm_mapping of the lines of a /proc/PID/maps (a line that does not parse is passed over)."""
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].rstrip("\n").endswith("/libjvm.so"):
            try:
                if int(parts[2], 16) == 0:
                    start, end = (int(bound, 16) for bound in parts[0].split("-"))
                    return parts[5].rstrip("\n"), start, end
            except ValueError:
                continue
    return None


# ---------------------------------------------------------------- the target's memory


class ProcessMemory:
    """Reads of another process's memory through /proc/PID/mem (needs ptrace access: root)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        self._strings: dict[int, str] = {}

    def read(self, address: int, size: int) -> bytes:
        if address <= 0 or address >= 1 << 47:
            raise OSError(f"address {address:#x} outside user space")
        data = os.pread(self._fd, size, address)
        if len(data) != size:
            raise OSError(f"short read at {address:#x}")
        return data

    def u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def s32(self, address: int) -> int:
        return int.from_bytes(self.read(address, 4), "little", signed=True)

    def u16(self, address: int) -> int:
        return int.from_bytes(self.read(address, 2), "little")

    def c_string(self, address: int) -> str:
        """A NUL-terminated string (vmStructs names; cached: they are static data)."""
        known = self._strings.get(address)
        if known is None:
            chunk = self.read(address, 128)
            known = chunk.split(b"\0", 1)[0].decode("ascii", "replace")
            if len(self._strings) < 1 << 16:  # vmStructs' names: ~6 k; a crafted table's are not kept
                self._strings[address] = known
        return known

    def close(self) -> None:
        os.close(self._fd)


# ---------------------------------------------------------------- vmStructs


@dataclass(frozen=True)
class VMLayout:
    """What the profiler needs of one JVM's vmStructs: field offsets, type sizes, the interpreter's code."""

    fields: dict[tuple[str, str], int]  # (type, field) -> offset (static fields: their address)
    sizes: dict[str, int]
    interpreter: tuple[int, int]  # [start, end) of the template interpreter's code
    method_slot: int  # bytes from an interpreter frame's fp to its Method*
    method_slot_source: str  # "vmStructs" or "x86_64 default"
    sender_sp_slot: int = 8 * -1  # bytes from an interpreter frame's fp to its caller's sp
    code_cache: CodeCacheLayout | None = None  # None: compiled frames walked by frame pointers only
    code_cache_error: str = ""  # why code_cache is None

    def offset(self, type_name: str, field_name: str) -> int:
        return self.fields[(type_name, field_name)]


def _read_table_entries(
    memory: ProcessMemory, symbols: dict[str, int], wanted: set[tuple[str, str]]
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], str]]:
    """(offset or static address, C type) of each wanted (type, field) the JVM exports."""
    stride = symbols["gHotSpotVMStructEntryArrayStride"]
    entry = memory.u64(symbols["gHotSpotVMStructs"])
    found: dict[tuple[str, str], int] = {}
    types: dict[tuple[str, str], str] = {}
    for _ in range(_MAX_ENTRIES):
        type_pointer = memory.u64(entry + symbols["gHotSpotVMStructEntryTypeNameOffset"])
        if type_pointer == 0:
            return found, types
        key = (
            memory.c_string(type_pointer),
            memory.c_string(memory.u64(entry + symbols["gHotSpotVMStructEntryFieldNameOffset"])),
        )
        if key in wanted:
            is_static = memory.s32(entry + symbols["gHotSpotVMStructEntryIsStaticOffset"])
            where = "gHotSpotVMStructEntryAddressOffset" if is_static else "gHotSpotVMStructEntryOffsetOffset"
            found[key] = memory.u64(entry + symbols[where])
            type_string = memory.u64(entry + symbols["gHotSpotVMStructEntryTypeStringOffset"])
            types[key] = memory.c_string(type_string) if type_string else ""
        entry += stride
    raise VMStructsError("gHotSpotVMStructs has no end marker")


def _read_types(memory: ProcessMemory, symbols: dict[str, int], names: set[str]) -> dict[str, int]:
    stride = symbols["gHotSpotVMTypeEntryArrayStride"]
    entry = memory.u64(symbols["gHotSpotVMTypes"])
    sizes: dict[str, int] = {}
    for _ in range(_MAX_ENTRIES):
        type_pointer = memory.u64(entry + symbols["gHotSpotVMTypeEntryTypeNameOffset"])
        if type_pointer == 0:
            return sizes
        name = memory.c_string(type_pointer)
        if name in names:
            sizes[name] = memory.u64(entry + symbols["gHotSpotVMTypeEntrySizeOffset"])
        entry += stride
    raise VMStructsError("gHotSpotVMTypes has no end marker")


def _read_int_constants(memory: ProcessMemory, symbols: dict[str, int], wanted: set[str]) -> dict[str, int]:
    stride = symbols["gHotSpotVMIntConstantEntryArrayStride"]
    entry = memory.u64(symbols["gHotSpotVMIntConstants"])
    found: dict[str, int] = {}
    for _ in range(_MAX_ENTRIES):
        name_pointer = memory.u64(entry + symbols["gHotSpotVMIntConstantEntryNameOffset"])
        if name_pointer == 0:
            return found
        name = memory.c_string(name_pointer)
        if name in wanted:
            found[name] = memory.s32(entry + symbols["gHotSpotVMIntConstantEntryValueOffset"])
        entry += stride
    return found


def read_layout(pid: int, memory: ProcessMemory) -> VMLayout:
    """The JVM's layout from its own tables; VMStructsError when it is not a readable HotSpot JVM."""
    mapping = libjvm_mapping(pid)
    if mapping is None:
        raise VMStructsError(f"pid {pid}: no libjvm.so mapped")
    path, load_address, end = mapping
    try:
        # the mapped file itself (/proc/PID/map_files): a link swapped in since cannot redirect the read
        fd = safeio.open_mapped(pid, load_address, end, path, LIBJVM_MAX_BYTES)
        try:
            values, base_vaddr = elf_symbols(path, safeio.BoundedReader(fd, os.fstat(fd).st_size), _TABLE_SYMBOLS)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError, struct.error) as exc:
        raise VMStructsError(f"pid {pid}: {path}: {exc}") from None
    missing = [name for name in _TABLE_SYMBOLS if name not in values]
    if missing:
        raise VMStructsError(f"pid {pid}: {path} lacks {', '.join(missing)}")
    bias = load_address - base_vaddr
    try:
        symbols = {name: memory.u64(bias + value) for name, value in values.items()}
        # The pointers to the tables are data; the offsets and strides are the values themselves.
        for name in ("gHotSpotVMStructs", "gHotSpotVMTypes", "gHotSpotVMIntConstants"):
            symbols[name] = bias + values[name]
        fields, types = _read_table_entries(memory, symbols, _WANTED_FIELDS | CODE_FIELDS | THREAD_FIELDS)
        sizes = _read_types(memory, symbols, {"ConstantPool", "HeapBlock", "PcDesc"})
        constants = _read_int_constants(memory, symbols, {_METHOD_SLOT, _SENDER_SP_SLOT, *KIND_CONSTANTS})
        slot = constants.get(_METHOD_SLOT)
        missing_fields = sorted(f"{t}::{f}" for t, f in _WANTED_FIELDS - fields.keys())
        if missing_fields or "ConstantPool" not in sizes:
            raise VMStructsError(f"pid {pid}: vmStructs lack {', '.join(missing_fields) or 'ConstantPool size'}")
        queue = memory.u64(fields[("AbstractInterpreter", "_code")])
        start = memory.u64(queue + fields[("StubQueue", "_stub_buffer")])
        limit = memory.s32(queue + fields[("StubQueue", "_buffer_limit")])
    except OSError as exc:
        raise VMStructsError(f"pid {pid}: reading vmStructs failed ({exc})") from None
    if not 0 < limit <= _MAX_INTERPRETER:
        raise VMStructsError(f"pid {pid}: interpreter code of {limit} bytes: absurd vmStructs")
    code_cache, code_cache_error = None, ""
    try:
        code_cache = read_code_cache(memory, fields, types, sizes, constants)
    except VMStructsError as exc:
        code_cache_error = f"pid {pid}: {exc}"
    except OSError as exc:
        code_cache_error = f"pid {pid}: reading the code cache failed ({exc})"
    sender_sp = constants.get(_SENDER_SP_SLOT, X86_64_SENDER_SP_SLOT)
    return VMLayout(
        fields=fields,
        sizes=sizes,
        interpreter=(start, start + limit),
        method_slot=8 * (slot if slot is not None else X86_64_METHOD_SLOT),
        method_slot_source="vmStructs" if slot is not None else "x86_64 default",
        sender_sp_slot=8 * sender_sp if -16 <= sender_sp < 0 else 8 * X86_64_SENDER_SP_SLOT,
        code_cache=code_cache,
        code_cache_error=code_cache_error,
    )


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
        the methods the JIT inlined at the pc (marked INLINED_MARK), then the compiled method itself.
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
        return pc, [name + INLINED_MARK for name in inlined if name is not None] + [outer], ""

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


# ---------------------------------------------------------------- hsperfdata (the JVM's own counters)

UNLOADED_CLASSES = "java.cls.unloadedClasses"
_PERF_MAGIC = 0xCAFEC0C0


@dataclass
class HsPerfCounter:
    """One long counter of a JVM's hsperfdata file (-XX:+UsePerfData, the default), read by offset
    (the file stays open: it is read every drain)."""

    path: str
    offset: int
    fd: int | None = None

    @classmethod
    def find(cls, pid: int, name: str) -> HsPerfCounter | None:
        """The counter ``name`` of ``pid``'s hsperfdata, or None (no file, -XX:-UsePerfData, no such counter)."""
        file_name = str(procread.namespace_pid(pid))
        try:
            tmp_fd = safeio.open_dir_in_root(pid, "/tmp")
        except OSError:
            return None
        try:
            directories = [d for d in os.listdir(tmp_fd) if d.startswith("hsperfdata_")][:64]
        finally:
            os.close(tmp_fd)
        for directory in directories:
            try:
                # written by the JVM itself: its owner's, a regular file, no link, bounded (safeio warns)
                fd = safeio.open_in_root(pid, f"/tmp/{directory}/{file_name}", HSPERFDATA_MAX_BYTES)
            except OSError:
                continue
            offset = _counter_offset(safeio.read_fd(fd, HSPERFDATA_MAX_BYTES), name)
            if offset is not None:
                return cls(f"/proc/{pid}/root/tmp/{directory}/{file_name}", offset, fd)
            os.close(fd)
        return None

    def address_in(self, pid: int, memory: ProcessMemory) -> int | None:
        """Where the JVM sees this counter: its mapping of the hsperfdata file (offset 0) plus the offset,
        checked by reading the same value there and in the file; None when the file is not mapped."""
        suffix = "/" + "/".join(self.path.split("/")[-2:])
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
                lines = [line for line in handle if line.rstrip("\n").endswith(suffix)]
        except OSError:
            return None
        for line in lines[:4]:
            parts = line.split(None, 5)
            if len(parts) < 6 or int(parts[2], 16) != 0:
                continue
            start, end = (int(bound, 16) for bound in parts[0].split("-"))
            if self.offset + 8 > end - start:
                continue
            for _ in range(3):  # the JVM may count an unload between the two reads
                try:
                    if memory.u64(start + self.offset) == self.read():
                        return start + self.offset
                except OSError:
                    break
        return None

    def read(self) -> int | None:
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, 8, self.offset)
        except OSError:
            return None
        return int.from_bytes(data, "little") if len(data) == 8 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _counter_offset(data: bytes, name: str) -> int | None:
    """File offset of the value of the long counter ``name`` (the PerfData entry layout of HotSpot's
    perfMemory.hpp: prologue with entry_offset and num_entries, then entries with name and data offsets).

    Linear in the file: at most HSPERFDATA_MAX_ENTRIES entries, each at least its 20-byte header long and
    after the one before, and a name compared where it starts (never read to its NUL: a crafted file of
    entries naming one unterminated name cost 28 CPU-s for 4 MiB)."""
    if len(data) < 32 or int.from_bytes(data[:4], "big") != _PERF_MAGIC or data[4] != 1:  # 1: little-endian
        return None
    entry_offset, entries = struct.unpack_from("<ii", data, 24)
    at = entry_offset
    wanted = name.encode("ascii") + b"\0"
    for _ in range(min(max(0, entries), HSPERFDATA_MAX_ENTRIES)):
        if at < 0 or at + 20 > len(data):
            return None
        length, name_offset, vector_length, data_type, _flags, _units, _variability, data_offset = struct.unpack_from(
            "<iiibbbbi", data, at
        )
        named = 0 <= name_offset <= length - len(wanted) and data.startswith(wanted, at + name_offset)
        if named and vector_length == 0 and data_type == ord("J") and 0 <= data_offset <= length - 8:
            return at + data_offset
        if length < 20:
            return None
        at += length
    return None


class JvmNames:
    """The namers of the sampled JVMs, opened by the symbol worker while the window runs.

    ``publish(pid, layout, unloads_address)`` tells the BPF walker where the JVM's interpreter (and its
    unloaded-class counter) is; ``generation_of`` gives each sample its generation (the module's
    docstring); ``note_stack`` names the Method* pointers of each stack new in its generation as soon as
    the reader sees it, so a class unloaded later in the window still has its name (a name read at
    collection only would find freed memory).
    """

    def __init__(self, publish: Callable[[int, VMLayout, int], None]) -> None:
        self._publish = publish
        self.namers: dict[int, MethodNamer] = {}
        self.errors: dict[int, str] = {}  # pid -> why it has no namer
        self._starts: dict[int, list[int]] = {}  # polled: monotonic ns each generation after the first began
        self._by_count: dict[int, dict[int, int]] = {}  # exact: unloaded-class count -> generation
        self._count: dict[int, int] = {}  # exact: the count of the current generation
        # pid -> hashes of user stacks named in the current generation (at most SEEN_STACKS: a deep workload's
        # every sample can be a new stack, and naming one again only re-reads what is not named yet)
        self._seen: dict[int, set[int]] = {}
        self.keep_log = False  # log what is named, for the checkpoint journal (take_names)
        self._lock = threading.Lock()
        self._attach_lock = threading.Lock()  # one attach at a time: the symbol worker and prepare_unwinding

    def attach(self, pid: int) -> bool:
        """Read ``pid``'s vmStructs and publish its interpreter; False (reason in errors) when it cannot."""
        with self._attach_lock:
            return self._attach(pid)

    def _attach(self, pid: int) -> bool:
        if pid in self.namers:
            return True
        try:
            namer = open_namer(pid)
        except (VMStructsError, OSError) as exc:
            self.errors[pid] = str(exc)
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
                    namer.compiled.log = []
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
                if compiled is not None and compiled.log is not None:
                    chains, compiled.log = tuple(compiled.log), []
                code_low = compiled.layout.low if compiled is not None else None
                taken[pid] = JavaNamesDelta(code_low, names, chains)
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

    def _note_exact(self, pid: int, namer: MethodNamer, methods: Sequence[int], compiled: Sequence[int]) -> None:
        """Read names only while the JVM's count is the current generation's, before and after the reads:
        an unload in between may have freed (and a load reused) what was read; those names are dropped."""
        assert namer.unloads is not None
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
