"""Exact inlined frames without a restart (issue 51, opt-in ``profiler run --exact-inlining``): HotSpot's
``DebugNonSafepoints`` written in a running JVM through /proc/PID/mem, found in the JVM's own flag table
(vmStructs' ``JVMFlag::flags``), as async-profiler sets it from inside the JVM.

C2 and C1 read the flag when a compilation starts (``DebugInformationRecorder``): code compiled after the
write carries a PcDesc wherever the inlined method changes, so the scope of a sampled pc is the kernel's
own, not the loop's safepoint's. Code compiled before keeps its sparse debug information (docs/unwinding.md,
"Exact inlined frames"). The previous value is written back when the window ends, if nobody changed it.

The flag table comes from the target's memory (hostile): the entry must be named exactly
``DebugNonSafepoints``, of type bool, hold 0 or 1, and lie in libjvm.so's own writable data (its file's
read-write mapping or the anonymous .bss right after it); one byte is written, nowhere else.
May import: profiler.files, profiler.errors, profiler.unwind.vmstructs and the standard library.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..errors import VMStructsError
from ..files import procread, safeio
from . import vmstructs

FLAG_NAME = "DebugNonSafepoints"
FLAG_FIELDS = {
    ("JVMFlag", "flags"),  # static: the address of the JVMFlag* to the table
    ("JVMFlag", "numFlags"),  # static: the address of the size_t count (the last entry is empty)
    ("JVMFlag", "_name"),
    ("JVMFlag", "_addr"),
    ("JVMFlag", "_type"),
}
MAX_FLAGS = 4096  # a JDK has about 1,000 (product, diagnostic and experimental)
JVMFLAG_MAX_SIZE = 256
BOOL_TYPE = 0  # JVMFlag::TYPE_bool, the first of the types in JDK 17 and 25


class Memory(Protocol):
    """What the flag writer needs of a process's memory (vmstructs.ProcessMemory and a test double)."""

    def read(self, address: int, size: int) -> bytes: ...

    def u64(self, address: int) -> int: ...

    def c_string(self, address: int) -> str: ...


@dataclass(frozen=True)
class FlagTable:
    """The JVM's flag table as vmStructs describe it."""

    entries: int  # address of JVMFlag::flags[0]
    count: int
    stride: int  # sizeof(JVMFlag)
    name_offset: int
    addr_offset: int
    type_offset: int


@dataclass(frozen=True)
class FlagWrite:
    """One write of the flag: where, what it held before, what we wrote."""

    pid: int
    address: int
    before: int
    after: int


def flag_table(fields: dict[tuple[str, str], int], sizes: dict[str, int], memory: Memory) -> FlagTable:
    """The table from vmStructs' (type, field) -> offset/address and type sizes; VMStructsError when a
    field is missing or a value is absurd."""
    missing = sorted(f"{t}::{f}" for t, f in FLAG_FIELDS - fields.keys())
    if missing or "JVMFlag" not in sizes:
        raise VMStructsError(
            f"vmStructs lack {', '.join(missing) or 'sizeof(JVMFlag)'}: the flag table is not published"
        )
    stride = sizes["JVMFlag"]
    count = memory.u64(fields[("JVMFlag", "numFlags")])
    offsets = [fields[("JVMFlag", name)] for name in ("_name", "_addr", "_type")]
    if (
        not 0 < count <= MAX_FLAGS
        or not 0 < stride <= JVMFLAG_MAX_SIZE
        or any(not 0 <= offset <= stride - 4 for offset in offsets)
    ):
        raise VMStructsError(f"flag table of {count} entries of {stride} bytes: absurd vmStructs")
    return FlagTable(memory.u64(fields[("JVMFlag", "flags")]), count, stride, *offsets)


def find_flag(table: FlagTable, memory: Memory, name: str = FLAG_NAME) -> int:
    """The address of the bool flag ``name``'s value; VMStructsError when no bool flag of that name exists."""
    for index in range(table.count):
        entry = table.entries + index * table.stride
        name_pointer = memory.u64(entry + table.name_offset)
        if name_pointer == 0:
            break  # the table's empty last entry
        if memory.c_string(name_pointer) != name:
            continue
        kind = struct.unpack("<i", memory.read(entry + table.type_offset, 4))[0]
        if kind != BOOL_TYPE:
            raise VMStructsError(f"flag {name} is of type {kind}, not bool")
        return memory.u64(entry + table.addr_offset)
    raise VMStructsError(f"no flag {name} in the JVM's flag table")


def libjvm_data_ranges(maps_lines: Iterable[str], libjvm_path: str) -> list[tuple[int, int]]:
    """[start, end) of libjvm.so's writable mappings (its .data) and of the anonymous mapping that follows
    the last of them (its .bss): where a flag's value may live."""
    ranges: list[tuple[int, int]] = []
    previous_was_libjvm = False
    for line in maps_lines:
        parts = line.split(None, 5)
        if len(parts) < 5:
            previous_was_libjvm = False
            continue
        try:
            start, end = (int(bound, 16) for bound in parts[0].split("-"))
        except ValueError:
            previous_was_libjvm = False
            continue
        path = parts[5].rstrip("\n") if len(parts) == 6 else ""
        writable = parts[1][:2] == "rw"
        if path == libjvm_path:
            if writable:
                ranges.append((start, end))
            previous_was_libjvm = True
            continue
        if previous_was_libjvm and writable and not path and ranges and ranges[-1][1] == start:
            ranges.append((start, end))
        previous_was_libjvm = False
    return ranges


def check_flag_address(address: int, ranges: list[tuple[int, int]], value: bytes) -> None:
    """VMStructsError unless the flag's byte lies in libjvm.so's data and holds a bool (0 or 1)."""
    if not any(start <= address < end for start, end in ranges):
        raise VMStructsError(f"flag value at {address:#x} outside libjvm.so's data: not written")
    if value not in (b"\0", b"\1"):
        raise VMStructsError(f"flag value at {address:#x} holds {value[0]}, not a bool: not written")


def locate(pid: int, memory: Memory) -> int:
    """The checked address of DebugNonSafepoints' value in ``pid``; VMStructsError naming why not."""
    mapping = vmstructs.libjvm_mapping(pid)
    if mapping is None:
        raise VMStructsError(f"pid {pid}: no libjvm.so mapped")
    path, load_address, end = mapping
    try:
        fd = safeio.open_mapped(pid, load_address, end, path, vmstructs.LIBJVM_MAX_BYTES)
        try:
            values, base_vaddr = vmstructs.elf_symbols(
                path, safeio.BoundedReader(fd, os.fstat(fd).st_size), vmstructs.TABLE_SYMBOLS
            )
        finally:
            os.close(fd)
        bias = load_address - base_vaddr
        symbols = {name: memory.u64(bias + value) for name, value in values.items()}
        for name in ("gHotSpotVMStructs", "gHotSpotVMTypes", "gHotSpotVMIntConstants"):
            symbols[name] = bias + values[name]
        fields, _types = vmstructs.read_table_entries(memory, symbols, FLAG_FIELDS)  # type: ignore[arg-type]
        sizes = vmstructs.read_types(memory, symbols, {"JVMFlag"})  # type: ignore[arg-type]
        address = find_flag(flag_table(fields, sizes, memory), memory)
        check_flag_address(address, libjvm_data_ranges(procread.maps(pid), path), memory.read(address, 1))
    except VMStructsError as exc:
        raise VMStructsError(f"pid {pid}: {exc}") from None
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise VMStructsError(f"pid {pid}: reading the flag table failed ({exc})") from None
    return address


def _write_byte(pid: int, address: int, expect: int, value: int) -> int:
    """Write ``value`` at ``address`` if the byte there is ``expect``; returns the byte found."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
    try:
        found = os.pread(fd, 1, address)
        if found == bytes([expect]) and os.pwrite(fd, bytes([value]), address) != 1:
            raise OSError(f"short write at {address:#x}")
        return found[0] if found else -1
    finally:
        os.close(fd)


def enable(pid: int) -> FlagWrite:
    """Set DebugNonSafepoints in the running JVM ``pid``; VMStructsError (one line) when it cannot be."""
    memory = vmstructs.ProcessMemory(pid)
    try:
        address = locate(pid, memory)
    finally:
        memory.close()
    try:
        before = _write_byte(pid, address, 0, 1)
    except OSError as exc:
        raise VMStructsError(f"pid {pid}: writing {FLAG_NAME} failed ({exc})") from None
    return FlagWrite(pid, address, before, 1)


def restore(write: FlagWrite) -> bool:
    """Put the value found back (when we changed it and it still holds ours); False if left as is."""
    if write.before == write.after:
        return False
    try:
        return _write_byte(write.pid, write.address, write.after, write.before) == write.after
    except OSError:
        return False  # the JVM is gone


class ExactInlining:
    """The opt-in's state for one run: the JVMs written, so each is put back at the window's end.

    Call site (the sampler's preparation workers, where a JVM's vmStructs are read; the window's end):
    ``apply(pid)`` returns a warning line or None; ``restore_all()`` puts every flag back, and no flag is
    written after it (a late worker's ``apply`` does nothing). Thread-safe."""

    def __init__(self) -> None:
        self.writes: dict[int, FlagWrite] = {}
        self._lock = threading.Lock()
        self._restored = False

    def apply(self, pid: int) -> str | None:
        with self._lock:
            if self._restored or pid in self.writes:
                return None
            try:
                self.writes[pid] = enable(pid)
            except VMStructsError as exc:
                return f"{exc}; --exact-inlining not applied, inlined methods there may be charged to their caller"
            return None

    def restore_all(self) -> list[int]:
        """Put every JVM's flag back; returns the pids whose flag was put back. Idempotent."""
        with self._lock:
            self._restored = True
            restored = [pid for pid, write in self.writes.items() if restore(write)]
            self.writes.clear()
            return restored
