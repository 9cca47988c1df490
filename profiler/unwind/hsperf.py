"""A JVM's own counters in its hsperfdata file (-XX:+UsePerfData, the default): one long counter found by
name (``java.cls.unloadedClasses``, the generations of hotspot.py) and read by offset, within caps."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..files import procread, safeio
from .vmstructs import ProcessMemory

HSPERFDATA_MAX_BYTES = 4 << 20  # -XX:PerfDataMemorySize is 64 KB by default
HSPERFDATA_MAX_ENTRIES = 1 << 14  # a JDK publishes a few hundred counters
UNLOADED_CLASSES = "java.cls.unloadedClasses"
_PERF_MAGIC = 0xCAFEC0C0


@dataclass
class HsPerfCounter:
    """One long counter of a JVM's hsperfdata file (-XX:+UsePerfData, the default), read by offset
    (the file stays open: it is read every drain)."""

    path: str
    offset: int
    fd: int | None = None

    @classmethod
    def find(cls, pid: int, name: str) -> HsPerfCounter | None:
        """The counter ``name`` of ``pid``'s hsperfdata, or None (no file, -XX:-UsePerfData, no such counter)."""
        file_name = str(procread.namespace_pid(pid))
        try:
            tmp_fd = safeio.open_dir_in_root(pid, "/tmp")
        except OSError:
            return None
        try:
            directories = [d for d in os.listdir(tmp_fd) if d.startswith("hsperfdata_")][:64]
        finally:
            os.close(tmp_fd)
        for directory in directories:
            try:
                # written by the JVM itself: its owner's, a regular file, no link, bounded (safeio warns)
                fd = safeio.open_in_root(pid, f"/tmp/{directory}/{file_name}", HSPERFDATA_MAX_BYTES)
            except OSError:
                continue
            offset = _counter_offset(safeio.read_fd(fd, HSPERFDATA_MAX_BYTES), name)
            if offset is not None:
                return cls(f"/proc/{pid}/root/tmp/{directory}/{file_name}", offset, fd)
            os.close(fd)
        return None

    def address_in(self, pid: int, memory: ProcessMemory) -> int | None:
        """Where the JVM sees this counter: its mapping of the hsperfdata file (offset 0) plus the offset,
        checked by reading the same value there and in the file; None when the file is not mapped."""
        suffix = "/" + "/".join(self.path.split("/")[-2:])
        lines = [line for line in procread.maps(pid) if line.rstrip("\n").endswith(suffix)]  # bounded
        for line in lines[:4]:
            parts = line.split(None, 5)
            if len(parts) < 6 or int(parts[2], 16) != 0:
                continue
            start, end = (int(bound, 16) for bound in parts[0].split("-"))
            if self.offset + 8 > end - start:
                continue
            for _ in range(3):  # the JVM may count an unload between the two reads
                try:
                    if memory.u64(start + self.offset) == self.read():
                        return start + self.offset
                except OSError:
                    break
        return None

    def read(self) -> int | None:
        if self.fd is None:
            return None
        try:
            data = os.pread(self.fd, 8, self.offset)
        except OSError:
            return None
        return int.from_bytes(data, "little") if len(data) == 8 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _counter_offset(data: bytes, name: str) -> int | None:
    """File offset of the value of the long counter ``name`` (the PerfData entry layout of HotSpot's
    perfMemory.hpp: prologue with entry_offset and num_entries, then entries with name and data offsets).

    Linear in the file: at most HSPERFDATA_MAX_ENTRIES entries, each at least its 20-byte header long and
    after the one before, and a name compared where it starts (never read to its NUL: a crafted file of
    entries naming one unterminated name cost 28 CPU-s for 4 MiB)."""
    if len(data) < 32 or int.from_bytes(data[:4], "big") != _PERF_MAGIC or data[4] != 1:  # 1: little-endian
        return None
    entry_offset, entries = struct.unpack_from("<ii", data, 24)
    at = entry_offset
    wanted = name.encode("ascii") + b"\0"
    for _ in range(min(max(0, entries), HSPERFDATA_MAX_ENTRIES)):
        if at < 0 or at + 20 > len(data):
            return None
        length, name_offset, vector_length, data_type, _flags, _units, _variability, data_offset = struct.unpack_from(
            "<iiibbbbi", data, at
        )
        named = 0 <= name_offset <= length - len(wanted) and data.startswith(wanted, at + name_offset)
        if named and vector_length == 0 and data_type == ord("J") and 0 <= data_offset <= length - 8:
            return at + data_offset
        if length < 20:
            return None
        at += length
    return None
