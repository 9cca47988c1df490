"""A running JVM's layout read from outside: HotSpot's own vmStructs tables, found through libjvm.so's
symbols and read from /proc/PID/mem.

libjvm.so exports ``gHotSpotVMStructs``, ``gHotSpotVMTypes`` and the int/long constant tables (with the
offsets and strides of their entries) for the serviceability agent. From them this module learns, for
the running JVM, where its template interpreter's code is (``AbstractInterpreter::_code``, a StubQueue)
and the field offsets that lead from a ``Method*`` to ``pkg.Class::method`` (Method → ConstMethod →
ConstantPool → InstanceKlass → Symbol; hotspot.py follows them). Nothing is hard-coded for one JDK except
the x86_64 interpreter frame's method slot, used only when the JVM does not export
``frame::interpreter_frame_method_offset`` (JDK 8..21 keep the Method* three words below the frame
pointer; OpenTelemetry's and async-profiler's unwinders rely on the same layout).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import VMStructsError
from ..files import procread, safeio
from .codecache import CODE_FIELDS, KIND_CONSTANTS, CodeCacheLayout, read_code_cache

X86_64_METHOD_SLOT = -3  # frame::interpreter_frame_method_offset (words from fp), JDK 8+ on x86_64
X86_64_SENDER_SP_SLOT = -1  # frame::interpreter_frame_sender_sp_offset: the caller's sp (exported by 17 and 25)
_METHOD_SLOT = "frame::interpreter_frame_method_offset"
_SENDER_SP_SLOT = "frame::interpreter_frame_sender_sp_offset"
_MAX_INTERPRETER = 64 << 20  # the template interpreter is a few hundred KiB
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


TABLE_SYMBOLS = (
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


# ---------------------------------------------------------------- ELF (dynamic symbols of libjvm.so)


def elf_symbols(
    path: str, reader: safeio.BoundedReader, names: tuple[str, ...], sizes: dict[str, int] | None = None
) -> tuple[dict[str, int], int]:
    """Values of the named symbols from .dynsym (else .symtab), and the file offset-0 PT_LOAD's vaddr; their
    st_size into ``sizes`` when given. An undefined symbol (value 0: an import) is not a value.

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
                st_name, _info_other, _shndx, st_value, st_size = struct.unpack_from("<IHHQQ", table, at)
                spelled = strings[st_name : st_name + longest]
                name = wanted.get(spelled[: spelled.find(b"\0") + 1])
                if name is not None and name not in found and st_value != 0:
                    found[name] = st_value
                    if sizes is not None:
                        sizes[name] = st_size
        if len(found) == len(wanted):
            break
    return found, base_vaddr


def libjvm_mapping(pid: int) -> tuple[str, int, int] | None:
    """(path as the process sees it, load address of its file offset 0, end of that mapping) of
    libjvm.so in ``pid``."""
    return libjvm_in_maps(procread.maps(pid))  # bounded; a process gone or unreadable has no lines


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


def read_table_entries(
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


def read_types(memory: ProcessMemory, symbols: dict[str, int], names: set[str]) -> dict[str, int]:
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
            values, base_vaddr = elf_symbols(path, safeio.BoundedReader(fd, os.fstat(fd).st_size), TABLE_SYMBOLS)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError, struct.error) as exc:
        raise VMStructsError(f"pid {pid}: {path}: {exc}") from None
    missing = [name for name in TABLE_SYMBOLS if name not in values]
    if missing:
        raise VMStructsError(f"pid {pid}: {path} lacks {', '.join(missing)}")
    bias = load_address - base_vaddr
    try:
        symbols = {name: memory.u64(bias + value) for name, value in values.items()}
        # The pointers to the tables are data; the offsets and strides are the values themselves.
        for name in ("gHotSpotVMStructs", "gHotSpotVMTypes", "gHotSpotVMIntConstants"):
            symbols[name] = bias + values[name]
        fields, types = read_table_entries(memory, symbols, _WANTED_FIELDS | CODE_FIELDS | THREAD_FIELDS)
        sizes = read_types(memory, symbols, {"ConstantPool", "HeapBlock", "PcDesc"})
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
