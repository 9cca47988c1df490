"""A disk cache of prepared unwind tables, so a start does not parse libjvm.so's ``.eh_frame`` again (~1.6 CPU-s).

An ELF's table (profiler/unwind/cfi.py ``prepare_table``: the rows and page index the BPF maps take, and each
row's rule kind) depends on two inputs only: the ``.eh_frame`` bytes and the section's address, both as the
parser reads them (through /proc/PID/map_files, never a path). The key is a SHA-256 of exactly those bytes,
the cache's format version and the parser's own source (ehframe.py and cfi.py), so a change of either file
or of one byte of the section is another key; a path, mtime or build-id never is one.

The cache is root's own directory (``/var/cache/spe-taskprof/cfi``, 0700; ``SPE_TASKPROF_CFI_CACHE`` moves it
or turns it ``off``), its entries written atomically and the least recently used removed past
``MAX_CACHE_BYTES``. An entry is input read back by root: bounded, its magic, version, key and payload
checksum compared, and its shape checked against what the parser produces (rows sorted, kinds known, the page
index consistent with the rows); anything wrong and the table is parsed again and the entry rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import struct
from array import array
from itertools import islice
from pathlib import Path

from ..files import privatecache
from . import ehframe
from .cfi import DEFAULT_MAX_PAGES, MAX_ROWS_PER_PAGE, PAGE, PAGE_SHIFT, ROW, PreparedTable

FORMAT_VERSION = 1
MAGIC = b"SPECFI\0\0"
CACHE_DIR = Path("/var/cache/spe-taskprof/cfi")
CACHE_ENV = "SPE_TASKPROF_CFI_CACHE"  # another directory, or "off"
SUFFIX = ".cfi"
MAX_CACHE_BYTES = 128 << 20  # libjvm.so's entry is ~2.2 MB, libc's ~0.3 MB
ROW_BYTES = ROW.size
PAGE_BYTES = PAGE.size
MAX_ROWS = ehframe.MAX_TABLE_ROWS
MAX_PAGES = DEFAULT_MAX_PAGES  # a table over it never fits the maps
# magic, format, rows, pages, key digest, payload digest
HEADER = struct.Struct("<8sIII32s32s")
MAX_ENTRY_BYTES = HEADER.size + MAX_ROWS * (ROW_BYTES + 1) + MAX_PAGES * PAGE_BYTES


class TableCacheError(Exception):
    """An entry that cannot be used (absent, damaged, for another key): the table is parsed instead."""


@functools.cache
def parser_digest() -> bytes:
    """The parser's version: a digest of the source of the modules that turn ``.eh_frame`` into a table."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("ehframe.py", "cfi.py", "tablecache.py"):
        digest.update((here / name).read_bytes())
    return digest.digest()


def table_key(info: ehframe.ElfInfo) -> str:
    """The entry's key: the bytes the parser consumes (the section and its address), the format and the parser."""
    digest = hashlib.sha256(b"spe-taskprof cfi table\0")
    digest.update(struct.pack("<IQQ", FORMAT_VERSION, info.eh_frame_addr, len(info.eh_frame)))
    digest.update(parser_digest())
    digest.update(info.eh_frame)
    return digest.hexdigest()


def encode(key: str, table: PreparedTable) -> bytes:
    payload = table.rows + table.kinds + table.pages
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        table.row_count,
        len(table.pages) // PAGE_BYTES,
        bytes.fromhex(key),
        hashlib.sha256(payload).digest(),
    )
    return header + payload


def decode(content: bytes, key: str) -> PreparedTable:
    """The entry's table, or TableCacheError when it is damaged, for another key or not the parser's shape."""
    if len(content) < HEADER.size:
        raise TableCacheError("shorter than its header")
    magic, version, rows, pages, key_digest, payload_digest = HEADER.unpack_from(content)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise TableCacheError("not an unwind table entry of this format")
    if key_digest != bytes.fromhex(key):
        raise TableCacheError("written for another .eh_frame or parser")
    if not (0 < rows <= MAX_ROWS and 0 < pages <= MAX_PAGES):
        raise TableCacheError(f"{rows} rows, {pages} pages: out of bounds")
    if len(content) != HEADER.size + rows * (ROW_BYTES + 1) + pages * PAGE_BYTES:
        raise TableCacheError(f"{len(content)} bytes: not the size its header gives (truncated?)")
    payload = memoryview(content)[HEADER.size :]
    if hashlib.sha256(payload).digest() != payload_digest:
        raise TableCacheError("checksum mismatch")
    rows_end, kinds_end = rows * ROW_BYTES, rows * (ROW_BYTES + 1)
    table = PreparedTable(bytes(payload[:rows_end]), bytes(payload[rows_end:kinds_end]), bytes(payload[kinds_end:]))
    check_shape(table)
    return table


def check_shape(table: PreparedTable) -> None:
    """TableCacheError unless ``table`` has the shape prepare_table gives: addresses strictly increasing and
    ending in a gap, kinds the parser's, one page per 256 bytes of the span, each page's rows inside the table."""
    rows = table.row_count
    addresses = table.addresses()
    if len(table.rows) != rows * ROW_BYTES or len(addresses) != rows:
        raise TableCacheError("rows and kinds differ in number")
    if not all(map(operator.lt, addresses, islice(addresses, 1, None))):
        raise TableCacheError("addresses not strictly increasing")
    if max(table.kinds) > ehframe.CFA_UNSUPPORTED or max(table.rows[6::ROW_BYTES]) > ehframe.CFA_UNSUPPORTED:
        raise TableCacheError("a rule kind the parser never gives")
    if table.kinds[-1] != ehframe.CFA_GAP:
        raise TableCacheError("the table does not end with a gap")
    if len(table.pages) != (((addresses[-1] - addresses[0]) >> PAGE_SHIFT) + 1) * PAGE_BYTES:
        raise TableCacheError("the page index does not span the rows")
    entries = array("I", table.pages)
    firsts, counts = entries[0::2], entries[1::2]
    if min(counts) < 1 or max(counts) > MAX_ROWS_PER_PAGE:
        raise TableCacheError("a page with no rows or more than the BPF search takes")
    if not all(first + count <= rows for first, count in zip(firsts, counts)):
        raise TableCacheError("a page's rows past the table's end")


class TableCache:
    """Prepared tables by key in a private directory; every failure is a miss (lookup) or a note (store)."""

    def __init__(self, directory: Path, max_bytes: int = MAX_CACHE_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.problems: list[str] = []  # entries ignored and why, stores that failed (a few kept)

    @classmethod
    def configured(cls) -> TableCache | None:
        """The cache of ``SPE_TASKPROF_CFI_CACHE`` (default /var/cache/spe-taskprof/cfi), None when ``off``."""
        directory = privatecache.configured_dir(CACHE_ENV, CACHE_DIR)
        return None if directory is None else cls(directory)

    @staticmethod
    def key(info: ehframe.ElfInfo) -> str:
        return table_key(info)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def lookup(self, key: str) -> PreparedTable | None:
        """The entry's table, None when there is none or it failed validation (the caller stores a new one)."""
        try:
            table = decode(privatecache.read_entry_bytes(self.path(key), MAX_ENTRY_BYTES, touch=True), key)
        except privatecache.PrivateCacheError as exc:
            if str(exc) != "no entry":
                self._problem(str(exc))
            self.misses += 1
            return None
        except TableCacheError as exc:
            self._problem(f"{self.path(key)}: {exc}; parsed again")
            self.misses += 1
            return None
        self.hits += 1
        return table

    def store(self, key: str, table: PreparedTable) -> None:
        """Write the entry (atomically), then evict the least recently used past the cache's bound."""
        try:
            privatecache.write_entry_bytes(self.directory, self.path(key).name, encode(key, table))
        except (OSError, privatecache.PrivateCacheError) as exc:
            self._problem(f"{self.directory}: not written ({getattr(exc, 'strerror', None) or exc})")
            return
        privatecache.evict(self.directory, self.max_bytes, SUFFIX)

    def _problem(self, line: str) -> None:
        if len(self.problems) < 8:
            self.problems.append(line)
