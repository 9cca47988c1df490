"""Per-process network bytes and calls with eBPF (``profiler run --net``), split by peer class.

The kernel side (net_trace.c) sums bytes per (tgid, peer address); this module classifies the
peers in user space (loopback / this host / external) and turns the sums into ``NetStats``.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ..bpf.compiler import bcc_error, compile_program
from ..bpf.defines import with_defines
from ..capture.format import NetStats
from ..errors import CapabilityError, PrivilegeError

MECHANISM_TRACEPOINT = "tracepoint"
MECHANISM_KPROBE = "kprobe"

BPF_SOURCE = Path(__file__).parent / "net_trace.c"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")

AF_INET = 2
AF_INET6 = 10

# Peer classes. "same host" = loopback or local; "unknown" is an unconnected (UDP sendto) socket
# whose destination the socket does not hold.
PEER_LOOPBACK = "loopback"
PEER_LOCAL = "local"
PEER_EXTERNAL = "external"
PEER_UNKNOWN = "unknown"

IpAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


# ---------------------------------------------------------------- BTF: kernel layout facts


@dataclass(frozen=True)
class KernelLayout:
    """What the BPF program needs to know about this kernel, read from its BTF.

    Offsets are byte offsets in ``struct sock_common``; ``*_tp_args`` is the number of arguments of
    the raw tracepoint (without the context pointer), None when the tracepoint does not exist.
    """

    skc_family: int
    skc_daddr: int
    skc_v6_daddr: int | None
    send_tp_args: int | None
    recv_tp_args: int | None

    def tracepoint_arg_positions(self) -> tuple[int, int] | None:
        """(ret, flags) argument positions; both prototypes seen so far end with ``int ret, int flags``
        ((sk, ret, flags) and (sk, family, protocol, ret, flags))."""
        if self.send_tp_args is None or self.recv_tp_args is None:
            return None
        if self.send_tp_args != self.recv_tp_args or self.send_tp_args not in (3, 5):
            return None
        return self.send_tp_args - 2, self.send_tp_args - 1


# BTF kinds (include/uapi/linux/btf.h) and the size of the data that follows each type record.
_KIND_INT, _KIND_PTR, _KIND_ARRAY, _KIND_STRUCT, _KIND_UNION, _KIND_ENUM = 1, 2, 3, 4, 5, 6
_KIND_TYPEDEF, _KIND_VOLATILE, _KIND_CONST, _KIND_RESTRICT = 8, 9, 10, 11
_KIND_FUNC_PROTO, _KIND_VAR, _KIND_DATASEC, _KIND_DECL_TAG, _KIND_TYPE_TAG, _KIND_ENUM64 = 13, 14, 15, 17, 18, 19
_FIXED_EXTRA = {_KIND_INT: 4, _KIND_ARRAY: 12, _KIND_VAR: 4, _KIND_DECL_TAG: 4}
_PER_MEMBER = {
    _KIND_STRUCT: 12, _KIND_UNION: 12, _KIND_ENUM: 8, _KIND_FUNC_PROTO: 8, _KIND_DATASEC: 12, _KIND_ENUM64: 12
}
_MODIFIERS = {_KIND_TYPEDEF, _KIND_VOLATILE, _KIND_CONST, _KIND_RESTRICT, _KIND_TYPE_TAG}


@dataclass(frozen=True)
class _BtfType:
    kind: int
    name_off: int
    kind_flag: bool
    size_or_type: int
    data_off: int  # where the kind-specific data starts in the blob
    vlen: int


class _Btf:
    """Just enough of a BTF reader to find struct members and typedef'd prototypes."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 24:
            raise ValueError("BTF blob too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", blob, 0)
        if magic != 0xEB9F:
            raise ValueError(f"bad BTF magic {magic:#x}")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", blob, 8)
        self.blob = blob
        self.strings = blob[hdr_len + str_off : hdr_len + str_off + str_len]
        self.types: list[_BtfType | None] = [None]  # type id 0 is void
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos < end:
            name_off, info, size_or_type = struct.unpack_from("<III", blob, pos)
            kind = (info >> 24) & 0x1F
            vlen = info & 0xFFFF
            data_off = pos + 12
            self.types.append(_BtfType(kind, name_off, bool(info >> 31), size_or_type, data_off, vlen))
            pos = data_off + _FIXED_EXTRA.get(kind, 0) + _PER_MEMBER.get(kind, 0) * vlen

    def name(self, name_off: int) -> str:
        end = self.strings.find(b"\0", name_off)
        return self.strings[name_off:end].decode("ascii", "replace")

    def find(self, kind: int, name: str) -> int | None:
        wanted = name.encode()
        for type_id, entry in enumerate(self.types):
            if entry is not None and entry.kind == kind and entry.name_off:
                end = self.strings.find(b"\0", entry.name_off)
                if self.strings[entry.name_off : end] == wanted:
                    return type_id
        return None

    def resolve(self, type_id: int) -> int:
        """Follow typedefs and qualifiers to the underlying type."""
        for _ in range(32):
            entry = self.types[type_id]
            if entry is None or entry.kind not in _MODIFIERS:
                return type_id
            type_id = entry.size_or_type
        return type_id

    def member_bit_offset(self, struct_id: int, member: str) -> int | None:
        """Bit offset of ``member``, looking into anonymous structs and unions as C does."""
        entry = self.types[struct_id]
        if entry is None or entry.kind not in (_KIND_STRUCT, _KIND_UNION):
            return None
        for index in range(entry.vlen):
            name_off, member_type, offset = struct.unpack_from("<III", self.blob, entry.data_off + 12 * index)
            bit_offset = offset & 0xFFFFFF if entry.kind_flag else offset
            if name_off and self.name(name_off) == member:
                return bit_offset
            if not name_off:
                inner = self.member_bit_offset(self.resolve(member_type), member)
                if inner is not None:
                    return bit_offset + inner
        return None

    def typedef_proto_params(self, typedef_name: str) -> int | None:
        """Number of parameters of the function-pointer typedef ``typedef_name``."""
        type_id = self.find(_KIND_TYPEDEF, typedef_name)
        if type_id is None:
            return None
        entry = self.types[self.resolve(self.types[type_id].size_or_type)]  # type: ignore[union-attr]
        if entry is not None and entry.kind == _KIND_PTR:
            entry = self.types[self.resolve(entry.size_or_type)]
        if entry is None or entry.kind != _KIND_FUNC_PROTO:
            return None
        return entry.vlen


def parse_kernel_layout(blob: bytes) -> KernelLayout | None:
    """The layout facts from a vmlinux BTF blob; None when ``struct sock_common`` is not described."""
    btf = _Btf(blob)
    sock_common = btf.find(_KIND_STRUCT, "sock_common")
    if sock_common is None:
        return None
    family = btf.member_bit_offset(sock_common, "skc_family")
    daddr = btf.member_bit_offset(sock_common, "skc_daddr")
    if family is None or daddr is None:
        return None
    v6 = btf.member_bit_offset(sock_common, "skc_v6_daddr")

    def tp_args(event: str) -> int | None:
        params = btf.typedef_proto_params(f"btf_trace_{event}")
        return params - 1 if params else None  # the first parameter is the tracepoint's context

    return KernelLayout(
        skc_family=family // 8,
        skc_daddr=daddr // 8,
        skc_v6_daddr=v6 // 8 if v6 is not None else None,
        send_tp_args=tp_args("sock_send_length"),
        recv_tp_args=tp_args("sock_recv_length"),
    )


def read_kernel_layout(path: Path = VMLINUX_BTF) -> KernelLayout | None:
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        return parse_kernel_layout(blob)
    except (ValueError, struct.error, IndexError):
        return None


# ---------------------------------------------------------------- BPF program text


def build_bpf_text(
    source: str, mechanism: str, layout: KernelLayout | None, peer_entries: int = 16384, tgid_entries: int = 4096
) -> str:
    """The C program for one mechanism: defines first, then net_trace.c."""
    defines: dict[str, object] = {"PEER_ENTRIES": peer_entries, "TGID_ENTRIES": tgid_entries}
    if mechanism == MECHANISM_TRACEPOINT:
        positions = layout.tracepoint_arg_positions() if layout is not None else None
        if positions is None:
            raise CapabilityError(
                f"{VMLINUX_BTF}: no usable prototype for sock:sock_send_length/sock_recv_length; "
                "needs kernel >= 6.3 with BTF (or use the kprobe fallback)"
            )
        defines |= {"NET_TRACEPOINT": 1, "RET_ARG": positions[0], "FLAGS_ARG": positions[1]}
    elif mechanism == MECHANISM_KPROBE:
        defines["NET_KPROBE"] = 1
    else:
        raise ValueError(f"unknown mechanism {mechanism!r}")
    if layout is not None:
        defines |= {"SKC_FAMILY_OFF": layout.skc_family, "SKC_DADDR_OFF": layout.skc_daddr}
        if layout.skc_v6_daddr is not None:
            defines["SKC_V6_DADDR_OFF"] = layout.skc_v6_daddr
    return with_defines(defines, source)


# ---------------------------------------------------------------- classification (pure)


@dataclass(frozen=True)
class PeerTraffic:
    """The kernel's sums for one (process, peer address)."""

    pid: int
    family: int
    peer: IpAddress
    bytes_sent: int = 0
    bytes_received: int = 0
    calls_sent: int = 0
    calls_received: int = 0


def peer_from_key_bytes(raw: bytes) -> IpAddress:
    """The 16 address bytes of a map key; IPv4 (and IPv4-mapped IPv6) come back as IPv4."""
    address = ipaddress.IPv6Address(bytes(raw[:16]))
    return address.ipv4_mapped or address


def normalize_address(text: str) -> IpAddress:
    """An address string (psutil, /proc) as the classifier compares it: no zone, v4-mapped as v4."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def classify_peer(peer: IpAddress, local_addresses: frozenset[IpAddress]) -> str:
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    if peer.is_unspecified:
        return PEER_UNKNOWN
    if peer.is_loopback:
        return PEER_LOOPBACK
    if peer in local_addresses:
        return PEER_LOCAL
    return PEER_EXTERNAL


def aggregate_net_stats(
    totals: Mapping[int, NetStats],
    peers: Iterable[PeerTraffic],
    local_addresses: Mapping[int, frozenset[IpAddress]] | frozenset[IpAddress],
) -> dict[int, NetStats]:
    """NetStats per PID: totals from the exact per-process sums, the external part from the peers.

    ``local_addresses`` is one set for all PIDs or a set per PID (its own namespace's addresses
    plus the host's); a PID missing from the mapping has only loopback as same host.
    """
    external_sent: dict[int, int] = {}
    external_received: dict[int, int] = {}
    for traffic in peers:
        if isinstance(local_addresses, frozenset):
            local = local_addresses
        else:
            local = local_addresses.get(traffic.pid, frozenset())
        if classify_peer(traffic.peer, local) == PEER_EXTERNAL:
            external_sent[traffic.pid] = external_sent.get(traffic.pid, 0) + traffic.bytes_sent
            external_received[traffic.pid] = external_received.get(traffic.pid, 0) + traffic.bytes_received
    return {
        pid: NetStats(
            pid=pid,
            bytes_sent=total.bytes_sent,
            bytes_received=total.bytes_received,
            bytes_sent_external=external_sent.get(pid, 0),
            bytes_received_external=external_received.get(pid, 0),
            calls_sent=total.calls_sent,
            calls_received=total.calls_received,
        )
        for pid, total in sorted(totals.items())
    }


def parse_fib_trie_local(text: str) -> set[IpAddress]:
    """IPv4 addresses of a network namespace from /proc/<pid>/net/fib_trie ("/32 host LOCAL" leaves)."""
    found: set[IpAddress] = set()
    last_leaf: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last_leaf = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and last_leaf is not None:
            try:
                found.add(ipaddress.IPv4Address(last_leaf))
            except ValueError:
                pass
    return found


def parse_if_inet6(text: str) -> set[IpAddress]:
    """IPv6 addresses of a network namespace from /proc/<pid>/net/if_inet6 (32 hex digits per line)."""
    found: set[IpAddress] = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            try:
                found.add(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
            except ValueError:
                pass
    return found


# ---------------------------------------------------------------- local addresses (I/O)


def _netns_id(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def netns_addresses(pid: int | str) -> set[IpAddress]:
    """Addresses configured in the network namespace ``pid`` lives in (empty if it is gone)."""
    found: set[IpAddress] = set()
    for name, parse in (("fib_trie", parse_fib_trie_local), ("if_inet6", parse_if_inet6)):
        try:
            found |= parse(Path(f"/proc/{pid}/net/{name}").read_text(encoding="ascii", errors="replace"))
        except OSError:
            pass
    return found


def host_addresses() -> set[IpAddress]:
    """Addresses of this host in the profiler's own network namespace."""
    found: set[IpAddress] = set()
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for entry in addresses:
                if entry.family in (AF_INET, AF_INET6):
                    try:
                        found.add(normalize_address(entry.address))
                    except ValueError:
                        pass
    except (ImportError, OSError):
        pass
    return found | netns_addresses("self")


# ---------------------------------------------------------------- the tracer


class NetTracer:
    """Bytes and calls per PID, external vs same host, from socket tracepoints (kprobes as fallback).

    Lifecycle: ``start()`` (compile + attach), ``add_pid()`` any time, ``stop()`` (detach, keep the
    maps), ``collect()``, ``close()``. Same-host addresses are read at start and again at collect,
    from this namespace and from every traced process's network namespace.
    """

    def __init__(self, peer_entries: int = 16384, tgid_entries: int = 4096) -> None:
        self.peer_entries = peer_entries
        self.tgid_entries = tgid_entries
        self.mechanism: str | None = None
        self._bpf: Any = None  # bcc.BPF once started
        self._layout: KernelLayout | None = read_kernel_layout()
        self._pids: set[int] = set()
        self._host_addresses: set[IpAddress] = set()
        self._pid_netns: dict[int, str] = {}  # namespace of each traced PID, as first seen
        self._netns_addresses: dict[str, set[IpAddress]] = {}
        self._attached = False
        self._warnings: list[str] = []
        self._lock = threading.Lock()  # add_pid may come from the scope watcher's thread

    # -- program text

    def preferred_mechanism(self) -> str:
        layout = self._layout
        if layout is not None and layout.tracepoint_arg_positions() is not None:
            return MECHANISM_TRACEPOINT
        return MECHANISM_KPROBE

    def bpf_text(self, mechanism: str | None = None) -> str:
        source = BPF_SOURCE.read_text(encoding="utf-8")
        return build_bpf_text(
            source, mechanism or self.mechanism or self.preferred_mechanism(), self._layout,
            self.peer_entries, self.tgid_entries,
        )

    # -- lifecycle

    def start(self) -> str:
        if self._bpf is not None:
            raise RuntimeError("NetTracer.start() called twice")
        if os.geteuid() != 0:
            raise PrivilegeError("profiler run --net: eBPF needs root (or CAP_BPF and CAP_PERFMON); run with sudo")
        try:
            from bcc import BPF
        except ImportError:
            raise CapabilityError(
                "profiler/sampling/net.py: cannot import bcc; install python3-bpfcc (scripts/setup.sh)"
            ) from None
        self._host_addresses = host_addresses()
        errors: list[str] = []
        candidates = [MECHANISM_TRACEPOINT, MECHANISM_KPROBE]
        if self.preferred_mechanism() == MECHANISM_KPROBE:
            errors.append("tracepoint: no sock_send_length/sock_recv_length prototype in BTF (kernel < 6.3 or no BTF)")
            candidates = [MECHANISM_KPROBE]
        for mechanism in candidates:
            bpf = None
            try:
                bpf = compile_program(BPF, self.bpf_text(mechanism))
                if mechanism == MECHANISM_TRACEPOINT:
                    bpf.attach_raw_tracepoint(tp=b"sock_send_length", fn_name=b"net_send")
                    bpf.attach_raw_tracepoint(tp=b"sock_recv_length", fn_name=b"net_recv")
                else:
                    bpf.attach_kprobe(event=b"tcp_sendmsg", fn_name=b"net_send_entry")
                    bpf.attach_kretprobe(event=b"tcp_sendmsg", fn_name=b"net_send_return")
                    bpf.attach_kprobe(event=b"tcp_cleanup_rbuf", fn_name=b"net_recv_copied")
            except Exception as exc:  # noqa: BLE001 - bcc raises Exception for compile and attach failures alike
                errors.append(f"{mechanism}: {bcc_error(exc)}")
                if bpf is not None:
                    bpf.cleanup()
                continue
            self._bpf = bpf
            self.mechanism = mechanism
            self._attached = True
            for pid in sorted(self._pids):
                self._write_pid(pid)
            return mechanism
        raise CapabilityError(
            "profiler run --net: cannot attach socket tracing (" + "; ".join(errors) + "); "
            "needs kernel >= 6.3 (sock:sock_send_length) or kprobes (CONFIG_KPROBES); run without --net"
        )

    def add_pid(self, pid: int) -> None:
        """Count ``pid`` (all its threads) from now on; may be called before or after start()."""
        with self._lock:
            if pid in self._pids:
                return
            self._pids.add(pid)
            self._learn_netns(pid)
            if self._bpf is not None:
                self._write_pid(pid)

    def _write_pid(self, pid: int) -> None:
        import ctypes

        table = self._bpf[b"target_tgids"]
        table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def _learn_netns(self, pid: int) -> None:
        # A traced process's own namespace addresses are "this host" for it (containers, netns);
        # another namespace's addresses are not, as they would not be on another machine.
        namespace = _netns_id(pid) or self._pid_netns.get(pid)
        if namespace is None:
            return
        self._pid_netns.setdefault(pid, namespace)
        addresses = netns_addresses(pid)
        if addresses:
            self._netns_addresses.setdefault(namespace, set()).update(addresses)

    def local_addresses(self) -> dict[int, frozenset[IpAddress]]:
        """Same-host addresses per traced PID: the host's plus those of the PID's namespace."""
        return {
            pid: frozenset(self._host_addresses | self._netns_addresses.get(self._pid_netns.get(pid, ""), set()))
            for pid in self._pids
        }

    def stop(self) -> None:
        """Detach the probes; the maps stay readable for collect()."""
        if self._bpf is None or not self._attached:
            return
        bpf = self._bpf
        if self.mechanism == MECHANISM_TRACEPOINT:
            for tp in (b"sock_send_length", b"sock_recv_length"):
                try:
                    bpf.detach_raw_tracepoint(tp=tp)
                except Exception:  # noqa: BLE001 - already gone: nothing to detach
                    pass
        else:
            probes = ((bpf.detach_kprobe, b"tcp_sendmsg"), (bpf.detach_kretprobe, b"tcp_sendmsg"),
                      (bpf.detach_kprobe, b"tcp_cleanup_rbuf"))
            for detach, event in probes:
                try:
                    detach(event=event)
                except Exception:  # noqa: BLE001 - already gone: nothing to detach
                    pass
        self._attached = False

    def read_peers(self) -> tuple[dict[int, NetStats], list[PeerTraffic]]:
        """Raw sums from the maps: exact per-process totals and the per-peer split."""
        if self._bpf is None:
            return {}, []
        totals: dict[int, NetStats] = {}
        for key, value in self._bpf[b"tgid_traffic"].items():
            pid = int(key.value)
            totals[pid] = NetStats(
                pid=pid,
                bytes_sent=int(value.bytes_sent),
                bytes_received=int(value.bytes_received),
                calls_sent=int(value.calls_sent),
                calls_received=int(value.calls_received),
            )
        peers: list[PeerTraffic] = []
        for key, value in self._bpf[b"peer_traffic"].items():
            peers.append(
                PeerTraffic(
                    pid=int(key.tgid),
                    family=int(key.family),
                    peer=peer_from_key_bytes(bytes(key.addr)),
                    bytes_sent=int(value.bytes_sent),
                    bytes_received=int(value.bytes_received),
                    calls_sent=int(value.calls_sent),
                    calls_received=int(value.calls_received),
                )
            )
        return totals, peers

    def collect(self) -> dict[int, NetStats]:
        """NetStats for every added PID (zeros when it moved no bytes)."""
        totals, peers = self.read_peers()
        with self._lock:
            for pid in sorted(self._pids):
                self._learn_netns(pid)
            self._host_addresses |= host_addresses()
            local = self.local_addresses()
            pids = set(self._pids)
        stats = aggregate_net_stats(totals, peers, local)
        for pid in pids:
            stats.setdefault(pid, NetStats(pid=pid))
        self._check_drops()
        return {pid: stats[pid] for pid in sorted(stats)}

    def _check_drops(self) -> None:
        if self._bpf is None:
            return
        dropped = self._bpf[b"dropped"]
        calls, lost_bytes = int(dropped[0].value), int(dropped[1].value)
        if calls:
            message = (
                f"net: {calls} calls ({lost_bytes} bytes) had no room in the peer map; they count in the "
                f"totals but not as external; raise NetTracer(peer_entries=...) above {self.peer_entries}"
            )
            if message not in self._warnings:
                self._warnings.append(message)

    @property
    def warnings(self) -> list[str]:
        """End-of-run warnings (one line each, naming what to change); complete after collect()."""
        return list(self._warnings)

    @property
    def prog_ids(self) -> list[int]:
        """Kernel ids of the loaded BPF programs (for bpf_stats run time)."""
        from .program import bpf_prog_ids

        return bpf_prog_ids(self._bpf)

    def close(self) -> None:
        """Detach and unload everything; safe to call more than once."""
        self.stop()
        if self._bpf is not None:
            bpf, self._bpf = self._bpf, None
            bpf.cleanup()

    def __enter__(self) -> NetTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
