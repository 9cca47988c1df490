"""Unwind tables for the BPF stack walker: each target process's executable ELF mappings, their
``.eh_frame`` tables (profiler/unwind/ehframe.py) and the BPF maps of profiler/unwind/cfi_step.h filled with them.

One table per ELF file (device, inode, size, mtime), shared by every process that maps it; each process
gets a sorted list of its mappings with their load bias. Processes found mid-run are loaded by a worker
thread (parsing libjvm.so takes 1.6-1.9 CPU-s, once per .eh_frame and parser version on a host: the prepared
tables are kept in profiler/unwind/tablecache.py's disk cache, loaded in ~0.06 CPU-s after), and every
process's mappings are re-read every ``refresh`` seconds so a library loaded later (dlopen, a JNI library
unpacked at run time) gets its table too. Health per process: which steps fell back or failed, and why (``CfiHealth``).
"""

from __future__ import annotations

import bisect
import ctypes as ct
import os
import queue
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..capture.stackstore import CUT_CFI, CUT_CFI_MISS, CUT_NO_CFI
from ..files import procread, safeio
from . import ehframe
from .ehframe import CFA_GAP, CFA_UNSUPPORTED, Rule
from .keylocks import KeyLocks

if TYPE_CHECKING:
    from .tablecache import TableCache

PAGE_SHIFT = 8  # CFI_PAGE_SHIFT
MAX_ROWS_PER_PAGE = 1 << 7  # what CFI_PAGE_STEPS halvings can search
DEFAULT_MAX_ROWS = 1 << 20  # 8 MiB of rows: libjvm.so holds ~190 k, libc ~28 k
DEFAULT_MAX_PAGES = 1 << 20  # 8 MiB of pages: libjvm.so needs ~53 k (its 13 MB of code in 256-byte pages)
DEFAULT_MAX_PROCS = 4096
DEFAULT_MAX_BLOCKS = 1 << 18
REFRESH_SECONDS = 10.0
ROW = struct.Struct("<IHBb")  # struct cfi_row
MAPPING = struct.Struct("<QQQIIII")  # struct cfi_mapping
MAPPING_KEY = struct.Struct("<II8s")  # struct cfi_mapping_key: prefix length, pid, address big-endian
PAGE = struct.Struct("<II")  # struct cfi_page
ElfReader = Callable[[], ehframe.ElfInfo]  # reads a mapped file's headers and .eh_frame

# Why a native frame's step could not use a table (health causes, also in docs/unwinding.md).
CAUSE_NO_CFI = "no_cfi"  # the ELF has no .eh_frame, or the table did not fit
CAUSE_MISS = "lookup_miss"  # the ELF has a table but no FDE covers the address
CAUSE_STEP_FAILED = "step_failed"  # a rule this unwinder does not evaluate, or the stack was unreadable


def page_index(addresses: Sequence[int], first_row: int) -> bytes:
    """The page entries (struct cfi_page) of one ELF whose rows start at ``first_row`` in cfi_rows:
    page p covers [addresses[0] + p·256, +256) and lists the row covering its first byte and the rows
    starting inside it. Raises ValueError when a page has more rows than the BPF search can take."""
    low, high = addresses[0], addresses[-1]
    out = bytearray()
    row = 0
    for page_start in range(low, high + 1, 1 << PAGE_SHIFT):
        while row + 1 < len(addresses) and addresses[row + 1] <= page_start:
            row += 1
        last = bisect.bisect_left(addresses, page_start + (1 << PAGE_SHIFT), row) - 1
        count = last - row + 1
        if count > MAX_ROWS_PER_PAGE:
            raise ValueError(f"{count} rows in the page at {page_start:#x}")
        out += PAGE.pack(first_row + row, count)
    return bytes(out)


def rebased(pages: bytes, first_row: int) -> bytes:
    """page_index(addresses, 0)'s entries with their rows moved to start at ``first_row``."""
    entries = array("I", pages)
    entries[0::2] = array("I", (row + first_row for row in entries[0::2]))
    return entries.tobytes()


def pack_rows(addresses: Iterable[int], rules: Iterable[Rule]) -> bytes:
    """The rows of one ELF in the BPF layout; a rule that does not fit it becomes unsupported."""
    out = bytearray()
    for address, rule in zip(addresses, rules, strict=True):
        kind, cfa, rbp8 = rule.kind, rule.cfa_offset, rule.rbp_offset // 8
        if not (0 <= cfa <= 0xFFFF and -128 <= rbp8 <= 127 and rule.rbp_offset % 8 == 0):
            kind, cfa, rbp8 = CFA_UNSUPPORTED, 0, 0
        out += ROW.pack(address, cfa, kind, rbp8)
    return bytes(out)


def aligned_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) as the fewest (address, prefix bits of 64) blocks aligned to their power-of-two size."""
    blocks = []
    while start < end:
        size = start & -start if start else 1 << 63
        while size > end - start:
            size >>= 1
        blocks.append((start, 64 - size.bit_length() + 1))
        start += size
    return blocks


@dataclass(frozen=True)
class PreparedTable:
    """One ELF's table as the BPF maps take it: ``rows`` (struct cfi_row each, sorted by address), ``kinds``
    (each row's rule kind before the BPF layout's narrowing, for the health causes) and ``pages`` (struct
    cfi_page each, rows numbered from the table's first)."""

    rows: bytes
    kinds: bytes
    pages: bytes

    @property
    def row_count(self) -> int:
        return len(self.kinds)

    def addresses(self) -> array[int]:
        """Each row's first address (ELF virtual address), as 64-bit unsigned integers."""
        return array("Q", array("I", self.rows)[0::2])


class TableRefused(Exception):
    """An ELF gets no table: ``cause`` for its health, ``warning`` when the run should say it once."""

    def __init__(self, cause: str, warning: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.warning = warning


def prepare_table(path: str, info: ehframe.ElfInfo, page_room: int, max_pages: int) -> PreparedTable:
    """An ELF's table in the BPF layout (rows numbered from 0), a pure function of its ``.eh_frame`` and the
    section's address (what profiler/unwind/tablecache.py keys on); TableRefused when it has none or does not
    fit ``page_room`` pages (checked before the pages are listed: two FDEs 4 GiB apart would be 16 M pages)."""
    try:
        addresses, rules = ehframe.build_table(ehframe.iter_fde_refs(info))
    except ehframe.EhFrameBudgetError as exc:  # a crafted or runaway section: said once, this ELF only
        raise TableRefused(f"{CAUSE_NO_CFI}: {exc}", f"{path}: unwind table refused: {exc}") from None
    except (ehframe.EhFrameError, struct.error, IndexError, ValueError) as exc:
        raise TableRefused(f"{CAUSE_NO_CFI}: {exc}") from None
    if not addresses:
        raise TableRefused(f"{CAUSE_NO_CFI}: no .eh_frame")
    if addresses[-1] > 0xFFFFFFFF:
        raise TableRefused(f"{CAUSE_NO_CFI}: code above 4 GiB in the ELF")
    page_count = ((addresses[-1] - addresses[0]) >> PAGE_SHIFT) + 1
    if page_count > page_room:
        raise TableRefused(
            f"{CAUSE_NO_CFI}: no room left in cfi_rows/cfi_pages",
            f"{path}: unwind table spanning {page_count} pages does not fit ({max_pages} pages in all)",
        )
    try:
        pages = page_index(addresses, 0)  # rows numbered from this table's first: its place is not known yet
    except ValueError as exc:
        raise TableRefused(f"{CAUSE_NO_CFI}: {exc} (at most {MAX_ROWS_PER_PAGE})") from None
    return PreparedTable(pack_rows(addresses, rules), bytes(rule.kind for rule in rules), pages)


@dataclass(frozen=True)
class ExecMapping:
    """One executable file mapping of /proc/PID/maps."""

    start: int
    end: int
    offset: int
    path: str


def parse_maps(text: str) -> list[ExecMapping]:
    """Executable file-backed mappings of a /proc/PID/maps text, plus the vDSO (path ``[vdso]``)."""
    mappings = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5].strip()
        if not (path.startswith("/") or path == "[vdso]") or path.endswith(" (deleted)"):
            continue
        try:
            low, high = parts[0].split("-")
            mappings.append(ExecMapping(int(low, 16), int(high, 16), int(parts[2], 16), path))
        except ValueError:
            continue  # not the kernel's line (a test's text, a truncated read): nothing to map
    return mappings


def load_bias(segments: Iterable[tuple[int, int, int]], mapping: ExecMapping) -> int | None:
    """Address in the process minus address in the ELF, from the executable PT_LOAD holding the
    mapping's file offset (None: no such segment, e.g. a file mapped executable that is not code)."""
    for p_offset, p_vaddr, p_filesz in segments:
        if p_offset <= mapping.offset < p_offset + max(p_filesz, 1):
            return mapping.start - (p_vaddr + mapping.offset - p_offset)
    return None


@dataclass
class ElfTable:
    """One ELF's table and where it lives in ``cfi_rows``; ``rows == 0`` when there is none (``cause``)."""

    key: tuple[Any, ...]
    path: str
    first_row: int = 0
    rows: int = 0
    first_page: int = 0
    pages: int = 0
    segments: tuple[tuple[int, int, int], ...] = ()
    cause: str | None = None
    parse_seconds: float = 0.0
    from_cache: bool = False  # prepared from the table cache, not parsed
    addresses: array = field(default_factory=lambda: array("Q"))
    kinds: bytes = b""


@dataclass
class CfiHealth:
    """Per process: frames stepped by frame pointers instead of a table, and steps that cut the stack."""

    no_table: int = 0
    miss: int = 0
    unsupported: int = 0
    read_failed: int = 0


class CfiLoader:
    """Fills cfi_rows / cfi_procs of a loaded BPF program for a changing set of processes."""

    def __init__(
        self,
        bpf: Any,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_pages: int = DEFAULT_MAX_PAGES,
        refresh: float = REFRESH_SECONDS,
        table_cache: TableCache | None = None,
    ) -> None:
        self._bpf = bpf
        self.table_cache = table_cache  # prepared tables kept across runs (profiler/unwind/tablecache.py)
        self.max_rows = max_rows
        self.max_pages = max_pages
        self.refresh = refresh
        self.rows_used = 0
        self.pages_used = 0
        self.tables: dict[tuple[Any, ...], ElfTable] = {}
        self._mappings: dict[int, list[tuple[ExecMapping, ElfTable, int]]] = {}
        self._signatures: dict[int, tuple[tuple[int, int, int, str], ...]] = {}
        self._keys: dict[int, set[bytes]] = {}  # trie keys written per process
        self._lock = threading.Lock()  # guards _mappings for cause_at()
        # one load per process and one parse per ELF at a time, never one for all: a target whose files are
        # slow or crafted holds up only itself (the refresh worker and up to two preparations run at once)
        self._pid_locks = KeyLocks()
        self._file_locks = KeyLocks()
        self._space_lock = threading.Lock()  # rows_used / pages_used: each table reserves its range under it
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self.warnings: list[str] = []

    # ------------------------------------------------------------ program text

    @staticmethod
    def bpf_header(
        max_rows: int = DEFAULT_MAX_ROWS,
        max_pages: int = DEFAULT_MAX_PAGES,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_procs: int = DEFAULT_MAX_PROCS,
    ) -> str:
        """profiler/unwind/cfi_step.h with its sizes, to put before the walker that calls cfi_step()."""
        text = resources.files("profiler.unwind").joinpath("cfi_step.h").read_text(encoding="utf-8")
        sizes = {
            "CFI_MAX_ROWS": max_rows,
            "CFI_MAX_PAGES": max_pages,
            "CFI_MAX_BLOCKS": max_blocks,
            "CFI_MAX_PROCS": max_procs,
        }
        return "".join(f"#define {name} {value}\n" for name, value in sizes.items()) + text

    # ------------------------------------------------------------ processes

    def start(self) -> None:
        """Start the worker that loads processes added with add_pid() and refreshes their mappings."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="cfi-loader", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=30)
            self._worker = None

    def add_pid(self, pid: int) -> None:
        """Load ``pid``'s tables in the worker (or now, when no worker runs)."""
        if self._worker is None:
            self.load_pid(pid)
        else:
            self._queue.put(pid)

    def _run(self) -> None:
        next_refresh = time.monotonic() + self.refresh
        while True:
            try:
                pid = self._queue.get(timeout=max(0.0, next_refresh - time.monotonic()))
            except queue.Empty:
                for known in list(self._mappings):
                    self.load_pid(known, wait=False)  # one being loaded now (a preparation) is fresh already
                next_refresh = time.monotonic() + self.refresh
                continue
            if pid is None:
                return
            self.load_pid(pid)

    def load_pid(self, pid: int, wait: bool = True) -> bool:
        """(Re)write ``pid``'s mappings and any new ELF tables; False when the process is gone. Loads of other
        processes go on meanwhile; one of the same process waits for this one (``wait=False``: returns True
        at once, the load under way will be as fresh)."""
        with self._pid_locks.hold(pid, blocking=wait) as held:
            return self._load_pid(pid) if held else True

    def _load_pid(self, pid: int) -> bool:
        maps = procread.maps(pid)  # procread's one bounded reader: a target sizes its own maps
        mappings = parse_maps("\n".join(maps))
        if not maps.found:
            return False
        signature = tuple((m.start, m.end, m.offset, m.path) for m in mappings)
        if self._signatures.get(pid) == signature:
            return True
        entries: list[tuple[ExecMapping, ElfTable, int]] = []
        written: set[bytes] = set()
        # smallest mappings first, each listed for the walker as soon as its table is there: glibc's table
        # serves every thread's start while libjvm.so's (190 k rows, seconds of a contended core) is parsed
        for mapping in sorted(mappings, key=lambda m: m.end - m.start):
            table = self._table_for(pid, mapping)
            bias = load_bias(table.segments, mapping) if table.segments else None
            if bias is not None:
                entries.append((mapping, table, bias))
                written |= self._write_mapping(pid, mapping, table, bias)
        self._drop_stale_mappings(pid, written)
        entries.sort(key=lambda entry: entry[0].start)
        with self._lock:
            self._mappings[pid] = entries
            self._signatures[pid] = signature
        return True

    def forget_pid(self, pid: int) -> None:
        """Stop refreshing an exited process (its mappings stay known for health after the window)."""
        with self._lock:
            self._signatures.pop(pid, None)

    def _write_mapping(self, pid: int, mapping: ExecMapping, table: ElfTable, bias: int) -> set[bytes]:
        """One mapping's blocks into the trie; the keys written."""
        trie = self._bpf[b"cfi_mappings"]
        written: set[bytes] = set()
        low = table.addresses[0] if table.pages else 0
        value = MAPPING.pack(
            mapping.start, mapping.end, bias & 0xFFFFFFFFFFFFFFFF, low, table.first_page, table.pages, 0
        )
        leaf = trie.Leaf.from_buffer_copy(value)
        for address, bits in aligned_blocks(mapping.start, mapping.end):
            key_bytes = MAPPING_KEY.pack(32 + bits, pid, address.to_bytes(8, "big"))
            try:
                trie[trie.Key.from_buffer_copy(key_bytes)] = leaf
            except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception: the trie is full
                self.warnings.append(f"pid {pid}: mapping {mapping.path} not listed for unwinding ({exc})")
                break
            written.add(key_bytes)
        return written

    def _drop_stale_mappings(self, pid: int, written: set[bytes]) -> None:
        """The blocks of the process's gone mappings out of the trie, once its new ones are all in."""
        trie = self._bpf[b"cfi_mappings"]
        for stale in self._keys.get(pid, set()) - written:
            try:
                del trie[trie.Key.from_buffer_copy(stale)]
            except KeyError:
                pass
        self._keys[pid] = written

    # ------------------------------------------------------------ ELF tables

    @contextmanager
    def _mapped_file(self, pid: int, mapping: ExecMapping) -> Iterator[tuple[tuple[Any, ...], ElfReader]]:
        """The mapped file's identity and how to read its headers and .eh_frame, through the process's view of
        it (containers): the file stays open for the block."""
        if mapping.path == "[vdso]":
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(mapping.start)
                image = mem.read(mapping.end - mapping.start)
            yield ("vdso", os.uname().release, len(image)), lambda: ehframe.read_elf_info(image)
            return
        # the mapped inode itself (map_files), never a path a tenant can swap; regular files only (safeio)
        with os.fdopen(safeio.open_mapped(pid, mapping.start, mapping.end, mapping.path), "rb") as handle:
            stat = os.fstat(handle.fileno())
            yield (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns), lambda: ehframe.read_elf_file(handle)

    def _table_for(self, pid: int, mapping: ExecMapping) -> ElfTable:
        """The mapped file's table: parsed once per file, whichever processes ask for it and when; a parse of
        one file never waits for another's."""
        try:
            with self._mapped_file(pid, mapping) as (key, read), self._file_locks.hold(key):
                known = self.tables.get(key)
                if known is not None:
                    return known
                began = time.thread_time()  # this worker's CPU: other targets parse beside it
                table = self._parse(key, mapping.path, read())
                table.parse_seconds = time.thread_time() - began
                self.tables[key] = table
                return table
        except OSError as exc:
            return ElfTable(("unreadable", mapping.path), mapping.path, cause=f"unreadable ({exc.strerror})")
        except (ehframe.EhFrameError, struct.error, IndexError, ValueError) as exc:
            return ElfTable(("unparsable", mapping.path), mapping.path, cause=f"{CAUSE_NO_CFI}: {exc}")

    def _parse(self, key: tuple[Any, ...], path: str, info: ehframe.ElfInfo) -> ElfTable:
        """The ELF's table, from the cache or built, written into cfi_rows / cfi_pages (when there is room)."""
        table = ElfTable(key, path, segments=info.exec_segments)
        try:
            prepared = self._prepared(path, info, table)
        except TableRefused as refused:
            if refused.warning:
                self.warnings.append(refused.warning)
            table.cause = refused.cause
            return table
        page_count = len(prepared.pages) // PAGE.size
        with self._space_lock:  # only the reservation: tables of other files are built and written beside
            if self.rows_used + prepared.row_count > self.max_rows or self.pages_used + page_count > self.max_pages:
                table.cause = f"{CAUSE_NO_CFI}: no room left in cfi_rows/cfi_pages"
                self.warnings.append(
                    f"{path}: unwind table of {prepared.row_count} rows and {page_count} pages does not fit "
                    f"({self.max_rows} rows, {self.max_pages} pages in all)"
                )
                return table
            table.first_row, table.first_page = self.rows_used, self.pages_used
            self.rows_used += prepared.row_count
            self.pages_used += page_count
        self._write_array(b"cfi_rows", table.first_row, prepared.rows, ROW.size)
        self._write_array(b"cfi_pages", table.first_page, rebased(prepared.pages, table.first_row), PAGE.size)
        table.rows, table.pages = prepared.row_count, page_count
        table.addresses = prepared.addresses()
        table.kinds = prepared.kinds
        return table

    def _prepared(self, path: str, info: ehframe.ElfInfo, table: ElfTable) -> PreparedTable:
        """The table from the cache when an entry for these exact .eh_frame bytes is valid, else built (and
        stored); TableRefused when there is none to use (refusals are not cached: they cost their bounds)."""
        if self.table_cache is None:
            return prepare_table(path, info, self.max_pages - self.pages_used, self.max_pages)
        key = self.table_cache.key(info)
        cached = self.table_cache.lookup(key)
        if cached is not None:
            table.from_cache = True
            return cached
        prepared = prepare_table(path, info, self.max_pages - self.pages_used, self.max_pages)
        self.table_cache.store(key, prepared)
        return prepared

    def _write_array(self, name: bytes, first: int, packed: bytes, size: int) -> None:
        """Entries [first, first + n) of a BPF array from packed bytes, in one syscall where possible."""
        table = self._bpf[name]
        count = len(packed) // size
        keys = (table.Key * count).from_buffer_copy(array("I", range(first, first + count)).tobytes())
        values = (table.Leaf * count).from_buffer_copy(packed)
        try:
            table.items_update_batch(keys, values)
        except Exception:  # noqa: BLE001 - no batch update in this kernel: one by one
            for index in range(count):
                table[keys[index]] = values[index]

    # ------------------------------------------------------------ health

    def health(self, pid: int) -> CfiHealth:
        """What the BPF step counted for ``pid`` (zeros when it never left the table's path)."""
        table = self._bpf[b"cfi_health"]
        try:
            leaf = table[table.Key(pid)]
        except KeyError:
            return CfiHealth()
        return CfiHealth(int(leaf.no_table), int(leaf.miss), int(leaf.unsupported), int(leaf.read_failed))

    def steps(self) -> int:
        """Steps done by a table, all processes."""
        return int(sum(self._bpf[b"cfi_steps"][ct.c_int(0)]))

    def cause_at(self, pid: int, pc: int) -> str | None:
        """Why a walk that ended at ``pc`` (the outermost frame) ended there: a health cause, or None
        when the frame is outermost by its CFI (the stack is whole) or not in a known ELF."""
        with self._lock:
            entries = self._mappings.get(pid, [])
        for mapping, table, bias in entries:
            if mapping.start <= pc < mapping.end:
                if not table.rows:
                    return CAUSE_NO_CFI
                index = bisect.bisect_right(table.addresses, pc - bias) - 1
                kind = table.kinds[index] if index >= 0 else CFA_GAP
                if kind == ehframe.CFA_END:
                    return None
                return CAUSE_MISS if kind == CFA_GAP else CAUSE_STEP_FAILED
        return None

    def cut_cause_of(self, pid: int) -> Callable[[int], str | None]:
        """For StackFolder: the CUT_* cause of a stack of ``pid`` that ends at a native frame at ``pc``."""
        causes = {CAUSE_NO_CFI: CUT_NO_CFI, CAUSE_MISS: CUT_CFI_MISS, CAUSE_STEP_FAILED: CUT_CFI}

        def cause(pc: int) -> str | None:
            found = self.cause_at(pid, pc)
            return causes[found] if found is not None else None

        return cause

    def memory_bytes(self) -> int:
        """Kernel memory of the maps (preallocated rows, the process entries in use)."""
        blocks = sum(len(keys) for keys in self._keys.values())
        return self.max_rows * ROW.size + self.max_pages * PAGE.size + blocks * (MAPPING_KEY.size + MAPPING.size)
