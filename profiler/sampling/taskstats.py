"""Exit records of threads from the kernel's taskstats over generic netlink (what a /proc reading misses).

Why: /proc counters are read once per interval; what a process did between its last reading and its
exit cannot be read after it is reaped. The kernel sends a taskstats record for every thread as it
exits (in do_exit, before the parent can reap it) to every socket registered for that CPU, with the
thread's lifetime totals. Pids in the records are those of the initial pid namespace, so exits inside
containers (other pid or network namespaces) arrive too; the socket itself must live in the initial
network namespace (the family is not netns-aware) and needs CAP_NET_ADMIN to register.

The record layout is ``struct taskstats`` of include/uapi/linux/taskstats.h, append-only across
versions: the fields read here sit at fixed offsets from version 12 on (ac_tgid is v12). Parsing is
pure and bounds-checked; a short, unknown or foreign record is skipped and counted, never trusted, and
only datagrams sent by the kernel (port 0) are read: any local process may send to our port.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

# netlink / generic netlink constants (linux/netlink.h, linux/genetlink.h)
NETLINK_GENERIC = 16
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 1
NLM_F_ACK = 4
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED / NLA_F_NET_BYTEORDER

# taskstats constants (linux/taskstats.h)
TASKSTATS_FAMILY = "TASKSTATS"
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_NEW = 2
TASKSTATS_TYPE_PID = 1
TASKSTATS_TYPE_TGID = 2
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_PID = 4
TASKSTATS_TYPE_AGGR_TGID = 5
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK = 3
TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK = 4

MIN_VERSION = 12  # the first version carrying ac_tgid
# offsets in struct taskstats (checked with offsetof against the v13 uapi header)
_OFFSETS = {
    "version": (0, "H"),
    "cpu_run_virtual_total": (72, "Q"),  # the thread's sum_exec_runtime, ns
    "ac_pid": (128, "I"),
    "ac_etime": (144, "Q"),  # elapsed since the thread started, us
    "ac_utime": (152, "Q"),
    "ac_stime": (160, "Q"),
    "ac_minflt": (168, "Q"),
    "ac_majflt": (176, "Q"),
    "nvcsw": (272, "Q"),
    "nivcsw": (280, "Q"),
    "ac_tgid": (368, "I"),
}
MIN_RECORD_BYTES = 372  # through ac_tgid
MAX_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class ThreadExit:
    """One exited thread's lifetime totals, as the kernel reported them at its exit."""

    tid: int
    tgid: int
    cpu_ns: int  # sum_exec_runtime when delay accounting filled it, else (utime + stime) in ns
    minor_faults: int
    major_faults: int
    switches: int  # voluntary + involuntary
    elapsed_us: int


@dataclass
class ParseCounts:
    """Records skipped while parsing, by reason (kernel data, but parsed as untrusted)."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


# ---------------------------------------------------------------- parsing (pure)


def _iter_length_type(buffer: bytes, header: str, header_size: int) -> Iterator[tuple[int, bytes]]:
    """(type, body) of 4-aligned length-type-value items (netlink messages, attributes); stops at the
    first whose length is below its header or past the buffer."""
    offset = 0
    while offset + header_size <= len(buffer):
        length, kind = struct.unpack_from(header, buffer, offset)
        if length < header_size or offset + length > len(buffer):
            return
        yield kind, buffer[offset + header_size : offset + length]
        offset += (length + 3) & ~3


def iter_attributes(payload: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, value) of the netlink attributes in ``payload``."""
    for kind, value in _iter_length_type(payload, "=HH", 4):
        yield kind & NLA_TYPE_MASK, value


def iter_messages(buffer: bytes) -> Iterator[tuple[int, bytes]]:
    """(nlmsg type, body after the 16-byte header) of each netlink message in ``buffer``."""
    return _iter_length_type(buffer, "=IH", 16)


def parse_stats(raw: bytes, counts: ParseCounts) -> ThreadExit | None:
    """The fields we use of one ``struct taskstats``; None (counted) when short or of an old version."""
    if len(raw) < 2:
        counts.skip("short record")
        return None
    (version,) = struct.unpack_from("=H", raw, 0)
    if version < MIN_VERSION:
        counts.skip(f"unknown version {version}")
        return None
    if len(raw) < MIN_RECORD_BYTES:
        counts.skip("short record")
        return None
    value = {name: struct.unpack_from("=" + code, raw, at)[0] for name, (at, code) in _OFFSETS.items()}
    cpu_ns = value["cpu_run_virtual_total"] or (value["ac_utime"] + value["ac_stime"]) * 1000
    return ThreadExit(
        value["ac_pid"],
        value["ac_tgid"],
        cpu_ns,
        value["ac_minflt"],
        value["ac_majflt"],
        value["nvcsw"] + value["nivcsw"],
        value["ac_etime"],
    )


def parse_exit_message(body: bytes, family_id: int, kind: int, counts: ParseCounts) -> list[ThreadExit]:
    """The per-thread records of one netlink message. The group aggregate (AGGR_TGID) is skipped: on
    exit it carries delay accounting only, no faults or switches; the threads' own records add up."""
    if kind != family_id:
        counts.skip("not a taskstats message")
        return []
    if len(body) < 4 or body[0] != TASKSTATS_CMD_NEW:
        counts.skip("not an exit record")
        return []
    exits: list[ThreadExit] = []
    for attr_kind, nested in iter_attributes(body[4:]):
        if attr_kind != TASKSTATS_TYPE_AGGR_PID:
            continue
        tid, stats = None, None
        for inner_kind, value in iter_attributes(nested):
            if inner_kind == TASKSTATS_TYPE_PID and len(value) >= 4:
                (tid,) = struct.unpack_from("=I", value, 0)
            elif inner_kind == TASKSTATS_TYPE_STATS:
                stats = value
        if stats is None:
            counts.skip("record without stats")
            continue
        record = parse_stats(stats, counts)
        if record is None:
            continue
        if tid is not None and tid != record.tid:
            counts.skip("pid attribute disagrees with its record")
            continue
        counts.records += 1
        exits.append(record)
    return exits


def parse_exit_buffer(buffer: bytes, family_id: int, counts: ParseCounts) -> list[ThreadExit]:
    """All thread exits in one datagram (one or more netlink messages)."""
    exits: list[ThreadExit] = []
    for kind, body in iter_messages(buffer):
        if kind in (NLMSG_ERROR, NLMSG_DONE):
            continue
        exits.extend(parse_exit_message(body, family_id, kind, counts))
    return exits


def _message(
    kind: int, command: int, attributes: list[tuple[int, bytes]], seq: int, flags: int = NLM_F_REQUEST
) -> bytes:
    payload = struct.pack("=BBH", command, 1, 0)
    for attr_kind, value in attributes:
        attr = struct.pack("=HH", 4 + len(value), attr_kind) + value
        payload += attr + b"\0" * (-len(attr) % 4)
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


def parse_error(buffer: bytes) -> int | None:
    """The (positive) errno of an NLMSG_ERROR answer, 0 for an ack; None when there is none."""
    for kind, body in iter_messages(buffer):
        if kind == NLMSG_ERROR and len(body) >= 4:
            return -int(struct.unpack_from("=i", body, 0)[0])
    return None


def parse_family_id(buffer: bytes) -> int | None:
    """CTRL_ATTR_FAMILY_ID of a CTRL_CMD_GETFAMILY answer; None on an error answer."""
    for kind, body in iter_messages(buffer):
        if kind != GENL_ID_CTRL or len(body) < 4:
            continue
        for attr_kind, value in iter_attributes(body[4:]):
            if attr_kind == CTRL_ATTR_FAMILY_ID and len(value) >= 2:
                return int(struct.unpack_from("=H", value, 0)[0])
    return None


# ---------------------------------------------------------------- the socket


class ExitSource(Protocol):
    """Where thread exits come from: the kernel's taskstats, or a replay in tests."""

    unavailable: str  # why no exits come ("" when they do)
    overruns: int  # times the kernel dropped records because the queue was full

    def drain(self) -> list[ThreadExit]: ...

    def close(self) -> None: ...


class NoExits:
    """An exit source that never delivers (taskstats unavailable, or not wanted)."""

    def __init__(self, why: str) -> None:
        self.unavailable = why
        self.overruns = 0

    def drain(self) -> list[ThreadExit]:
        return []

    def close(self) -> None:
        pass


def _all_cpus() -> str:
    try:
        with open("/sys/devices/system/cpu/possible", encoding="ascii") as possible:
            return possible.read(256).strip() or f"0-{(os.cpu_count() or 1) - 1}"
    except OSError:
        return f"0-{(os.cpu_count() or 1) - 1}"


class TaskstatsListener:
    """A generic netlink socket registered for the exits of every CPU, drained without blocking."""

    def __init__(self, receive_buffer: int = 8 << 20) -> None:
        self.unavailable = ""
        self.counts = ParseCounts()
        self.overruns = 0  # ENOBUFS: the kernel dropped records we were too slow for
        self._cpus = _all_cpus()
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)
        try:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, 33, receive_buffer)  # SO_RCVBUFFORCE (root)
            except OSError:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self._sock.bind((0, 0))
            self._sock.settimeout(2.0)
            self.family_id = self._resolve_family()
            self._send_cpumask(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, NLM_F_REQUEST | NLM_F_ACK)
            failure = parse_error(self._sock.recv(MAX_MESSAGE_BYTES))
            if failure:
                raise OSError(failure, os.strerror(failure))
            self._sock.setblocking(False)
            self._pending: list[ThreadExit] = []
            self._confirm_delivery()
        except OSError:
            self._sock.close()
            raise

    def _confirm_delivery(self, timeout: float = 1.0) -> None:
        """Registering succeeds in any network namespace, but the kernel delivers exit records only to
        sockets of the initial one: a thread of ours that exits must be heard of, or there is no source.
        Records of other exits that arrive meanwhile are kept for the first drain."""
        probe = threading.Thread(target=lambda: None, name="taskstats-probe")
        probe.start()
        probe.join()
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        while True:
            arrived = self._receive()
            self._pending.extend(arrived)
            if any(record.tid == probe.native_id for record in arrived):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.unavailable:
                raise OSError(
                    errno.ENOMSG, "registered, but no exit record arrives: not the host's network namespace?"
                )
            poller.poll(max(1, int(remaining * 1000)))

    def _resolve_family(self) -> int:
        name = TASKSTATS_FAMILY.encode() + b"\0"
        self._sock.send(_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, [(CTRL_ATTR_FAMILY_NAME, name)], 1))
        family = parse_family_id(self._sock.recv(MAX_MESSAGE_BYTES))
        if family is None:
            raise OSError(errno.ENOENT, "no TASKSTATS generic netlink family (kernel without CONFIG_TASKSTATS)")
        return family

    def _send_cpumask(self, command_attr: int, flags: int = NLM_F_REQUEST) -> None:
        mask = self._cpus.encode() + b"\0"
        self._sock.send(_message(self.family_id, TASKSTATS_CMD_GET, [(command_attr, mask)], 2, flags))

    @property
    def port(self) -> int:
        """The netlink port id the kernel sends our records to."""
        return int(self._sock.getsockname()[0])

    def drain(self) -> list[ThreadExit]:
        """Every exit queued so far; never blocks. Only the kernel's datagrams count: any local process
        may send to our port."""
        exits, self._pending = self._pending, []
        exits.extend(self._receive())
        return exits

    def _receive(self) -> list[ThreadExit]:
        exits: list[ThreadExit] = []
        while self._sock.fileno() >= 0:
            try:
                buffer, (sender, _groups) = self._sock.recvfrom(MAX_MESSAGE_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.overruns += 1
                    continue
                self.unavailable = f"taskstats stopped ({exc.strerror or exc})"
                self.close()
                break
            if sender != 0:
                self.counts.skip("not from the kernel")
                continue
            exits.extend(parse_exit_buffer(buffer, self.family_id, self.counts))
        return exits

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        try:
            self._send_cpumask(TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK)
        except OSError:
            pass  # closing the socket unregisters it too
        self._sock.close()


def open_exit_source() -> ExitSource:
    """The taskstats listener, or why there is none (a note for the counters, never an error)."""
    try:
        return TaskstatsListener()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.EPERM, errno.EACCES):
            reason = "registering needs CAP_NET_ADMIN"
        return NoExits(f"taskstats unavailable ({reason})")
