"""Function symbols of an ELF file on disk, for naming native frames of a process that is gone
(``profiler recover``), and the ELF reader of live ones (profiler/symbols/procsyms.py): this module's
OfflineSymbols needs only a saved copy of the process's /proc/PID/maps and the files it names.

An address of the process is turned into a file offset by its mapping, then into the ELF's virtual
address by the PT_LOAD segment that holds that offset, then named by the nearest function symbol of
``.symtab`` (or ``.dynsym`` when the file is stripped) that covers it. C++ names are demangled with the
C++ runtime's ``__cxa_demangle`` as bcc does, so frames read the same as in a live capture. Every read
is bounded (safeio.BoundedReader, SYMTAB_MAX_BYTES) and its work linear in the bytes read: names are
decoded only when looked up, at most NAME_MAX_BYTES each.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import os
import stat
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, TypeAlias

from ..files.safeio import BoundedReader, open_without_links
from .frames import UNKNOWN, Frame, FrameMemo, java_frame_name
from .perfmap import PerfMapLike

SHT_SYMTAB, SHT_DYNSYM, SHT_NOTE = 2, 11, 7
STT_FUNC, STT_GNU_IFUNC = 2, 10
PT_LOAD, PT_NOTE = 1, 4
NT_GNU_BUILD_ID = 3
_SYMBOL = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
NAME_MAX_BYTES = 4096  # a symbol's name as decoded (longer: cut); bounds each lookup's scan of the string table
SYMTAB_MAX_BYTES = 24 << 20  # a symbol table read (1 M symbols; libjvm.so's: 1.4 MB): larger, .dynsym instead
STRTAB_MAX_BYTES = 32 << 20  # its string table (libjvm.so's: 2.7 MB)
NOTES_MAX_BYTES = 4096  # the notes a build-id is looked for in


class ElfFormatError(ValueError):
    """Not a 64-bit little-endian ELF, or its headers point outside the file."""


@dataclass(frozen=True)
class ElfSymbols:
    """Function symbols of one ELF, sorted by address, and its loadable segments.

    Names stay in the ELF's string table, each decoded when looked up (at most NAME_MAX_BYTES from its
    offset): reading a table costs time linear in its bytes whatever its string table holds."""

    starts: array[int]
    sizes: array[int]
    name_offsets: array[int]
    strings: bytes
    segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_vaddr, p_filesz) of each PT_LOAD
    build_id: bytes = b""
    from_symtab: bool = False  # the full .symtab (else .dynsym, or nothing)
    refused: str = ""  # why a .symtab present was not read (over its limit), for the caller's warning

    @property
    def cost(self) -> int:
        """The bytes it holds, about (a cache's budget)."""
        return len(self.strings) + 24 * len(self.starts) + 200

    def vaddr_of(self, file_offset: int) -> int | None:
        for p_offset, p_vaddr, p_filesz in self.segments:
            if p_offset <= file_offset < p_offset + p_filesz:
                return file_offset - p_offset + p_vaddr
        return None

    def name_at(self, index: int) -> str:
        start = self.name_offsets[index]
        end = self.strings.find(b"\0", start, start + NAME_MAX_BYTES)
        if end < 0:
            end = min(len(self.strings), start + NAME_MAX_BYTES)
        return self.strings[start:end].decode("utf-8", "replace")

    def lookup(self, vaddr: int) -> str | None:
        """The function whose [start, start + size) holds ``vaddr`` (a size-0 symbol, such as ``_init``: only
        its start, as bcc names them; the PLT after ``_init`` is not ``_init``)."""
        index = bisect.bisect_right(self.starts, vaddr) - 1
        if index < 0:
            return None
        if vaddr >= self.starts[index] + max(self.sizes[index], 1):
            return None
        return self.name_at(index)


def read_elf_symbols(read_at: Callable[[int, int], bytes]) -> ElfSymbols:
    """ElfSymbols through ``read_at(offset, size)`` (pure: tests pass bytes, callers a file)."""
    header = read_at(0, 64)
    if len(header) < 64 or header[:4] != b"\x7fELF":
        raise ElfFormatError("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise ElfFormatError("not a 64-bit little-endian ELF")
    phoff, shoff = struct.unpack_from("<QQ", header, 32)
    phentsize, phnum, shentsize, shnum, _shstrndx = struct.unpack_from("<HHHHH", header, 54)
    segments, notes = [], []
    program_headers = read_at(phoff, phnum * phentsize) if phentsize >= 56 else b""
    for index in range(len(program_headers) // max(phentsize, 1)):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", program_headers, index * phentsize
        )
        if p_type == PT_LOAD:
            segments.append((p_offset, p_vaddr, p_filesz))
        elif p_type == PT_NOTE:
            notes.append((p_offset, p_filesz))
    sections = read_at(shoff, shnum * shentsize) if shoff and shentsize >= 64 else b""
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", sections, i * shentsize) for i in range(len(sections) // max(shentsize, 1))
    ]
    notes += [(section[4], section[5]) for section in headers if section[1] == SHT_NOTE]
    build_id = _build_id(read_at, notes)
    refused = ""
    symtab = _symbol_table(headers, SHT_SYMTAB)
    if symtab is not None and (symtab[0][5] > SYMTAB_MAX_BYTES or symtab[1][5] > STRTAB_MAX_BYTES):
        refused = f".symtab of {symtab[0][5]} bytes and its names {symtab[1][5]}, over the limits"
        symtab = None
    dynsym = _symbol_table(headers, SHT_DYNSYM)
    if dynsym is not None and (dynsym[0][5] > SYMTAB_MAX_BYTES or dynsym[1][5] > STRTAB_MAX_BYTES):
        dynsym = None
    found = [_functions(read_at, table) for table in (symtab, dynsym) if table is not None]
    starts, sizes, offsets, strings = merge_functions(found)
    return ElfSymbols(starts, sizes, offsets, strings, tuple(segments), build_id, symtab is not None, refused)


Functions: TypeAlias = "tuple[array[int], array[int], array[int], bytes]"  # starts, sizes, name offsets, strings


def _functions(read_at: Callable[[int, int], bytes], table: tuple[tuple[int, ...], tuple[int, ...]]) -> Functions:
    """(starts, sizes, name offsets, string table) of a symbol table's named functions, in its order. One
    pass over the symbols: no name is read."""
    symtab, strtab = table
    data, strings = read_at(symtab[4], symtab[5]), read_at(strtab[4], strtab[5])
    starts, sizes, offsets = array("Q"), array("Q"), array("Q")
    limit = len(strings)
    for name_at, info, _other, shndx, value, size in _SYMBOL.iter_unpack(data[: len(data) // 24 * 24]):
        if info & 0xF not in (STT_FUNC, STT_GNU_IFUNC) or shndx == 0 or value == 0:
            continue
        if name_at >= limit or strings[name_at] == 0:
            continue
        starts.append(value)
        sizes.append(size)
        offsets.append(name_at)
    return starts, sizes, offsets, strings


def merge_functions(tables: list[Functions]) -> Functions:
    """One function per start, sorted. Of the aliases at one start, the largest; of equal sizes, the name
    with the fewest leading underscores (``clone3``, not ``__clone3``; ``setlocale``, not ``__GI_setlocale``),
    then the one of the latest table (``.dynsym`` after ``.symtab``: the exported name), then the first. The
    string tables are joined: a merge costs one sort and one pass (an alias's name read at most 16 bytes)."""
    all_starts, all_sizes, all_offsets, ranks = array("Q"), array("Q"), array("Q"), array("B")
    joined = b""
    for rank, (starts, sizes, offsets, strings) in enumerate(tables):
        shift = len(joined)
        all_starts.extend(starts)
        all_sizes.extend(sizes)
        all_offsets.extend(offset + shift for offset in offsets)
        ranks.extend(bytes([rank]) * len(starts))
        joined += strings

    def preference(index: int) -> tuple[int, int, int]:
        head = joined[all_offsets[index] : all_offsets[index] + 16]
        return all_sizes[index], len(head.lstrip(b"_")) - len(head), ranks[index]

    order = sorted(range(len(all_starts)), key=all_starts.__getitem__)  # stable: the first of equals first
    starts, sizes, offsets = array("Q"), array("Q"), array("Q")
    chosen: list[int] = []
    for index in order:
        if starts and starts[-1] == all_starts[index]:
            if preference(index) > preference(chosen[-1]):
                sizes[-1], offsets[-1], chosen[-1] = all_sizes[index], all_offsets[index], index
            continue
        starts.append(all_starts[index])
        sizes.append(all_sizes[index])
        offsets.append(all_offsets[index])
        chosen.append(index)
    return starts, sizes, offsets, joined


def merged(primary: ElfSymbols, exported: ElfSymbols) -> ElfSymbols:
    """``primary``'s functions (a debug file's .symtab) with ``exported``'s (the mapped file's .dynsym, whose
    names win at equal starts), and ``exported``'s segments and build-id (those of the file mapped)."""
    both = merge_functions([
        (primary.starts, primary.sizes, primary.name_offsets, primary.strings),
        (exported.starts, exported.sizes, exported.name_offsets, exported.strings),
    ])  # fmt: skip
    return ElfSymbols(*both, exported.segments, exported.build_id, True, exported.refused)


def _build_id(read_at: Callable[[int, int], bytes], notes: list[tuple[int, int]]) -> bytes:
    """The GNU build-id of the first note area holding one (each read at most NOTES_MAX_BYTES)."""
    for offset, size in notes:
        try:
            data = read_at(offset, min(size, NOTES_MAX_BYTES))
        except ValueError:
            continue
        at = 0
        while at + 12 <= len(data):
            namesz, descsz, kind = struct.unpack_from("<III", data, at)
            name_end = at + 12 + (namesz + 3) // 4 * 4
            desc_end = name_end + (descsz + 3) // 4 * 4
            if desc_end > len(data):
                break
            if kind == NT_GNU_BUILD_ID and data[at + 12 : at + 12 + namesz] == b"GNU\0" and 0 < descsz <= 64:
                return data[name_end : name_end + descsz]
            at = desc_end
    return b""


def _symbol_table(headers: list[tuple[int, ...]], kind: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(symbol table section, its string table section) of the first section of ``kind``."""
    for section in headers:
        if section[1] == kind and section[6] < len(headers):
            return section, headers[section[6]]
    return None


def read_elf_file(handle: BinaryIO) -> ElfSymbols:
    """read_elf_symbols of an open file, every read inside it and bounded (safeio.BoundedReader)."""
    return read_elf_symbols(BoundedReader.of(handle.fileno()).read_at)


@lru_cache(maxsize=256)
def symbols_of_file(path: str) -> ElfSymbols | None:
    """The file's symbols, parsed once per recovery; None when it is gone or not an ELF."""
    try:
        # no link (anywhere on the path: the saved mapping's path was resolved), FIFO or device of a
        # tenant's is followed or waited on
        fd = open_without_links(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return read_elf_file(handle)
    except (OSError, ElfFormatError, ValueError, IndexError, struct.error):
        return None


@lru_cache(maxsize=1)
def _cxa_demangle() -> Callable[..., int] | None:
    try:
        runtime = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        function = runtime.__cxa_demangle
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return function  # type: ignore[no-any-return]


def demangle(name: str) -> str:
    """A C++ symbol demangled (``_ZN10JavaThread3runEv`` -> ``JavaThread::run()``); others unchanged."""
    function = _cxa_demangle()
    if function is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(0)
    result = function(name.encode(), None, None, ctypes.byref(status))
    if not result or status.value != 0:
        return name
    try:
        return ctypes.string_at(result).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(result))


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str  # "" for anonymous memory


def parse_maps(text: str) -> list[Mapping]:
    """The mappings of a /proc/PID/maps text (malformed lines skipped)."""
    found = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "-" not in parts[0]:
            continue
        try:
            low, high = (int(x, 16) for x in parts[0].split("-", 1))
            offset = int(parts[2], 16)
        except ValueError:
            continue
        found.append(Mapping(low, high, offset, parts[5].strip() if len(parts) == 6 else ""))
    return sorted(found, key=lambda m: m.start)


class OfflineSymbols(FrameMemo):
    """Names addresses of a process that is gone, from its saved maps, the ELF files on disk and the
    perf-map version set by StackFolder (the ProcessSymbols interface, without the live process)."""

    def __init__(self, maps_text: str, symbols_of: Callable[[str], ElfSymbols | None] = symbols_of_file) -> None:
        self.mappings = parse_maps(maps_text)
        self._starts = [m.start for m in self.mappings]
        self._symbols_of = symbols_of
        self.perf_map: PerfMapLike | None = None
        self._memo: dict[int, Frame] = {}

    def _mapping(self, addr: int) -> Mapping | None:
        index = bisect.bisect_right(self._starts, addr) - 1
        if index >= 0 and addr < self.mappings[index].end:
            return self.mappings[index]
        return None

    def _resolve(self, addr: int) -> Frame:
        mapping = self._mapping(addr)
        if mapping is not None and mapping.path.startswith("/") and not _is_perf_map(mapping.path):
            symbols = self._symbols_of(mapping.path)
            vaddr = symbols.vaddr_of(addr - mapping.start + mapping.offset) if symbols is not None else None
            name = symbols.lookup(vaddr) if symbols is not None and vaddr is not None else None
            if name is not None:
                return Frame(demangle(name), "native")
            return Frame(f"[{os.path.basename(mapping.path)}]", "native")
        jit_name = self.perf_map.lookup(addr) if self.perf_map is not None else None
        if jit_name is not None:
            return Frame(java_frame_name(jit_name), "jit")
        return Frame(UNKNOWN, "anon" if self.mappings else "unknown")

    def close(self) -> None:
        return None


def _is_perf_map(path: str) -> bool:
    name = Path(path).name
    return name.startswith("perf-") and name.endswith(".map")


__all__ = ["ElfSymbols", "OfflineSymbols", "demangle", "parse_maps", "read_elf_symbols", "symbols_of_file"]
