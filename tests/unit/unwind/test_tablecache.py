"""The disk cache of prepared unwind tables (profiler/unwind/tablecache.py): a hit is the parse's own table, a
damaged, truncated or foreign entry is ignored and rewritten, the key follows the parser's bytes, and the
cache's size stays bounded."""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from profiler.files import privatecache
from profiler.unwind import cfi, ehframe, tablecache
from profiler.unwind.tablecache import TableCache

LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")


@pytest.fixture(scope="module")
def libc_info() -> ehframe.ElfInfo:
    with LIBC.open("rb") as handle:
        return ehframe.read_elf_file(handle)


@pytest.fixture(scope="module")
def libc_prepared(libc_info: ehframe.ElfInfo) -> cfi.PreparedTable:
    return cfi.prepare_table(str(LIBC), libc_info, 1 << 20, 1 << 20)


class _RecordingLoader(cfi.CfiLoader):
    """A CfiLoader whose BPF arrays are dicts of packed entries (what the maps would receive)."""

    def __init__(self, cache: TableCache | None) -> None:
        super().__init__(bpf=None, table_cache=cache)
        self.written: dict[bytes, bytes] = {}

    def _write_array(self, name: bytes, first: int, packed: bytes, size: int) -> None:
        self.written[name] = packed


def _parse(cache: TableCache | None, info: ehframe.ElfInfo) -> tuple[cfi.ElfTable, _RecordingLoader]:
    loader = _RecordingLoader(cache)
    return loader._parse(("libc",), str(LIBC), info), loader


def test_a_hit_gives_the_tables_the_parse_gives(tmp_path: Path, libc_info: ehframe.ElfInfo) -> None:
    cache = TableCache(tmp_path / "cfi")
    parsed, parsing = _parse(None, libc_info)
    cold, cold_loader = _parse(cache, libc_info)
    warm, warm_loader = _parse(TableCache(tmp_path / "cfi"), libc_info)
    assert not cold.from_cache and warm.from_cache and cache.misses == 1
    assert parsed.rows > 20_000 and parsed.cause is None
    for table in (cold, warm):
        assert (table.rows, table.pages, table.addresses, table.kinds) == (
            parsed.rows,
            parsed.pages,
            parsed.addresses,
            parsed.kinds,
        )
    assert cold_loader.written == warm_loader.written == parsing.written
    (entry,) = (tmp_path / "cfi").iterdir()
    assert (tmp_path / "cfi").stat().st_mode & 0o777 == 0o700 and entry.stat().st_mode & 0o777 == 0o600
    # compact: 9 bytes a row and 8 a page (the BPF layout), ~0.3 MB for libc
    assert entry.stat().st_size == tablecache.HEADER.size + 9 * parsed.rows + 8 * parsed.pages


def test_the_key_follows_the_bytes_the_parser_reads(libc_info: ehframe.ElfInfo) -> None:
    key = tablecache.table_key(libc_info)
    same = dataclasses.replace(libc_info, eh_frame=bytes(bytearray(libc_info.eh_frame)), exec_segments=())
    flipped = bytearray(libc_info.eh_frame)
    flipped[len(flipped) // 2] ^= 1
    assert tablecache.table_key(same) == key  # the segments and the file's identity are not the table's input
    assert tablecache.table_key(dataclasses.replace(libc_info, eh_frame=bytes(flipped))) != key
    assert tablecache.table_key(dataclasses.replace(libc_info, eh_frame_addr=libc_info.eh_frame_addr + 16)) != key


def _header_field(content: bytes, index: int, value: Any) -> bytes:
    fields = list(tablecache.HEADER.unpack_from(content))
    fields[index] = value
    return tablecache.HEADER.pack(*fields) + content[tablecache.HEADER.size :]


DAMAGES = {
    "truncated": lambda content, other: content[: len(content) // 2],
    "empty": lambda content, other: b"",
    "a flipped payload byte": lambda content, other: content[:-9] + bytes([content[-9] ^ 0x40]) + content[-8:],
    "another magic": lambda content, other: b"ELFELFEL" + content[8:],
    "another format": lambda content, other: _header_field(content, 1, tablecache.FORMAT_VERSION + 1),
    "a row count its size does not give": lambda content, other: _header_field(content, 2, 7),
    "another ELF's entry under this key's name": lambda content, other: other,
    "garbage": lambda content, other: os.urandom(4096),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_or_foreign_entry_is_ignored_and_rewritten(
    damage: str, tmp_path: Path, libc_info: ehframe.ElfInfo, libc_prepared: cfi.PreparedTable
) -> None:
    # GIVEN libc's entry, and another table's entry (a small crafted ELF) in the same directory
    cache = TableCache(tmp_path / "cfi")
    cache.store(tablecache.table_key(libc_info), libc_prepared)
    other_info = ehframe.read_elf_info(_small_elf())
    _parse(cache, other_info)
    entry = cache.path(tablecache.table_key(libc_info))
    good = entry.read_bytes()
    other = cache.path(tablecache.table_key(other_info)).read_bytes()
    # WHEN libc's entry is damaged
    entry.write_bytes(DAMAGES[damage](good, other))
    # THEN it is a miss, said among the cache's problems, the table parsed as before and the entry rewritten
    fresh = TableCache(tmp_path / "cfi")
    again, _ = _parse(fresh, libc_info)
    assert not again.from_cache and again.rows == libc_prepared.row_count
    assert (again.addresses, again.kinds) == (libc_prepared.addresses(), libc_prepared.kinds)
    assert fresh.problems and str(entry) in fresh.problems[0]
    assert entry.read_bytes() == good


def _small_elf() -> bytes:
    from tests.unit.fuzz import crafted

    cie = crafted.cie(augmentation=b"")
    fdes = b"".join(
        struct.pack("<IIQQ", 20, len(cie) + 4 + 24 * index, start, 16) for index, start in enumerate((0x1000, 0x1400))
    )
    return crafted.elf_with_eh_frame(cie + fdes + b"\0\0\0\0")


def test_an_entry_of_the_right_checksum_but_not_the_parsers_shape_is_refused(
    libc_info: ehframe.ElfInfo, libc_prepared: cfi.PreparedTable
) -> None:
    prepared = libc_prepared
    key = tablecache.table_key(libc_info)
    assert tablecache.decode(tablecache.encode(key, prepared), key) == prepared
    rows = bytearray(prepared.rows)
    rows[8:16], rows[16:24] = rows[16:24], rows[8:16]  # two rows swapped: addresses out of order
    pages = bytearray(prepared.pages)
    struct.pack_into("<II", pages, len(pages) - 8, prepared.row_count - 1, 5)  # a page's rows past the end
    kinds = prepared.kinds[:-1] + bytes([ehframe.CFA_RSP])
    shapes = {
        "not strictly increasing": dataclasses.replace(prepared, rows=bytes(rows)),
        "past the table's end": dataclasses.replace(prepared, pages=bytes(pages)),
        "end with a gap": dataclasses.replace(prepared, kinds=kinds),
        "does not span": dataclasses.replace(prepared, pages=prepared.pages[:-8]),
        "kind the parser never gives": dataclasses.replace(prepared, kinds=prepared.kinds[:-2] + b"\x09\x00"),
    }
    for message, forged in shapes.items():
        with pytest.raises(tablecache.TableCacheError, match=message):
            tablecache.decode(tablecache.encode(key, forged), key)


def test_a_link_or_a_directory_others_may_enter_is_not_used(
    tmp_path: Path, libc_info: ehframe.ElfInfo, libc_prepared: cfi.PreparedTable
) -> None:
    cache = TableCache(tmp_path / "cfi")
    key = tablecache.table_key(libc_info)
    cache.store(key, libc_prepared)
    entry = cache.path(key)
    entry.rename(tmp_path / "elsewhere")
    entry.symlink_to(tmp_path / "elsewhere")
    assert cache.lookup(key) is None and "Too many levels of symbolic links" in cache.problems[-1]
    entry.unlink()
    (tmp_path / "elsewhere").rename(entry)
    (tmp_path / "cfi").chmod(0o755)
    assert cache.lookup(key) is None and "private" in cache.problems[-1]
    cache.store(key, libc_prepared)
    assert "not written" in cache.problems[-1]


def test_the_least_recently_used_entries_are_evicted_past_the_bound(tmp_path: Path) -> None:
    # GIVEN three entries of the same size written at t=100, 200, 300, the first read since (t=now)
    prepared = cfi.prepare_table("small", ehframe.read_elf_info(_small_elf()), 1 << 20, 1 << 20)
    size = len(tablecache.encode("00" * 32, prepared))
    cache = TableCache(tmp_path / "cfi", max_bytes=3 * size)
    keys = [f"{index:02x}" * 32 for index in range(4)]
    for when, key in zip((100, 200, 300), keys, strict=False):
        cache.store(key, prepared)
        os.utime(cache.path(key), (when, when))
    assert cache.lookup(keys[0]) == prepared  # renews its mtime
    (tmp_path / "cfi" / ".stale.tmp").write_bytes(b"x")
    os.utime(tmp_path / "cfi" / ".stale.tmp", (0, 0))
    # WHEN a fourth entry passes the bound
    cache.store(keys[3], prepared)
    # THEN the least recently used one (written at 200, never read) is gone, and the crash's leftover
    assert sorted(path.name for path in (tmp_path / "cfi").iterdir()) == sorted(
        cache.path(key).name for key in (keys[0], keys[2], keys[3])
    )


def test_the_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(tablecache.CACHE_ENV, raising=False)
    assert (cache := TableCache.configured()) is not None and cache.directory == tablecache.CACHE_DIR
    monkeypatch.setenv(tablecache.CACHE_ENV, "off")
    assert TableCache.configured() is None
    monkeypatch.setenv(tablecache.CACHE_ENV, str(tmp_path))
    assert (cache := TableCache.configured()) is not None and cache.directory == tmp_path
    assert privatecache.configured_dir(tablecache.CACHE_ENV, Path("/nowhere")) == tmp_path
