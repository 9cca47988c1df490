"""Peer classification, namespace address parsing and the BTF reader of profiler/sampling/net.py (no eBPF)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from profiler.capture.format import NetStats
from profiler.errors import CapabilityError
from profiler.sampling.net import (
    MECHANISM_KPROBE,
    MECHANISM_TRACEPOINT,
    PEER_EXTERNAL,
    PEER_LOCAL,
    PEER_LOOPBACK,
    PEER_UNKNOWN,
    KernelLayout,
    PeerTraffic,
    aggregate_net_stats,
    build_bpf_text,
    classify_peer,
    normalize_address,
    parse_fib_trie_local,
    parse_if_inet6,
    parse_kernel_layout,
    peer_from_key_bytes,
)

ip = ipaddress.ip_address
LOCAL = frozenset({ip("192.0.2.2"), ip("fd00::2"), ip("10.213.0.1")})


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("127.0.0.1", PEER_LOOPBACK),
        ("127.8.9.10", PEER_LOOPBACK),
        ("::1", PEER_LOOPBACK),
        ("::ffff:127.0.0.1", PEER_LOOPBACK),
        ("192.0.2.2", PEER_LOCAL),
        ("::ffff:192.0.2.2", PEER_LOCAL),
        ("fd00::2", PEER_LOCAL),
        ("192.0.2.3", PEER_EXTERNAL),
        ("10.213.0.2", PEER_EXTERNAL),
        ("::ffff:10.213.0.2", PEER_EXTERNAL),
        ("2001:db8::1", PEER_EXTERNAL),
        ("0.0.0.0", PEER_UNKNOWN),
        ("::", PEER_UNKNOWN),
    ],
)
def test_classify_peer(peer: str, expected: str) -> None:
    assert classify_peer(ip(peer), LOCAL) == expected


def test_key_bytes_v4_mapped_come_back_as_ipv4() -> None:
    assert peer_from_key_bytes(bytes(10) + b"\xff\xff" + bytes([10, 213, 0, 2])) == ip("10.213.0.2")
    assert peer_from_key_bytes(ipaddress.IPv6Address("fd00::2").packed) == ip("fd00::2")
    assert normalize_address("fe80::1%eth0") == ip("fe80::1")
    assert normalize_address("::ffff:1.2.3.4") == ip("1.2.3.4")


def test_aggregate_uses_exact_totals_and_each_pids_own_local_addresses() -> None:
    totals = {
        10: NetStats(10, bytes_sent=1000, bytes_received=500, calls_sent=3, calls_received=2),
        20: NetStats(20, bytes_sent=70, bytes_received=80, calls_sent=1, calls_received=1),
    }
    peers = [
        PeerTraffic(10, 2, ip("10.213.0.2"), bytes_sent=600, bytes_received=100),
        PeerTraffic(10, 2, ip("127.0.0.1"), bytes_sent=300, bytes_received=300),
        # 100 sent bytes of pid 10 had no room in the peer map: total only
        PeerTraffic(20, 10, ip("10.213.0.2"), bytes_sent=70, bytes_received=80),
    ]
    stats = aggregate_net_stats(totals, peers, {10: frozenset(), 20: frozenset({ip("10.213.0.2")})})
    assert stats[10] == NetStats(10, 1000, 500, 600, 100, 3, 2)
    assert stats[20] == NetStats(20, 70, 80, 0, 0, 1, 1)  # its own namespace's address: same host
    shared = aggregate_net_stats(totals, peers, frozenset())
    assert shared[20].bytes_sent_external == 70


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 10.213.0.0/30 2 0 2
        |-- 10.213.0.0
           /30 link UNICAST
        |-- 10.213.0.1
           /32 host LOCAL
        |-- 10.213.0.3
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.0
           /8 host LOCAL
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
        |-- 10.213.0.1
           /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 02 40 00 80     eth0
garbage
"""


def test_namespace_address_parsers() -> None:
    assert parse_fib_trie_local(FIB_TRIE) == {ip("10.213.0.1"), ip("127.0.0.1")}
    assert parse_if_inet6(IF_INET6) == {ip("::1"), ip("fd00::2")}


# ---------------------------------------------------------------- a synthetic BTF blob


class BtfBuilder:
    """Writes the subset of BTF the reader understands (include/uapi/linux/btf.h)."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types: list[bytes] = []

    def name(self, text: str) -> int:
        if not text:
            return 0
        offset = len(self.strings)
        self.strings += text.encode() + b"\0"
        return offset

    def add(
        self, kind: int, name: str, vlen: int, size_or_type: int, extra: bytes = b"", kind_flag: bool = False
    ) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kind_flag else 0)
        self.types.append(struct.pack("<III", self.name(name), info, size_or_type) + extra)
        return len(self.types)

    def int_type(self, name: str, size: int) -> int:
        return self.add(1, name, 0, size, struct.pack("<I", size * 8))

    def composite(self, kind: int, name: str, size: int, members: list[tuple[str, int, int]]) -> int:
        extra = b"".join(struct.pack("<III", self.name(m), t, bits) for m, t, bits in members)
        return self.add(kind, name, len(members), size, extra)

    def blob(self) -> bytes:
        types = b"".join(self.types)
        header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(self.strings))
        return header + types + bytes(self.strings)


def _kernel_blob(tp_params: int | None, with_v6: bool = True) -> bytes:
    b = BtfBuilder()
    u32 = b.int_type("unsigned int", 4)
    u16 = b.int_type("short unsigned int", 2)
    be32 = b.add(8, "__be32", 0, u32)  # typedef
    in6 = b.composite(4, "in6_addr", 16, [])
    pair = b.composite(4, "", 8, [("skc_daddr", be32, 0), ("skc_rcv_saddr", be32, 32)])
    union = b.composite(5, "", 8, [("skc_addrpair", u32, 0), ("", pair, 0)])
    members = [("", union, 0), ("skc_hash", u32, 64), ("skc_family", u16, 128)]
    if with_v6:
        members.append(("skc_v6_daddr", in6, 56 * 8))
    b.composite(4, "sock_common", 136, members)
    b.add(6, "unrelated_enum", 2, 4, bytes(16))
    if tp_params is not None:
        void_ptr = b.add(2, "", 0, 0)
        proto = b.add(13, "", tp_params, 0, b"".join(struct.pack("<II", 0, void_ptr) for _ in range(tp_params)))
        ptr = b.add(2, "", 0, proto)
        b.add(8, "btf_trace_sock_send_length", 0, ptr)
        b.add(8, "btf_trace_sock_recv_length", 0, ptr)
    return b.blob()


def test_btf_layout_from_nested_anonymous_members() -> None:
    layout = parse_kernel_layout(_kernel_blob(tp_params=4))
    assert layout == KernelLayout(skc_family=16, skc_daddr=0, skc_v6_daddr=56, send_tp_args=3, recv_tp_args=3)
    assert layout.tracepoint_arg_positions() == (1, 2)


def test_btf_five_argument_prototype_and_missing_tracepoint() -> None:
    layout = parse_kernel_layout(_kernel_blob(tp_params=6, with_v6=False))
    assert layout is not None and layout.skc_v6_daddr is None
    assert layout.tracepoint_arg_positions() == (3, 4)
    old = parse_kernel_layout(_kernel_blob(tp_params=None))
    assert old is not None and old.tracepoint_arg_positions() is None
    with pytest.raises(CapabilityError, match="kernel >= 6.3"):
        build_bpf_text("/* program */", MECHANISM_TRACEPOINT, old)
    with pytest.raises(ValueError):
        parse_kernel_layout(b"\x00" * 32)


def test_bpf_text_defines() -> None:
    layout = KernelLayout(16, 0, 56, 3, 3)
    text = build_bpf_text("/* program */", MECHANISM_TRACEPOINT, layout, peer_entries=100)
    assert "#define NET_TRACEPOINT 1" in text and "#define RET_ARG 1" in text and "#define FLAGS_ARG 2" in text
    assert "#define SKC_V6_DADDR_OFF 56" in text and "#define PEER_ENTRIES 100" in text
    assert text.endswith("/* program */")
    kprobe = build_bpf_text("/* program */", MECHANISM_KPROBE, None)
    assert "#define NET_KPROBE 1" in kprobe and "SKC_FAMILY_OFF" not in kprobe  # headers' offsetof() then
