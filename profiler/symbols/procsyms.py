"""Native frames of a live process named by our own ELF reader (profiler/symbols/elfsyms.py), never by a
library that opens a target's paths itself (docs/security.md).

Its /proc/PID/maps is read by procread's one bounded reader (a byte, line and mapping cap; a line over the
cap keeps its address range and the end of its path; a cap reached is one warning naming it), its
executable mappings within EXEC_MAPPINGS_MAX. Each executable mapping's
ELF is opened only through /proc/PID/map_files/<start>-<end> (safeio.open_map_file: the mapped inode,
stat'ed before it is opened, regular, bounded, non-blocking): a path from the maps is never opened by
name, so a FIFO named ``<path> (deleted)`` or ``/[vdso]``, or a container's absolute link, is never
reached. Symbol tables are cached by (st_dev, st_ino, size, mtime): JVMs share libjvm.so's.

Debug files: ``.gnu_debuglink`` is not followed (its name is the target's and the place it is looked for
is the mapping's path). A build-id debug file is looked for only in the host's
``/usr/lib/debug/.build-id`` (libc6-dbg names start_thread and clone3 there), by a path made of the
build-id's hex digits, opened without links, non-blocking, and used only if it is a regular root-owned
world-readable file whose own build-id is the same: it tells a tenant nothing it could not read itself.
The [vdso] is named with the agent's own vDSO image (the same kernel's), never read from the target.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses
import os
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from ..files import procread, safeio
from .elfsyms import ElfFormatError, ElfSymbols, demangle, merged, read_elf_symbols
from .frames import UNKNOWN, Frame, FrameMemo, java_frame_name
from .perfmap import PerfMap, PerfMapLike, read_perf_map

EXEC_MAPPINGS_MAX = 8192  # executable file mappings kept (a JVM has about 100)
PROCESS_SYMBOLS_BUDGET = 64 << 20  # the symbol tables one process may have read (a JVM's: about 10 MB)
MODULE_NAME_MAX = 255  # a module's name as shown (NAME_MAX)
SYMBOL_CACHE_BYTES = 48 << 20  # symbol tables kept for the next process that maps the same file
DEBUG_DIR = "/usr/lib/debug/.build-id"
DELETED = " (deleted)"


@dataclass(frozen=True)
class ExecMapping:
    """An executable mapping of /proc/PID/maps: file-backed (path from the kernel, only shown) or [vdso]."""

    start: int
    end: int
    offset: int
    path: str  # as the maps line shows it ("" when the line was too long to keep it)
    name: str  # the file's name (the path's last component), at most MODULE_NAME_MAX characters
    device: str | None = None  # major:minor as the maps line gives it (a device that blocked is not asked again)

    @property
    def is_vdso(self) -> bool:
        return self.path == "[vdso]"


@dataclass
class MapsRead:
    """The executable mappings of a maps file, sorted; ``capped`` when a cap of its reader
    (procread.Maps) or EXEC_MAPPINGS_MAX cut or shortened it (each with its warning, already given)."""

    mappings: list[ExecMapping] = dataclasses.field(default_factory=list)
    capped: bool = False


def parse_exec_mapping(line: bytes, whole: bool = True) -> ExecMapping | None:
    """An executable file-backed (inode not 0) or [vdso] mapping of one maps line (``whole``: not an
    over-long line's head and tail, whose path is not kept); None for any other."""
    parts = line.split(None, 5)
    if len(parts) < 5 or b"x" not in parts[1][2:3]:
        return None
    path = parts[5].decode("utf-8", "replace") if len(parts) == 6 else ""
    try:
        low, high = (int(x, 16) for x in parts[0].split(b"-", 1))
        offset, inode = int(parts[2], 16), int(parts[4])
    except ValueError:
        return None
    device = parts[3].decode("ascii", "replace")[:16]
    if path == "[vdso]":
        return ExecMapping(low, high, offset, path, path, device)
    if inode == 0 or low >= high:
        return None
    if not whole:
        path = ""
    tail = line.rsplit(b"/", 1)[-1].decode("utf-8", "replace") if b"/" in line else ""
    name = (tail[: -len(DELETED)] if tail.endswith(DELETED) else tail)[:MODULE_NAME_MAX]
    return ExecMapping(low, high, offset, path, name, device)


def read_maps(pid: int) -> MapsRead:
    """The process's executable mappings, its maps file read by procread's one bounded reader (empty when
    it is gone or unreadable)."""
    return _exec_mappings(procread.maps(pid))


def parse_maps_stream(chunks: Iterable[bytes], pid: int = 0) -> MapsRead:
    """MapsRead of a maps file given as chunks, within the same caps (pure: tests pass crafted bytes)."""
    return _exec_mappings(procread.Maps(pid, chunks=chunks))


def _exec_mappings(maps: procread.Maps) -> MapsRead:
    read = MapsRead()
    for line in maps.entries():
        mapping = parse_exec_mapping(line.text, line.whole)
        if mapping is None:
            continue
        if len(read.mappings) >= EXEC_MAPPINGS_MAX:
            read.capped = True
            procread.cap_reached(maps.pid, maps.path, "executable mappings", "EXEC_MAPPINGS_MAX", EXEC_MAPPINGS_MAX)
            break
        read.mappings.append(mapping)
    read.capped = read.capped or maps.capped
    read.mappings.sort(key=lambda m: m.start)
    return read


# ---------------------------------------------------------------- symbol tables, shared by inode


FileKey = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


class SymbolCache:
    """ELF symbol tables by file identity, least recently used dropped past ``budget`` bytes."""

    def __init__(self, budget: int = SYMBOL_CACHE_BYTES) -> None:
        """``get(key, load)``: ``load`` returns the table, None for a file that is no ELF (kept: it will
        not become one), or raises OSError when it could not open the file (not kept)."""
        self.budget = budget
        self._tables: OrderedDict[FileKey, ElfSymbols | None] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()  # the symbol-prep worker and the main thread both load
        self.loads = 0

    def get(self, key: FileKey, load: Callable[[], ElfSymbols | None]) -> ElfSymbols | None:
        with self._lock:
            if key in self._tables:
                self._tables.move_to_end(key)
                return self._tables[key]
        try:
            table = load()  # outside the lock: a slow file must not hold the other thread
        except OSError:
            return None  # not opened (the process gone, a refusal): the next process mapping it tries again
        with self._lock:
            self.loads += 1
            if key not in self._tables:
                self._tables[key] = table
                self._held += table.cost if table is not None else 0
            while self._held > self.budget and len(self._tables) > 1:
                _key, dropped = self._tables.popitem(last=False)
                self._held -= dropped.cost if dropped is not None else 0
        return table

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._held = 0


SYMBOL_CACHE = SymbolCache()


def file_key(info: os.stat_result) -> FileKey:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _read_fd_symbols(pid: int, shown: str, fd: int) -> ElfSymbols | None:
    """The symbols of an opened ELF, with a build-id debug file's when it has no .symtab; None if not an ELF."""
    try:
        symbols = read_elf_symbols(safeio.BoundedReader.of(fd).read_at)
    except (ElfFormatError, ValueError, IndexError, struct.error, OSError):
        return None
    if symbols.refused:
        safeio.warn(pid, shown, f"pid {pid}: {shown}: {symbols.refused}; named by .dynsym only")
    if not symbols.from_symtab and symbols.build_id:
        debug = debug_symbols(symbols.build_id)
        if debug is not None and len(debug.starts):
            return merged(debug, symbols)
    return symbols


def debug_symbols(build_id: bytes, debug_dir: str = DEBUG_DIR) -> ElfSymbols | None:
    """The .symtab of the host's debug file of ``build_id`` (see the module docstring), or None."""
    if not 2 <= len(build_id) <= 64:
        return None
    digits = build_id.hex()
    return _debug_file_symbols(f"{debug_dir}/{digits[:2]}/{digits[2:]}.debug", build_id)


@lru_cache(maxsize=256)
def _debug_file_symbols(path: str, build_id: bytes) -> ElfSymbols | None:
    try:
        fd = safeio.open_without_links(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or not info.st_mode & stat.S_IROTH:
            return None
        if info.st_size > safeio.ELF_MAX_BYTES:
            return None
        symbols = read_elf_symbols(safeio.BoundedReader.of(fd).read_at)
    except (ElfFormatError, ValueError, IndexError, struct.error, OSError):
        return None
    finally:
        os.close(fd)
    return symbols if symbols.build_id == build_id and symbols.from_symtab else None


@lru_cache(maxsize=1)
def own_vdso() -> tuple[int, ElfSymbols | None]:
    """(size, symbols) of the agent's own [vDSO]: the kernel's image every 64-bit process maps."""
    try:
        with open("/proc/self/maps", "rb") as handle:
            line = next((entry for entry in handle if entry.rstrip().endswith(b"[vdso]")), None)
        if line is None:
            return 0, None
        low, high = (int(x, 16) for x in line.split()[0].split(b"-"))
        image = ctypes.string_at(low, high - low)
        return high - low, read_elf_symbols(lambda offset, size: image[offset : offset + size])
    except (OSError, ValueError, ElfFormatError, struct.error):
        return 0, None


class FileSource(Protocol):
    """Where ProcessSymbols gets a mapping's symbols: MappedFiles (the door), or a test's fake."""

    def key(self, pid: int, mapping: ExecMapping) -> FileKey | None: ...
    def symbols(self, pid: int, mapping: ExecMapping, key: FileKey) -> ElfSymbols | None: ...


class MappedFiles:
    """The door to a live process's mapped ELF files: map_files only (the default FileSource)."""

    def __init__(self, cache: SymbolCache = SYMBOL_CACHE) -> None:
        self.cache = cache

    def key(self, pid: int, mapping: ExecMapping) -> FileKey | None:
        """The mapped file's identity (a stat through map_files, within safeio's deadline: nothing opened),
        or None when it is gone, or its file system did not answer (refused with a warning)."""
        try:
            return file_key(safeio.stat_map_file(pid, mapping.start, mapping.end, mapping.device))
        except OSError:
            return None

    def symbols(self, pid: int, mapping: ExecMapping, key: FileKey) -> ElfSymbols | None:
        """The mapped file's symbols (cached by ``key``), or None."""
        return self.cache.get(key, lambda: self._load(pid, mapping))

    @staticmethod
    def _load(pid: int, mapping: ExecMapping) -> ElfSymbols | None:
        fd, _info = safeio.open_map_file(pid, mapping.start, mapping.end, device=mapping.device)  # OSError: get
        try:
            return _read_fd_symbols(pid, f"/proc/{pid}/map_files/{mapping.start:x}-{mapping.end:x}", fd)
        finally:
            os.close(fd)


class ProcessSymbols(FrameMemo):
    """The symbols of one live process: its executable mappings (read once, bounded), their ELF symbol
    tables through map_files (shared by file), its perf map (``set_perf_map``; else its own map read once,
    through perfmap's checks, on the first address outside its files).

    ``eager=True`` loads every mapping's table now, so it still names the process after it exits.
    """

    def __init__(
        self,
        pid: int,
        eager: bool = False,
        *,
        maps: MapsRead | None = None,
        files: FileSource | None = None,
    ) -> None:
        self.pid = pid
        self.perf_map: PerfMapLike | None = None
        self._memo: dict[int, Frame] = {}
        self._files: FileSource = files if files is not None else MappedFiles()
        read = maps if maps is not None else read_maps(pid)  # its caps' warnings given by the reader
        self._mappings = read.mappings
        self._starts = [m.start for m in self._mappings]
        self._file_ranges = [(m.start, m.end) for m in self._mappings if not m.is_vdso]
        self._keys: dict[int, FileKey | None] = {}  # mapping start -> its file's identity
        self._tables: dict[int, ElfSymbols | None] = {}  # mapping start -> its symbols
        self._own_map: PerfMap | None = None
        self._own_read = False
        self._held: dict[int, int] = {}  # id -> cost of the distinct tables it holds (PROCESS_SYMBOLS_BUDGET)
        for mapping in self._mappings:
            if not mapping.is_vdso:
                self._keys[mapping.start] = self._files.key(pid, mapping)
        if eager:
            for mapping in self._mappings:
                self._table(mapping)

    def _mapping(self, addr: int) -> ExecMapping | None:
        index = bisect.bisect_right(self._starts, addr) - 1
        if index >= 0 and addr < self._mappings[index].end:
            return self._mappings[index]
        return None

    def _in_file(self, addr: int) -> bool:
        mapping = self._mapping(addr)
        return mapping is not None and not mapping.is_vdso

    def _table(self, mapping: ExecMapping) -> ElfSymbols | None:
        if mapping.start in self._tables:
            return self._tables[mapping.start]
        if mapping.is_vdso:
            size, table = own_vdso()
            table = table if size == mapping.end - mapping.start else None
        elif sum(self._held.values()) >= PROCESS_SYMBOLS_BUDGET:
            shown = f"/proc/{self.pid}/map_files"
            message = f"its mapped files' symbol tables over the budget of {PROCESS_SYMBOLS_BUDGET} bytes"
            safeio.warn(self.pid, shown, f"pid {self.pid}: {shown}: {message}; the other files' frames unnamed")
            table = None
        else:
            key = self._keys.get(mapping.start)
            table = self._files.symbols(self.pid, mapping, key) if key is not None else None
            if table is not None:
                self._held[id(table)] = table.cost
        self._tables[mapping.start] = table
        return table

    def resolve_native(self, addr: int) -> None:
        """FrameMemo.resolve_native for pcs in a file mapping only (JIT code, stubs: never native)."""
        if self._file_ranges and not self._in_file(addr):
            return
        super().resolve_native(addr)

    def _native_name(self, mapping: ExecMapping, addr: int) -> str | None:
        table = self._table(mapping)
        if table is None:
            return None
        vaddr = table.vaddr_of(addr - mapping.start + mapping.offset)
        return table.lookup(vaddr) if vaddr is not None else None

    def _jit_name(self, addr: int, in_file: bool) -> str | None:
        """The perf map set by the folder first, then (for anonymous memory: a batch during the window never
        reads it) the process's own map as read once."""
        name = self.perf_map.lookup(addr) if self.perf_map is not None else None
        if name is None and not in_file:
            if not self._own_read:
                self._own_map, self._own_read = read_perf_map(self.pid), True
            if self._own_map is not None:
                name = self._own_map.lookup(addr)
        return name

    def _resolve(self, addr: int) -> Frame:
        mapping = self._mapping(addr)
        if mapping is not None:
            name = self._native_name(mapping, addr)
            if name is not None:
                return Frame(demangle(name), "native", mapping.name)
        jit_name = self._jit_name(addr, mapping is not None)
        if jit_name is not None:
            return Frame(java_frame_name(jit_name), "jit")
        if mapping is not None:
            label = mapping.name if mapping.is_vdso else f"[{mapping.name}]" if mapping.name else UNKNOWN
            return Frame(label, "native")
        if self._file_ranges:
            return Frame(UNKNOWN, "anon")
        return Frame(UNKNOWN, "unknown")

    def close(self) -> None:
        self._tables.clear()
        self._held.clear()
        self._own_map, self._own_read = None, True


__all__ = ["FileSource", "MappedFiles", "MapsRead", "ProcessSymbols", "SymbolCache", "parse_maps_stream", "read_maps"]
