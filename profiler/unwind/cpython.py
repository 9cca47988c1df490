"""CPython's own frames: where a CPython process keeps its interpreter frames (``_PyRuntime`` by its ELF
symbol, the structs' offsets by the interpreter's version), published to the BPF walker
(profiler/unwind/python_step.h), and the code objects the walker records named ``module.qualname
(file:line)`` from the process's memory, spliced where ``_PyEval_EvalFrameDefault`` runs them.

Nothing is written to the target, nothing is attached: the ELF is read through /proc/PID/map_files
(safeio.open_mapped), memory through /proc/PID/mem with bounded reads (``ProcessMemory``). The offsets are a
table per minor version (3.11) or the target's own ``_Py_DebugOffsets`` (3.13: the head of ``_PyRuntime``,
one bounded read, every offset checked against its struct's size), chosen by the binary's ``Py_Version``
and checked at attach against the live process (the main interpreter's first thread state must point back
at the interpreter and name one of the process's threads); docs/python-frames.md says where each comes from.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..capture.stackstore import PYTHON_MASK, PYTHON_TAG, TAG_MASK
from ..files import procread, safeio
from .keylocks import AttachedProcesses
from .vmstructs import ProcessMemory, elf_symbols

PYTHON_MAX_BYTES = 1 << 30  # a libpython or python executable (with debug info: ~30 MB)
EVAL = "_PyEval_EvalFrameDefault"
EVAL_COLD = "_PyEval_EvalFrameDefault.cold"  # GCC's cold part of the eval loop: also a caller of frames
SYMBOLS = ("_PyRuntime", "Py_Version", "PyCode_Type", EVAL, EVAL_COLD)
NAME_MAX = 512  # characters of a qualname or file name read
LINETABLE_MAX = 1 << 16  # bytes of a code object's line table read (larger: no line)
CODES_MAX = 100_000  # code objects named per process and window
THREADS_CHECKED = 64  # thread states looked at by the attach check

# The BPF program's frame value (python_step.h): address, instruction index, entry flag.
ADDRESS_MASK = (1 << 47) - 1
INDEX_SHIFT = 47
INDEX_MASK = (1 << 14) - 1
ENTRY_BIT = 1 << 63

_MAPPING = re.compile(r"^(libpython3\.\d+\.so(\.[0-9.]+)?|python3(\.\d+)?)$")


class PythonLayoutError(Exception):
    """Not a CPython whose frames we can read (no symbols, a version without a layout, a failed check)."""


@dataclass(frozen=True)
class PyLayout:
    """Byte offsets of the CPython structs the walker and the namer read (one minor version)."""

    interp_head: int  # _PyRuntimeState.interpreters.head
    tstate_current: int  # _PyRuntimeState.gilstate.tstate_current; 0: none kept (3.13)
    threads_head: int  # PyInterpreterState.threads.head
    ts_next: int  # PyThreadState.next
    ts_interp: int  # PyThreadState.interp
    ts_native_tid: int  # PyThreadState.native_thread_id
    ts_cframe: int  # PyThreadState.cframe; NO_CFRAME: current_frame is the thread state's own (3.13)
    cframe_frame: int  # _PyCFrame.current_frame (3.13: PyThreadState.current_frame)
    fr_code: int  # _PyInterpreterFrame.f_code (3.13: f_executable)
    fr_previous: int  # _PyInterpreterFrame.previous
    fr_prev_instr: int  # _PyInterpreterFrame.prev_instr (3.13: instr_ptr, the same instruction)
    fr_is_entry: int  # _PyInterpreterFrame.is_entry (3.13: owner)
    code_units: int  # PyCodeObject.co_code_adaptive
    co_firstlineno: int
    co_filename: int
    co_qualname: int
    co_linetable: int
    entry_mask: int = 1  # the entry byte's bits that flag a frame, and their value (python_step.h)
    entry_value: int = 1
    entry_is_shim: bool = False  # the flagged frame is the eval call's shim, not its first frame (3.12+)
    ob_type: int = 8  # PyObject.ob_type
    str_length: int = 16  # PyASCIIObject.length
    str_state: int = 32  # PyASCIIObject.state (interned:2, kind:3, compact:1, ascii:1)
    str_ascii_data: int = 48  # sizeof(PyASCIIObject): a compact ASCII string's characters
    str_compact_data: int = 72  # sizeof(PyCompactUnicodeObject): a compact non-ASCII string's
    bytes_size: int = 16  # PyVarObject.ob_size of a bytes object
    bytes_data: int = 32  # PyBytesObject.ob_sval
    # the walker reads a frame's pointers at (offset & 63) of an 80-byte read, its entry byte below 80
    WALKER_FRAME_BYTES: ClassVar[int] = 80


NO_CFRAME = 0xFFFFFFFF  # PyLayout.ts_cframe of a CPython without _PyCFrame (python_step.h's PY_NO_CFRAME)


# CPython 3.11: read from the DWARF of CPython 3.11.7's libpython3.11.so (gdb `ptype /o`, the test
# tests/unit/unwind/test_cpython.py reads them again where gdb and that library are present); the 3.11
# structs kept these offsets through the series (checked live on Debian's 3.11.2 too, by attach's check).
LAYOUTS: dict[tuple[int, int], PyLayout] = {
    (3, 11): PyLayout(
        interp_head=40,
        tstate_current=576,
        threads_head=16,
        ts_next=8,
        ts_interp=16,
        ts_native_tid=160,
        ts_cframe=56,
        cframe_frame=8,
        fr_code=32,
        fr_previous=48,
        fr_prev_instr=56,
        fr_is_entry=68,
        code_units=184,
        co_firstlineno=72,
        co_filename=112,
        co_qualname=128,
        co_linetable=136,
    ),
}


# _Py_DebugOffsets (3.13's Include/internal/pycore_runtime.h), the head of _PyRuntime: the cookie, then
# these u64 fields in this order. Its layout is stable within a minor version only: a version is added here
# once its struct's order has been read from its header.
_DEBUG_STRUCTS_313 = (
    "version free_threaded",
    "rt_size rt_finalizing rt_interpreters_head",
    "is_size is_id is_next is_threads_head is_gc is_imports_modules is_sysdict is_builtins is_ceval_gil",
    "is_gil_runtime_state is_gil_enabled is_gil_locked is_gil_holder",
    "ts_size ts_prev ts_next ts_interp ts_current_frame ts_thread_id ts_native_thread_id ts_datastack_chunk",
    "ts_status",
    "fr_size fr_previous fr_executable fr_instr_ptr fr_localsplus fr_owner",
    "co_size co_filename co_name co_qualname co_linetable co_firstlineno co_argcount co_localsplusnames",
    "co_localspluskinds co_code_adaptive",
    "po_size po_ob_type",
    "ty_size ty_tp_name ty_tp_repr ty_tp_flags",
    "tu_size tu_ob_item tu_ob_size",
    "li_size li_ob_item li_ob_size",
    "di_size di_ma_keys di_ma_values",
    "fl_size fl_ob_fval",
    "lo_size lo_lv_tag lo_ob_digit",
    "by_size by_ob_size by_ob_sval",
    "un_size un_state un_length un_asciiobject_size",
    "gc_size gc_collecting",
)
DEBUG_OFFSETS: dict[tuple[int, int], tuple[str, ...]] = {(3, 13): tuple(" ".join(_DEBUG_STRUCTS_313).split())}
DEBUG_COOKIE = b"xdebugpy"
DEBUG_STRUCT_MAX = 1 << 20  # a struct size the offsets may claim (3.13's _PyRuntimeState: 283,320 bytes)
_CHECKED_STRUCTS = ("rt", "is", "ts", "fr", "co", "po", "by", "un")  # the structs whose offsets are used
FRAME_OWNED_BY_CSTACK = 3  # _PyInterpreterFrame.owner of the shim frame each eval call pushes (3.12+)


def supported_versions() -> list[str]:
    """The CPython versions whose frames are named (``profiler doctor``)."""
    return [f"{major}.{minor}" for major, minor in sorted({*LAYOUTS, *DEBUG_OFFSETS})]


def layout_from_debug_offsets(raw: bytes, fields: Sequence[str], hex_version: int) -> PyLayout:
    """The layout a CPython 3.13+ states in its ``_Py_DebugOffsets`` (``raw``: the head of ``_PyRuntime``),
    each offset checked to lie in its struct and where the walker reads it; PythonLayoutError otherwise."""
    if len(raw) < len(DEBUG_COOKIE) + 8 * len(fields) or raw[: len(DEBUG_COOKIE)] != DEBUG_COOKIE:
        raise PythonLayoutError("_PyRuntime does not start with _Py_DebugOffsets' cookie")
    values = dict(zip(fields, struct.unpack_from(f"<{len(fields)}Q", raw, len(DEBUG_COOKIE)), strict=True))
    if values["version"] != hex_version:
        raise PythonLayoutError(f"_Py_DebugOffsets' version {values['version']:#x} is not Py_Version's")
    if values["free_threaded"]:
        raise PythonLayoutError("a free-threaded build (its frames are not read)")
    for name, value in values.items():
        prefix = name.split("_", 1)[0]
        if prefix not in _CHECKED_STRUCTS:
            continue
        size = values[f"{prefix}_size"]
        if not 0 < size <= DEBUG_STRUCT_MAX or not name.endswith("_size") and value >= size:
            raise PythonLayoutError(f"_Py_DebugOffsets' {name} ({value}) is out of its struct ({size} bytes)")
    frame_pointers = (values["fr_executable"], values["fr_previous"], values["fr_instr_ptr"])
    if any(offset > 56 or offset % 8 for offset in frame_pointers) or values["fr_owner"] >= PyLayout.WALKER_FRAME_BYTES:
        raise PythonLayoutError("_Py_DebugOffsets' frame fields lie beyond what the walker reads of a frame")
    # PyCompactUnicodeObject is PyASCIIObject then utf8_length and utf8 (3.12+): not in the offsets
    return PyLayout(
        interp_head=values["rt_interpreters_head"], tstate_current=0, threads_head=values["is_threads_head"],
        ts_next=values["ts_next"], ts_interp=values["ts_interp"], ts_native_tid=values["ts_native_thread_id"],
        ts_cframe=NO_CFRAME, cframe_frame=values["ts_current_frame"], fr_code=values["fr_executable"],
        fr_previous=values["fr_previous"], fr_prev_instr=values["fr_instr_ptr"], fr_is_entry=values["fr_owner"],
        code_units=values["co_code_adaptive"], co_firstlineno=values["co_firstlineno"],
        co_filename=values["co_filename"], co_qualname=values["co_qualname"], co_linetable=values["co_linetable"],
        entry_mask=0xFF, entry_value=FRAME_OWNED_BY_CSTACK, entry_is_shim=True, ob_type=values["po_ob_type"],
        str_length=values["un_length"], str_state=values["un_state"], str_ascii_data=values["un_asciiobject_size"],
        str_compact_data=values["un_asciiobject_size"] + 16, bytes_size=values["by_ob_size"],
        bytes_data=values["by_ob_sval"],
    )  # fmt: skip


def _layout(pid: int, memory: ProcessMemory, runtime: int, hex_version: int, version: str) -> PyLayout:
    """``pid``'s layout: 3.11's table, or what its own _Py_DebugOffsets say (one bounded read)."""
    minor = (hex_version >> 24, (hex_version >> 16) & 0xFF)
    if minor in LAYOUTS:
        return LAYOUTS[minor]
    fields = DEBUG_OFFSETS.get(minor)
    if fields is None:
        raise PythonLayoutError(
            f"pid {pid}: CPython {version}: no frame layout for it (named: {', '.join(supported_versions())})"
        )
    try:
        raw = memory.read(runtime, len(DEBUG_COOKIE) + 8 * len(fields))
    except OSError as exc:
        raise PythonLayoutError(f"pid {pid}: CPython {version}: reading _Py_DebugOffsets failed ({exc})") from None
    try:
        return layout_from_debug_offsets(raw, fields, hex_version)
    except PythonLayoutError as exc:
        raise PythonLayoutError(f"pid {pid}: CPython {version}: {exc}") from None


@dataclass(frozen=True)
class PyTarget:
    """One CPython process: its layout and where its runtime, code type and eval loop are."""

    pid: int
    version: str  # "3.11.7"
    layout: PyLayout
    runtime: int  # address of _PyRuntime
    code_type: int  # address of PyCode_Type
    eval_ranges: tuple[tuple[int, int], ...]  # [start, end) of _PyEval_EvalFrameDefault (and its .cold part)


def python_mappings(lines: Iterable[str]) -> list[tuple[str, int, int]]:
    """(path, start, end) of the offset-0 mappings of a libpython or a python executable in maps lines,
    libpython first (a shared build keeps its runtime there; a static one in the executable)."""
    found: list[tuple[str, int, int]] = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) != 6 or parts[2].strip("0") != "":
            continue
        path = parts[5].rstrip("\n")
        if not _MAPPING.match(os.path.basename(path)) or any(path == known[0] for known in found):
            continue
        try:
            start, end = (int(bound, 16) for bound in parts[0].split("-"))
        except ValueError:
            continue
        found.append((path, start, end))
    found.sort(key=lambda entry: not os.path.basename(entry[0]).startswith("lib"))
    return found


def _symbols(pid: int, path: str, start: int, end: int) -> tuple[dict[str, int], dict[str, int], int]:
    sizes: dict[str, int] = {}
    fd = safeio.open_mapped(pid, start, end, path, PYTHON_MAX_BYTES)
    try:
        values, base_vaddr = elf_symbols(path, safeio.BoundedReader(fd, os.fstat(fd).st_size), SYMBOLS, sizes)
    finally:
        os.close(fd)
    return values, sizes, start - base_vaddr


def _version(hex_version: int) -> str:
    return f"{hex_version >> 24}.{(hex_version >> 16) & 0xFF}.{(hex_version >> 8) & 0xFF}"


def open_target(pid: int, memory: ProcessMemory) -> PyTarget:
    """``pid``'s CPython, checked; PythonLayoutError when it is none we can read."""
    for path, start, end in python_mappings(procread.maps(pid)):
        try:
            values, sizes, bias = _symbols(pid, path, start, end)
        except (OSError, ValueError, IndexError, struct.error) as exc:
            raise PythonLayoutError(f"pid {pid}: {path}: {exc}") from None
        if "_PyRuntime" in values and EVAL in values:
            break
    else:
        raise PythonLayoutError(f"pid {pid}: no libpython or python executable exporting _PyRuntime mapped")
    if "Py_Version" not in values or "PyCode_Type" not in values:
        raise PythonLayoutError(f"pid {pid}: {path} lacks Py_Version or PyCode_Type (CPython before 3.11?)")
    try:
        hex_version = int.from_bytes(memory.read(bias + values["Py_Version"], 4), "little")
    except OSError as exc:
        raise PythonLayoutError(f"pid {pid}: reading Py_Version failed ({exc})") from None
    version = _version(hex_version)
    layout = _layout(pid, memory, bias + values["_PyRuntime"], hex_version, version)
    ranges = tuple(
        (bias + values[name], bias + values[name] + max(sizes.get(name, 0), 1))
        for name in (EVAL, EVAL_COLD)
        if name in values
    )
    target = PyTarget(pid, version, layout, bias + values["_PyRuntime"], bias + values["PyCode_Type"], ranges)
    check_live(target, memory, _task_ids(pid))
    return target


def _task_ids(pid: int) -> set[int]:
    try:
        return {int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()}
    except OSError:
        return set()


def check_live(target: PyTarget, memory: ProcessMemory, tids: set[int]) -> None:
    """The layout against the live process: the main interpreter's thread states point back at it and one of
    them names a thread of the process (a wrong table finds garbage there)."""
    layout = target.layout
    try:
        interp = memory.u64(target.runtime + layout.interp_head)
        tstate = memory.u64(interp + layout.threads_head) if interp else 0
        for _ in range(THREADS_CHECKED):
            if tstate == 0:
                break
            if memory.u64(tstate + layout.ts_interp) != interp:
                raise PythonLayoutError(
                    f"pid {target.pid}: CPython {target.version}: thread state not of its interpreter"
                )
            if memory.u64(tstate + layout.ts_native_tid) in tids:
                return
            tstate = memory.u64(tstate + layout.ts_next)
    except OSError as exc:
        raise PythonLayoutError(f"pid {target.pid}: CPython {target.version}: runtime unreadable ({exc})") from None
    raise PythonLayoutError(f"pid {target.pid}: CPython {target.version}: no thread state names a thread of it")


def fill_python(entry: Any, target: PyTarget) -> None:
    """The walker's view of a CPython process (struct python_t of python_step.h)."""
    layout = target.layout
    entry.runtime = target.runtime
    for field in (
        "interp_head", "tstate_current", "threads_head", "ts_next", "ts_native_tid", "ts_cframe", "cframe_frame",
        "fr_code", "fr_previous", "fr_prev_instr", "fr_is_entry", "entry_mask", "entry_value", "code_units",
    ):  # fmt: skip
        setattr(entry, field, getattr(layout, field))


def entries_from_shims(python: Sequence[int]) -> list[int]:
    """3.12+'s walked frames as 3.11's: each eval call's shim frame (flagged by the walker) dropped and the
    frame leafward of it, the call's first, flagged as its entry frame."""
    out: list[int] = []
    for frame in python:
        if not frame & ENTRY_BIT:
            out.append(frame)
        elif out:
            out[-1] |= ENTRY_BIT
    return out


def splice(user: bytes, python: Sequence[int], eval_ranges: Sequence[tuple[int, int]]) -> bytes:
    """A walker's user stack with its CPython frames (python_step.h values, leaf first, 3.11's entry flags)
    put leafward of the ``_PyEval_EvalFrameDefault`` frame that runs them: each eval frame gets the frames up
    to and including the next entry frame. Frames left over (the native walk was cut) go to the root end."""
    if not python:
        return user
    values = struct.unpack(f"<{len(user) // 8}Q", user)
    out: list[int] = []
    at = 0
    for value in values:
        if at < len(python) and value & TAG_MASK == 0 and any(low <= value < high for low, high in eval_ranges):
            while at < len(python):
                frame = python[at]
                at += 1
                out.append(PYTHON_TAG | (frame & ~ENTRY_BIT))
                if frame & ENTRY_BIT:
                    break
        out.append(value)
    out.extend(PYTHON_TAG | (frame & ~ENTRY_BIT) for frame in python[at:])
    return struct.pack(f"<{len(out)}Q", *out)


def _varint(table: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(table):
        byte = table[at]
        at += 1
        value |= (byte & 63) << shift
        shift += 6
        if not byte & 64:
            break
    return value, at


def line_of(table: bytes, first_line: int, index: int) -> int | None:
    """The line of instruction ``index`` (code units) by a 3.11 location table (Objects/locations.md of
    CPython): entries of (code, length) with a line delta; None where the table says "no location"."""
    line, address, at = first_line, 0, 0
    while at < len(table):
        head = table[at]
        kind, length = (head >> 3) & 15, (head & 7) + 1
        delta = 0
        if kind in (13, 14):
            raw, _ = _varint(table, at + 1)
            delta = -(raw >> 1) if raw & 1 else raw >> 1
        elif kind in (11, 12):
            delta = kind - 10
        line += delta
        if address <= index < address + length:
            return None if kind == 15 else line
        address += length
        at += 1
        while at < len(table) and not table[at] & 128:  # the next entry starts with its top bit set
            at += 1
    return None


def module_of(filename: str) -> str:
    """A module's name as its file gives it: ``pkg/mod.py`` -> ``mod``, ``pkg/__init__.py`` -> ``pkg``."""
    parts = filename.replace("\\", "/").rsplit("/", 2)
    stem = parts[-1].rsplit(".", 1)[0] if parts[-1].endswith((".py", ".pyc", ".pyw")) else parts[-1]
    if stem == "__init__" and len(parts) > 1:
        return parts[-2]
    return stem or "?"


@dataclass(frozen=True)
class CodeInfo:
    qualname: str
    filename: str
    first_line: int
    linetable: bytes


class PyNamer:
    """Names the CPython frames of one process: its code objects read when a stack holding them is first seen
    (``note``), while the process runs, and kept for the window (a code object freed and its address reused
    for another during the window keeps the first name: docs/python-frames.md)."""

    def __init__(self, target: PyTarget, memory: ProcessMemory) -> None:
        self.target = target
        self.memory = memory
        self._codes: dict[int, CodeInfo | None] = {}
        self._lock = threading.RLock()  # the reader notes, the collection names

    def note(self, values: Iterable[int]) -> None:
        """Read the code objects of ``values`` (python_step.h frames or spliced ones) not read yet."""
        with self._lock:
            for value in values:
                code = value & ADDRESS_MASK
                if code not in self._codes and len(self._codes) < CODES_MAX:
                    self._codes[code] = self._read_code(code)

    def name(self, value: int) -> str | None:
        """``module.qualname (file:line)`` of a spliced frame, None when its code object could not be read."""
        code = value & ADDRESS_MASK
        with self._lock:
            if code not in self._codes:
                self.note((value,))
            info = self._codes.get(code)
        if info is None:
            return None
        line = line_of(info.linetable, info.first_line, (value >> INDEX_SHIFT) & INDEX_MASK)
        where = os.path.basename(info.filename) or info.filename
        return f"{module_of(info.filename)}.{info.qualname} ({where}:{line if line is not None else info.first_line})"

    def _read_code(self, code: int) -> CodeInfo | None:
        layout, memory = self.target.layout, self.memory
        try:
            if code == 0 or memory.u64(code + layout.ob_type) != self.target.code_type:
                return None  # not a code object (any more)
            head = memory.read(code, layout.co_linetable + 8)
            first_line = int.from_bytes(head[layout.co_firstlineno : layout.co_firstlineno + 4], "little", signed=True)
            pointer = lambda offset: int.from_bytes(head[offset : offset + 8], "little")  # noqa: E731
            qualname = self._string(pointer(layout.co_qualname))
            filename = self._string(pointer(layout.co_filename))
            linetable = self._bytes(pointer(layout.co_linetable))
        except OSError:
            return None
        if qualname is None or filename is None:
            return None
        return CodeInfo(qualname, filename, first_line, linetable)

    def _string(self, address: int) -> str | None:
        """A str object's text (compact strings, at most NAME_MAX characters), None for any other."""
        memory, layout = self.memory, self.target.layout
        head = memory.read(address, layout.str_ascii_data)
        length = int.from_bytes(head[layout.str_length : layout.str_length + 8], "little")
        state = int.from_bytes(head[layout.str_state : layout.str_state + 4], "little")
        kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4):
            return None
        length = min(length, NAME_MAX)
        data = layout.str_ascii_data if ascii_only else layout.str_compact_data  # past the header read
        raw = memory.read(address + data, length * kind) if length else b""
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        return raw.decode(codec, "replace")

    def _bytes(self, address: int) -> bytes:
        layout = self.target.layout
        size = int.from_bytes(self.memory.read(address + layout.bytes_size, 8), "little", signed=True)
        if not 0 <= size <= LINETABLE_MAX:
            return b""
        return self.memory.read(address + layout.bytes_data, size) if size else b""

    def close(self) -> None:
        self.memory.close()


def open_namer(pid: int) -> PyNamer:
    """A namer of ``pid``'s CPython frames (its memory open); PythonLayoutError, OSError when none."""
    memory = ProcessMemory(pid)
    try:
        return PyNamer(open_target(pid, memory), memory)
    except BaseException:
        memory.close()
        raise


class PythonTargets(AttachedProcesses["PyNamer"]):
    """The namers of the sampled CPython processes, opened by the preparation workers; ``publish(pid, target)``
    puts a process's layout into the walker's ``pythons`` map."""

    def __init__(self, publish: Callable[[int, PyTarget], None]) -> None:
        super().__init__()
        self._publish = publish

    def _attach(self, pid: int) -> bool:
        """Open ``pid``'s namer and publish its layout; False (reason in errors) for a process that is no
        CPython we can read."""
        namer = self._open(pid, open_namer, PythonLayoutError)
        if namer is None:
            return False
        try:
            self._publish(pid, namer.target)
        except Exception as exc:  # noqa: BLE001 - bcc map errors are plain exceptions
            namer.close()
            self.errors[pid] = f"pid {pid}: publishing the CPython layout failed ({exc})"
            return False
        with self._lock:
            self.namers[pid] = namer
        return True

    def splice(self, tgid: int, user: bytes, python: Sequence[int]) -> bytes:
        """``user`` with ``python``'s frames spliced in (the reader, per record)."""
        namer = self.namers.get(tgid)
        if namer is None:
            return user
        if namer.target.layout.entry_is_shim:
            python = entries_from_shims(python)
        return splice(user, python, namer.target.eval_ranges)

    def note(self, tgid: int, user: bytes) -> None:
        """Read the code objects of a filed stack's Python frames while the process runs."""
        namer = self.namers.get(tgid)
        if namer is None:
            return
        values = struct.unpack(f"<{len(user) // 8}Q", user)
        namer.note(value for value in values if value & PYTHON_MASK == PYTHON_TAG)

    def close(self) -> None:
        with self._lock:
            namers, self.namers = list(self.namers.values()), {}
        for namer in namers:
            namer.close()
