"""perf_event_open(2) through ctypes: the attribute struct, event names, and a swappable syscall layer.

Counting only (no sampling, no mmap): one fd per (thread, event), read as value, time enabled,
time running. ``PerfSyscalls`` is the interface; ``LinuxPerfSyscalls`` makes the real calls and
tests substitute a fake.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import Protocol

from ..files import procread

# perf_event_attr.type
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_RAW = 4

# read_format bits
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1

# bits of the flags word that follows read_format (include/uapi/linux/perf_event.h)
FLAG_DISABLED = 1 << 0
FLAG_INHERIT = 1 << 1
FLAG_EXCLUDE_HV = 1 << 6
FLAG_INHERIT_THREAD = 1 << 35  # Linux 5.13: inherit only into threads (CLONE_THREAD), not forked processes

PERF_FLAG_FD_CLOEXEC = 1 << 3

_SYSCALL_NUMBERS = {"x86_64": 298, "amd64": 298, "aarch64": 241, "arm64": 241, "i386": 336, "i686": 336}

HARDWARE_EVENTS = {
    "cycles": 0,
    "cpu-cycles": 0,
    "instructions": 1,
    "cache-references": 2,
    "cache-misses": 3,
    "branches": 4,
    "branch-instructions": 4,
    "branch-misses": 5,
    "bus-cycles": 6,
    "stalled-cycles-frontend": 7,
    "stalled-cycles-backend": 8,
    "ref-cycles": 9,
}
SOFTWARE_EVENTS = {
    "cpu-clock": 0,
    "task-clock": 1,
    "page-faults": 2,
    "faults": 2,
    "context-switches": 3,
    "cs": 3,
    "cpu-migrations": 4,
    "migrations": 4,
    "minor-faults": 5,
    "major-faults": 6,
    "alignment-faults": 7,
    "emulation-faults": 8,
}


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER8 (136 bytes); unused tail fields stay zero."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),  # union with sample_freq
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),  # disabled:1, inherit:1, ... (bit positions above)
        ("wakeup_events", ctypes.c_uint32),  # union with wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # union with bp_addr, kprobe_func, uprobe_path
        ("config2", ctypes.c_uint64),  # union with bp_len, kprobe_addr, probe_offset
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),  # PERF_ATTR_SIZE_VER7 ends here (128)
        ("config3", ctypes.c_uint64),  # VER8 (136); older kernels accept it because it is zero
    ]


assert ctypes.sizeof(PerfEventAttr) == 136, "perf_event_attr layout drifted"


@dataclass(frozen=True)
class EventSpec:
    """A named perf event as (type, config)."""

    name: str
    type: int
    config: int

    @property
    def hardware(self) -> bool:
        return self.type in (PERF_TYPE_HARDWARE, PERF_TYPE_RAW)


def event_spec(name: str) -> EventSpec:
    """Resolve a perf-style event name (``cycles``, ``task-clock``, raw ``r003c``); ValueError if unknown."""
    if name in HARDWARE_EVENTS:
        return EventSpec(name, PERF_TYPE_HARDWARE, HARDWARE_EVENTS[name])
    if name in SOFTWARE_EVENTS:
        return EventSpec(name, PERF_TYPE_SOFTWARE, SOFTWARE_EVENTS[name])
    if len(name) > 1 and name[0] == "r":
        try:
            return EventSpec(name, PERF_TYPE_RAW, int(name[1:], 16))
        except ValueError:
            pass
    known = ", ".join(sorted(set(HARDWARE_EVENTS) | set(SOFTWARE_EVENTS)))
    raise ValueError(f"unknown perf event {name!r}; use one of {known} or rHEX")


def counting_attr(spec: EventSpec, inherit: bool = True, inherit_thread: bool = True) -> PerfEventAttr:
    attr = PerfEventAttr()
    attr.type = spec.type
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = spec.config
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
    flags = FLAG_EXCLUDE_HV
    if inherit:
        flags |= FLAG_INHERIT
        if inherit_thread:
            flags |= FLAG_INHERIT_THREAD
    attr.flags = flags
    return attr


@dataclass(frozen=True)
class RawCount:
    value: int
    enabled_ns: int
    running_ns: int


class PerfSyscalls(Protocol):
    """The kernel interface the counters need; raises OSError with the kernel's errno."""

    def open(self, spec: EventSpec, tid: int, inherit_thread: bool) -> int: ...

    def read(self, fd: int) -> RawCount: ...

    def close(self, fd: int) -> None: ...

    def threads(self, pid: int) -> list[int]: ...


def syscall_number() -> int:
    machine = platform.machine().lower()
    if machine not in _SYSCALL_NUMBERS:
        raise OSError(errno.ENOSYS, f"perf_event_open syscall number unknown for {machine}")
    return _SYSCALL_NUMBERS[machine]


class LinuxPerfSyscalls:
    """The real perf_event_open/read/close."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._number = syscall_number()

    def open(self, spec: EventSpec, tid: int, inherit_thread: bool) -> int:
        attr = counting_attr(spec, inherit=True, inherit_thread=inherit_thread)
        fd = self._libc.syscall(
            ctypes.c_long(self._number),
            ctypes.byref(attr),
            ctypes.c_int(tid),
            ctypes.c_int(-1),  # any CPU
            ctypes.c_int(-1),  # no group: each event multiplexes on its own, scaled at read
            ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC),
        )
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(fd)

    def read(self, fd: int) -> RawCount:
        data = os.read(fd, 24)
        if len(data) < 24:
            raise OSError(errno.EIO, f"short read of a perf counter ({len(data)} bytes)")
        value, enabled, running = struct.unpack("QQQ", data)
        return RawCount(value, enabled, running)

    def close(self, fd: int) -> None:
        os.close(fd)

    def threads(self, pid: int) -> list[int]:
        return procread.task_ids(pid) or []  # at most THREADS_MAX (a warning past it): one fd each


def describe_errno(code: int | None, spec: EventSpec) -> str:
    """Why an event cannot be counted, in words a user can act on."""
    name = errno.errorcode.get(code or 0, str(code))
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV) and spec.hardware:
        return f"{name}: no hardware PMU event {spec.name} on this CPU/VM"
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return f"{name}: event {spec.name} not supported by this kernel"
    if code in (errno.EACCES, errno.EPERM):
        return f"{name}: not permitted (run as root or with CAP_PERFMON; see kernel.perf_event_paranoid)"
    if code == errno.EMFILE:
        return f"{name}: too many open files (raise ulimit -n)"
    if code == errno.EINVAL:
        return f"{name}: kernel rejected the event attributes for {spec.name}"
    return f"{name}: {os.strerror(code) if code else 'unknown error'}"
