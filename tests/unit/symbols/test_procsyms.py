"""Native frames of a live process without a library that opens the target's paths (profiler/symbols/procsyms.py):
its maps read streaming within caps, crafted ELF files read in time linear in their bytes, symbol tables
shared by file, build-id debug files only from the host's directory and only when they match."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.files import procread, safeio
from profiler.symbols import elfsyms, procsyms
from profiler.symbols.elfsyms import ElfSymbols, read_elf_symbols
from profiler.symbols.procsyms import (
    ExecMapping,
    FileKey,
    MapsRead,
    ProcessSymbols,
    SymbolCache,
    parse_maps_stream,
)

PID = 4242
STT_FUNC, STT_OBJECT = 2, 1


# ---------------------------------------------------------------- a crafted ELF


def make_elf(
    symbols: list[tuple[int, int, int, int]],
    strings: bytes,
    build_id: bytes = b"",
    kind: int = elfsyms.SHT_SYMTAB,
    dynsym: list[tuple[int, int, int, int]] | None = None,
) -> bytes:
    """A 64-bit ELF with one PT_LOAD (file offset = vaddr), a symbol table of (name offset, value, size, type)
    and its string table, optionally a .dynsym beside it and a GNU build-id note."""
    note = b""
    if build_id:
        note = struct.pack("<III", 4, len(build_id), elfsyms.NT_GNU_BUILD_ID) + b"GNU\0" + build_id
        note += b"\0" * (-len(note) % 4)
    tables = [(kind, symbols, strings)] + ([(elfsyms.SHT_DYNSYM, dynsym, strings)] if dynsym is not None else [])
    phnum = 2 if note else 1
    at = 64 + 56 * phnum
    note_at = at
    at += len(note)
    blobs, sections = [], [b"\0" * 64]
    for table_kind, entries, names in tables:
        data = b"".join(
            struct.pack("<IBBHQQ", name, kind_ & 0xF, 0, 1, value, size) for name, value, size, kind_ in entries
        )
        data_at, names_at = at, at + len(data)
        at = names_at + len(names)
        blobs += [data, names]
        link = len(sections) + 1
        sections.append(struct.pack("<IIQQQQIIQQ", 0, table_kind, 0, 0, data_at, len(data), link, 0, 8, 24))
        sections.append(struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, names_at, len(names), 0, 0, 1, 0))
    shoff = at
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, shoff, 0, 64, 56, phnum, 64, len(sections), 0)
    span = 1 << 20  # the text the symbols lie in (the loader would map it; the reader only needs the header)
    program = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, span, span, 0x1000)
    if note:
        program += struct.pack("<IIQQQQQQ", 4, 4, note_at, note_at, note_at, len(note), len(note), 4)
    return header + program + note + b"".join(blobs) + b"".join(sections)


def reader(image: bytes) -> ElfSymbols:
    return read_elf_symbols(safeio_reader(image))


def safeio_reader(image: bytes):  # type: ignore[no-untyped-def]
    """read_at over bytes with BoundedReader's rule: a read outside the image is a ValueError."""

    def read_at(offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(image):
            raise ValueError("outside")
        return image[offset : offset + size]

    return read_at


NAMES = b"\0start_thread\0_ZN10JavaThread3runEv\0__clone3\0data\0_init\0"


def name_at(name: bytes) -> int:
    return NAMES.index(name + b"\0")


def test_functions_are_named_and_demangled_through_the_process_interface() -> None:
    # GIVEN a library with three functions and a data symbol, mapped at 0x7f0000000000 from file offset 0
    image = make_elf(
        [
            (name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC),
            (name_at(b"_ZN10JavaThread3runEv"), 0x2000, 0x80, STT_FUNC),
            (name_at(b"clone3"), 0x3000, 0x100, STT_FUNC),
            (name_at(b"_init"), 0x4000, 0, STT_FUNC),  # size 0: only its start, as bcc names it
            (name_at(b"data"), 0x2800, 0x10, STT_OBJECT),
        ],
        NAMES,
    )
    files = FakeFiles({"/lib/libfake.so": image})
    base = 0x7F0000000000
    maps = maps_of(f"{base:x}-{base + 0x10000:x} r-xp 00000000 fd:01 77 /lib/libfake.so\n")
    symbols = ProcessSymbols(PID, maps=maps, files=files)
    # THEN C and C++ names come out as bcc gave them, with the module's name
    assert symbols.resolve(base + 0x1010).name == "start_thread"
    assert symbols.resolve(base + 0x2010) == procsyms.Frame("JavaThread::run()", "native", "libfake.so")
    assert symbols.resolve(base + 0x3050).name == "clone3"
    assert symbols.resolve(base + 0x4000).name == "_init" and symbols.resolve(base + 0x4010).name == "[libfake.so]"
    # AND an address of the file in no function is the module's label; outside any file, anonymous
    assert symbols.resolve(base + 0x2900).name == "[libfake.so]"
    assert symbols.resolve(0x1000).kind == "anon"


def test_a_crafted_string_table_costs_time_linear_in_its_bytes() -> None:
    # GIVEN 300,000 function symbols whose names all start at offset 1 of an 8 MB string table without a
    # NUL (the old reader scanned from each name to the table's end: 300,000 x 8 MB)
    strings = b"\0" + b"A" * (8 << 20)
    entries = [(1, 0x1000 + 16 * i, 16, STT_FUNC) for i in range(300_000)]
    image = make_elf(entries, strings)
    # WHEN it is read and every one of its functions looked up
    began = time.process_time()
    symbols = reader(image)
    names = {symbols.lookup(0x1000 + 16 * i) for i in range(0, 300_000, 100)}
    spent = time.process_time() - began
    # THEN in about a second, each name cut at NAME_MAX_BYTES
    assert len(symbols.starts) == 300_000
    assert names == {"A" * elfsyms.NAME_MAX_BYTES}
    assert spent < 10, spent


def test_one_symbol_per_address_the_largest_and_names_past_the_table_dropped() -> None:
    image = make_elf(
        [
            (name_at(b"clone3"), 0x1000, 0x10, STT_FUNC),
            (name_at(b"start_thread"), 0x1000, 0x40, STT_FUNC),
            (name_at(b"data"), 0x1000, 0x40, STT_FUNC),  # as large, as few underscores: the first stays
            (name_at(b"__clone3"), 0x3000, 0x40, STT_FUNC),
            (name_at(b"clone3"), 0x3000, 0x40, STT_FUNC),  # an alias with fewer underscores wins
            (len(NAMES) + 5, 0x5000, 0x10, STT_FUNC),  # its name outside the string table
            (0, 0x6000, 0x10, STT_FUNC),  # an empty name
        ],
        NAMES,
    )
    symbols = reader(image)
    assert list(symbols.starts) == [0x1000, 0x3000]
    assert symbols.lookup(0x1030) == "start_thread" and symbols.lookup(0x1040) is None
    assert symbols.lookup(0x3010) == "clone3"


def test_an_oversized_symtab_falls_back_to_dynsym_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    image = make_elf(
        [(name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC)] * 50,
        NAMES,
        dynsym=[(name_at(b"clone3"), 0x1000, 0x100, STT_FUNC)],
    )
    monkeypatch.setattr(elfsyms, "SYMTAB_MAX_BYTES", 24 * 10)
    symbols = reader(image)
    assert symbols.lookup(0x1001) == "clone3" and not symbols.from_symtab
    assert "over the limits" in symbols.refused


def test_junk_and_headers_pointing_outside_are_no_symbols() -> None:
    with pytest.raises(ValueError):
        reader(b"\x7fELF" + b"\0" * 10)
    image = bytearray(make_elf([(1, 0x1000, 0x10, STT_FUNC)], NAMES))
    image[0x28:0x30] = (1 << 40).to_bytes(8, "little")  # e_shoff a terabyte away
    with pytest.raises(ValueError):
        reader(bytes(image))


# ---------------------------------------------------------------- maps, streamed within caps


def maps_of(text: str) -> MapsRead:
    return parse_maps_stream(iter([text.encode()]), PID)


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    return (data[at : at + size] for at in range(0, len(data), size))


HONEST = (
    b"55d0a0000000-55d0a0001000 r--p 00000000 fd:01 11 /usr/bin/java\n"
    b"55d0a0001000-55d0a0002000 r-xp 00001000 fd:01 11 /usr/bin/java\n"
    b"7f0000000000-7f0000100000 rwxp 00000000 00:00 0 \n"
    b"7f1000000000-7f1000200000 r-xp 00000000 fd:01 12 /lib/libjvm.so (deleted)\n"
    b"7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n"
)


def test_maps_give_executable_file_mappings_and_the_vdso_whatever_the_chunking() -> None:
    expected = parse_maps_stream(iter([HONEST])).mappings
    assert [(m.start, m.offset, m.name) for m in expected] == [
        (0x55D0A0001000, 0x1000, "java"),
        (0x7F1000000000, 0, "libjvm.so"),
        (0x7FFF00000000, 0, "[vdso]"),
    ]
    for size in (1, 7, 64):
        assert parse_maps_stream(chunked(HONEST, size)).mappings == expected


def test_a_20_kb_maps_line_keeps_its_range_and_file_name_with_one_warning() -> None:
    # GIVEN a mapping under ~80 nested directories of 250 characters: a 20 KB line between honest ones
    deep = "/".join(["d" * 250] * 80)
    line = f"7f2000000000-7f2000001000 r-xp 00000000 fd:01 99 /{deep}/libevil.so\n".encode()
    data = HONEST + line + HONEST.replace(b"7f", b"6f")
    for size in (3, 4096, 1 << 16):
        safeio.take_warnings()
        read = parse_maps_stream(chunked(data, size), PID)
        # THEN the mapping is known by its range and file name (its symbols still come through map_files)
        evil = [m for m in read.mappings if m.start == 0x7F2000000000]
        assert [(m.end, m.name, m.path) for m in evil] == [(0x7F2000001000, "libevil.so", "")]
        assert len(read.mappings) == 7 and read.capped
        # AND one warning (procread's maps reader) names the file, the line's size and the cap
        warnings = safeio.take_warnings()
        assert len(warnings) == 1 and "\n" not in warnings[0]
        assert warnings[0].startswith(f"pid {PID}: /proc/{PID}/maps: 1 line(s) of up to {len(line) - 1} bytes")
        assert f"{procread.MAPS_LINE_MAX_BYTES} (MAPS_LINE_MAX_BYTES" in warnings[0]


def test_too_many_mappings_or_bytes_stop_the_read_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    safeio.take_warnings()
    monkeypatch.setattr(procread, "MAPS_MAX_MAPPINGS", 3)
    read = parse_maps_stream(iter([HONEST]), PID)
    assert read.capped and len(read.mappings) == 1
    assert safeio.take_warnings() == [
        f"pid {PID}: /proc/{PID}/maps: more than 3 mappings (MAPS_MAX_MAPPINGS); only the first 3 read"
    ]
    monkeypatch.setattr(procread, "MAPS_MAX_MAPPINGS", 65_536)
    monkeypatch.setattr(procsyms, "EXEC_MAPPINGS_MAX", 2)
    read = parse_maps_stream(iter([HONEST]), PID)
    assert read.capped and len(read.mappings) == 2
    (warning,) = safeio.take_warnings()
    assert "more than 2 executable mappings (EXEC_MAPPINGS_MAX)" in warning
    monkeypatch.setattr(procsyms, "EXEC_MAPPINGS_MAX", 8192)
    monkeypatch.setattr(procread, "MAPS_MAX_BYTES", 100)
    own = procsyms.read_maps(os.getpid())  # the real file, read in chunks: cut at the cap
    assert own.capped and len(own.mappings) <= 1  # at most one line fits in 100 bytes
    (warning,) = safeio.take_warnings()
    assert warning == (
        f"pid {os.getpid()}: /proc/{os.getpid()}/maps: more than 100 bytes (MAPS_MAX_BYTES); only the first 100 read"
    )


def test_a_process_stops_reading_tables_past_its_budget_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a process mapping five distinct libraries, each table costing more than a fifth of the budget
    image = make_elf([(name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC)], NAMES)
    paths = [f"/lib/lib{index}.so" for index in range(5)]
    files = FakeFiles(dict.fromkeys(paths, image))
    maps = "".join(
        f"7f{index}000000000-7f{index}000010000 r-xp 00000000 fd:01 1{index} {path}\n"
        for index, path in enumerate(paths)
    )
    monkeypatch.setattr(procsyms, "PROCESS_SYMBOLS_BUDGET", 2 * reader(image).cost + 1)
    safeio.take_warnings()
    # WHEN it is prepared
    symbols = ProcessSymbols(PID, eager=True, maps=maps_of(maps), files=files)
    # THEN three tables were read, the others' frames are their module's label, and one warning says why
    assert len(files.opened) == 3
    assert symbols.resolve(0x7F2000001001).name == "start_thread"
    assert symbols.resolve(0x7F4000001001).name == "[lib4.so]"
    [warning] = safeio.take_warnings()
    assert warning.startswith(f"pid {PID}: /proc/{PID}/map_files: ") and "over the budget" in warning


def test_a_process_with_an_over_long_maps_line_is_warned_once() -> None:
    deep = "/".join(["d" * 250] * 30)
    line = f"7f2000000000-7f2000001000 r-xp 00000000 fd:01 99 /{deep}/libevil.so\n"
    safeio.take_warnings()
    ProcessSymbols(PID, maps=maps_of(line), files=FakeFiles({}))
    ProcessSymbols(PID, maps=maps_of(line), files=FakeFiles({}))
    [warning] = safeio.take_warnings()
    assert warning.startswith(f"pid {PID}: /proc/{PID}/maps: ")


# ---------------------------------------------------------------- tables shared by file


class FakeFiles:
    """procsyms.FileSource over images by path (the real one opens /proc/PID/map_files, never a path);
    every path is one file identity, shared through one SymbolCache."""

    def __init__(self, images: dict[str, bytes], cache: SymbolCache | None = None) -> None:
        self.images = images
        self.cache = cache if cache is not None else SymbolCache()
        self.opened: list[str] = []

    def key(self, pid: int, mapping: ExecMapping) -> FileKey | None:
        image = self.images.get(mapping.path)
        return None if image is None else (1, hash(mapping.path) & 0xFFFF, len(image), 0)

    def symbols(self, pid: int, mapping: ExecMapping, key: FileKey) -> ElfSymbols | None:
        def load() -> ElfSymbols:
            self.opened.append(mapping.path)
            return reader(self.images[mapping.path])

        return self.cache.get(key, load)


def test_several_processes_share_one_table_per_file_and_eager_loads_before_exit() -> None:
    image = make_elf([(name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC)], NAMES)
    files = FakeFiles({"/lib/libjvm.so": image})
    maps = maps_of("7f0000000000-7f0000010000 r-xp 00000000 fd:01 12 /lib/libjvm.so\n")
    # WHEN three JVMs are prepared eagerly
    caches = [ProcessSymbols(pid, eager=True, maps=maps, files=files) for pid in (1, 2, 3)]
    # THEN the file was read once, and each names its frames with it even once the file is gone
    files.images.clear()
    assert files.opened == ["/lib/libjvm.so"]
    assert {c.resolve(0x7F0000001001).name for c in caches} == {"start_thread"}


def test_the_cache_drops_the_least_recent_past_its_budget_and_forgets_failed_opens() -> None:
    cache = SymbolCache(budget=1)
    table = reader(make_elf([(1, 0x1000, 0x10, STT_FUNC)], NAMES))
    assert cache.get((1, 1, 1, 1), lambda: table) is table
    assert cache.get((2, 2, 2, 2), lambda: table) is table
    calls: list[int] = []

    def failing() -> ElfSymbols:
        calls.append(1)
        raise OSError("gone")

    assert cache.get((3, 3, 3, 3), failing) is None and cache.get((3, 3, 3, 3), failing) is None
    assert len(calls) == 2  # not kept: the next process that maps it tries again
    assert cache.get((1, 1, 1, 1), lambda: None) is None  # dropped by the budget, loaded again


def test_jit_code_is_named_by_the_perf_map_set_then_by_the_process_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.symbols.perfmap import parse_perf_map

    read: list[int] = []
    monkeypatch.setattr(
        procsyms, "read_perf_map", lambda pid: read.append(pid) or parse_perf_map(["1000 100 LFoo;::own\n"])
    )
    symbols = ProcessSymbols(PID, maps=maps_of(HONEST.decode()), files=FakeFiles({}))
    symbols.set_perf_map(parse_perf_map(["2000 100 Lcom/example/A;::set\n"]))
    assert symbols.resolve(0x2010).name == "com.example.A::set" and read == []
    symbols.resolve_native(0x55D0A0001010)  # in a file without symbols: its label, no perf map read
    assert symbols.resolve(0x55D0A0001010).name == "[java]" and read == []
    assert symbols.resolve(0x1010) == procsyms.Frame("Foo::own", "jit")
    assert symbols.resolve(0x5000).kind == "anon" and read == [PID]  # read once


# ---------------------------------------------------------------- build-id debug files


def test_a_build_id_debug_file_is_used_only_when_it_matches_and_is_the_hosts(tmp_path: Path) -> None:
    build_id = bytes.fromhex("93ac61ec5a8eb1396f9fbd350e3169a558528a40")
    debug = make_elf([(name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC)], NAMES, build_id)
    place = tmp_path / "93" / "ac61ec5a8eb1396f9fbd350e3169a558528a40.debug"
    place.parent.mkdir()
    place.write_bytes(debug)
    place.chmod(0o644)
    procsyms._debug_file_symbols.cache_clear()
    found = procsyms.debug_symbols(build_id, str(tmp_path))
    if os.geteuid() == 0:  # a root-owned, world-readable file: the host's
        assert found is not None and found.lookup(0x1001) == "start_thread"
    else:
        assert found is None  # not root's: refused
    # a file that is not world-readable, a link, another build-id: none used
    place.chmod(0o600)
    procsyms._debug_file_symbols.cache_clear()
    assert procsyms.debug_symbols(build_id, str(tmp_path)) is None
    place.chmod(0o644)
    other = bytes.fromhex("93" + "00" * 19)
    (tmp_path / "93" / ("00" * 19 + ".debug")).symlink_to(place)
    assert procsyms.debug_symbols(other, str(tmp_path)) is None
    (tmp_path / "93" / ("11" * 19 + ".debug")).write_bytes(debug)
    assert procsyms.debug_symbols(bytes.fromhex("93" + "11" * 19), str(tmp_path)) is None
    assert procsyms.debug_symbols(b"\x01", str(tmp_path)) is None


def test_the_vdso_is_named_from_the_agents_own_image() -> None:
    size, table = procsyms.own_vdso()
    assert size > 0 and table is not None
    names = {table.name_at(index) for index in range(len(table.starts))}
    assert any("clock_gettime" in name for name in names), names
