"""Fuzzing the parsers of a target's ELF files and memory files: .eh_frame/CFI, libjvm.so's symbols,
hsperfdata, /proc/PID/maps (profiler/unwind/), and the unwind-table cache's entries."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given
from hypothesis import strategies as st

from profiler.errors import VMStructsError
from profiler.files import safeio
from profiler.unwind import cfi, ehframe, tablecache
from profiler.unwind.hsperf import UNLOADED_CLASSES, _counter_offset
from profiler.unwind.vmstructs import TABLE_SYMBOLS, elf_symbols, libjvm_in_maps
from tests.unit.fuzz import crafted
from tests.unit.fuzz.corpus import DATA, corpus, fuzz_settings, seed

# what cfi.CfiLoader._table_for / _parse catch: the ELF's table is refused, the run goes on
CFI_REFUSALS = (ehframe.EhFrameError, struct.error, IndexError, ValueError)
# what vmstructs.read_layout catches around elf_symbols (and VMStructsError, the named refusal)
SYMBOL_REFUSALS = (VMStructsError, OSError, ValueError, IndexError, struct.error)

LIBC_EH_FRAME = next(DATA.glob("libc_eh_frame_*.bin"))
LIBC_EH_FRAME_ADDR = int(LIBC_EH_FRAME.stem.rsplit("_", 1)[1], 16)
EH_FRAME_SEEDS = [
    LIBC_EH_FRAME.read_bytes(),
    crafted.cie() + b"\0\0\0\0",
    crafted.eh_frame_distinct_cies(4, 64),
]
ELF_SEEDS = [seed("libjvm17_dynsym.elf"), crafted.elf_with_eh_frame(EH_FRAME_SEEDS[0], LIBC_EH_FRAME_ADDR)]
HSPERF_SEEDS = [crafted.hsperfdata({"sun.rt.createVmBeginTime": 1, UNLOADED_CLASSES: 3})] + [
    path.read_bytes() for path in sorted(DATA.glob("hsperfdata_*.bin"))
]
MAPS_SEEDS = [path.read_bytes() for path in sorted(DATA.glob("proc_maps_*.txt"))] or [
    b"7f0000000000-7f0000100000 r-xp 00000000 08:01 42 /usr/lib/jvm/x/lib/server/libjvm.so\n"
]


def _check_table(addresses: object, rules: list[ehframe.Rule]) -> None:
    values = list(addresses)  # type: ignore[call-overload]
    assert values == sorted(values) and len(values) == len(rules) <= ehframe.MAX_TABLE_ROWS


@fuzz_settings()
@given(corpus(EH_FRAME_SEEDS))
def test_eh_frame_section(section: bytes) -> None:
    try:
        addresses, rules = ehframe.table_for_elf(crafted.elf_with_eh_frame(section, LIBC_EH_FRAME_ADDR))
    except CFI_REFUSALS:
        return
    _check_table(addresses, rules)


@fuzz_settings()
@given(corpus(ELF_SEEDS))
def test_elf_headers_for_unwinding(image: bytes) -> None:
    try:
        info = ehframe.read_elf_info(image)
        addresses, rules = ehframe.build_table(ehframe.iter_fde_refs(info))
    except CFI_REFUSALS:
        return
    assert len(info.eh_frame) <= ehframe.EH_FRAME_MAX_BYTES
    _check_table(addresses, rules)


@contextmanager
def _memory_file(data: bytes) -> Iterator[safeio.BoundedReader]:
    fd = os.memfd_create("fuzz-elf")
    try:
        os.write(fd, data)
        yield safeio.BoundedReader(fd, len(data))
    finally:
        os.close(fd)


@fuzz_settings()
@given(corpus(ELF_SEEDS))
def test_libjvm_symbols(image: bytes) -> None:
    with _memory_file(image) as reader:
        try:
            found, _base = elf_symbols("fuzz", reader, TABLE_SYMBOLS)
        except SYMBOL_REFUSALS:
            return
    assert set(found) <= set(TABLE_SYMBOLS)


def test_the_libjvm_seed_names_every_vmstructs_symbol() -> None:
    # the seed is worth its bytes: unmutated, it finds what read_layout needs
    with _memory_file(seed("libjvm17_dynsym.elf")) as reader:
        found, _base = elf_symbols("seed", reader, TABLE_SYMBOLS)
    assert set(found) == set(TABLE_SYMBOLS)


@fuzz_settings()
@given(corpus(HSPERF_SEEDS), st.sampled_from([UNLOADED_CLASSES, "sun.rt.createVmBeginTime", ""]))
def test_hsperfdata(data: bytes, name: str) -> None:
    offset = _counter_offset(data, name)  # never raises: no counter is None
    assert offset is None or isinstance(offset, int)


def test_real_hsperfdata_seeds_have_the_unloads_counter() -> None:
    assert len(HSPERF_SEEDS) > 1  # the recorded JVM's file is there
    for data in HSPERF_SEEDS:
        offset = _counter_offset(data, UNLOADED_CLASSES)
        assert offset is not None and 0 <= offset <= len(data) - 8


@fuzz_settings()
@given(corpus(MAPS_SEEDS))
def test_proc_maps(raw: bytes) -> None:
    text = raw.decode("utf-8", "replace")
    for mapping in cfi.parse_maps(text):
        assert mapping.path.startswith("/") or mapping.path == "[vdso]"
    found = libjvm_in_maps(text.splitlines(keepends=True))
    assert found is None or found[0].endswith("/libjvm.so")


def test_the_maps_seed_holds_libjvm_and_code() -> None:
    text = MAPS_SEEDS[0].decode()
    assert libjvm_in_maps(text.splitlines(keepends=True)) is not None and cfi.parse_maps(text)


def _table_cache_seed() -> tuple[str, bytes]:
    info = ehframe.read_elf_info(crafted.elf_with_eh_frame(EH_FRAME_SEEDS[0], LIBC_EH_FRAME_ADDR))
    key = tablecache.table_key(info)
    return key, tablecache.encode(key, cfi.prepare_table("libc", info, 1 << 20, 1 << 20))


TABLE_CACHE_KEY, TABLE_CACHE_ENTRY = _table_cache_seed()


@fuzz_settings()
@given(corpus([TABLE_CACHE_ENTRY]), st.booleans())
def test_table_cache_entry(entry: bytes, checksum_fixed: bool) -> None:
    # an entry of root's own cache is still read back as input: damaged, it is a miss (TableCacheError), and
    # with a damaged payload whose checksum was made to match, only a table of the parser's shape is served
    if checksum_fixed and len(entry) > tablecache.HEADER.size:
        fields = list(tablecache.HEADER.unpack_from(entry))
        fields[-1] = hashlib.sha256(entry[tablecache.HEADER.size :]).digest()
        entry = tablecache.HEADER.pack(*fields) + entry[tablecache.HEADER.size :]
    try:
        table = tablecache.decode(entry, TABLE_CACHE_KEY)
    except tablecache.TableCacheError:
        return
    tablecache.check_shape(table)
    _check_table(table.addresses(), [ehframe.GAP] * table.row_count)
