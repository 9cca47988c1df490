"""Real eBPF socket tracing: exact byte counts over loopback and between two network namespaces."""

from __future__ import annotations

import os
import socket

import psutil
import pytest
from bcc import BPF

from profiler.bpf.pidns import with_own_ids
from profiler.capture.format import NetStats
from profiler.sampling.net import MECHANISM_KPROBE, MECHANISM_TRACEPOINT, NetTracer
from tests.fixtures.leaks import bpf_programs_held_by
from tests.fixtures.netns import HEADER, NetnsPair, Worker, WorkerFactory


def _run(clients: list[Worker]) -> None:
    for client in clients:
        client.send("go")
    for client in clients:
        client.expect("done", timeout=60)


def _expected(upload: int, download: int, rounds: int) -> tuple[int, int]:
    return rounds * (HEADER.size + upload), rounds * download


def test_loopback_v4_v6_and_mapped_counted_exactly_others_excluded(traffic_workers: WorkerFactory) -> None:
    # GIVEN servers on 127.0.0.1 and ::1, three traced clients (IPv4, IPv6, v4-mapped IPv6) and one
    # untraced client that moves far more bytes at the same time
    server4 = traffic_workers.server("127.0.0.1")
    server6 = traffic_workers.server("::1")
    assert server4.port and server6.port
    v4 = traffic_workers.client("127.0.0.1", server4.port, upload=300_001, download=70_003, rounds=3)
    v6 = traffic_workers.client("::1", server6.port, upload=12_345, download=1_000_000, rounds=2)
    mapped = traffic_workers.client("::ffff:127.0.0.1", server4.port, upload=5_000, download=4_321, rounds=4, family=6)
    other = traffic_workers.client("127.0.0.1", server4.port, upload=2_000_000, download=2_000_000, rounds=3)

    tracer = NetTracer()
    try:
        mechanism = tracer.start()
        assert mechanism == MECHANISM_TRACEPOINT  # kernel 6.18 here
        assert len(tracer.prog_ids) == 2  # send and receive programs
        for client in (v4, v6, mapped):
            tracer.add_pid(client.pid)
        # WHEN all four clients run concurrently
        _run([v4, v6, mapped, other])
        tracer.stop()
        stats = tracer.collect()
        assert tracer.warnings == []
    finally:
        tracer.close()
        tracer.close()  # idempotent
    assert tracer.prog_ids == []

    # THEN each traced PID has exactly its bytes, all same-host, and the untraced one is absent
    assert set(stats) == {v4.pid, v6.pid, mapped.pid}
    for client, (upload, download, rounds) in (
        (v4, (300_001, 70_003, 3)),
        (v6, (12_345, 1_000_000, 2)),
        (mapped, (5_000, 4_321, 4)),
    ):
        sent, received = _expected(upload, download, rounds)
        got = stats[client.pid]
        assert (got.bytes_sent, got.bytes_received) == (sent, received), got
        assert got.bytes_sent_external == 0 and got.bytes_received_external == 0, got
        assert got.calls_sent >= rounds and got.calls_received >= rounds, got
    assert not bpf_programs_held_by({os.getpid()}), "close() left programs loaded"


def test_netns_peer_is_external_own_namespace_address_is_local(
    traffic_workers: WorkerFactory, netns_pair: NetnsPair
) -> None:
    # GIVEN a server in namespace B and one in namespace A; in A: a client to B (IPv4), a client to
    # B over a v4-mapped IPv6 socket, a client to A's own veth address, and an untraced client to B
    server_b = traffic_workers.server(netns_pair.address_b, netns=netns_pair.ns_b)
    server_a = traffic_workers.server(netns_pair.address_a, netns=netns_pair.ns_a)
    assert server_a.port and server_b.port
    to_b = traffic_workers.client(netns_pair.address_b, server_b.port, 200_000, 50_000, rounds=2, netns=netns_pair.ns_a)
    to_b6 = traffic_workers.client(
        f"::ffff:{netns_pair.address_b}", server_b.port, 7_777, 8_888, rounds=3, netns=netns_pair.ns_a, family=6
    )
    to_self = traffic_workers.client(netns_pair.address_a, server_a.port, 9_999, 123_456, netns=netns_pair.ns_a)
    other = traffic_workers.client(netns_pair.address_b, server_b.port, 1_500_000, 1_500_000, netns=netns_pair.ns_a)

    tracer = NetTracer()
    try:
        tracer.start()
        for worker in (to_b, to_b6, to_self, server_b):
            tracer.add_pid(worker.pid)
        # WHEN they run concurrently
        _run([to_b, to_b6, to_self, other])
        tracer.stop()
        stats = tracer.collect()
    finally:
        tracer.close()

    # THEN the clients of B count as external, the client of A's own address as same host
    sent, received = _expected(200_000, 50_000, 2)
    assert stats[to_b.pid] == NetStats(to_b.pid, sent, received, sent, received,
                                       stats[to_b.pid].calls_sent, stats[to_b.pid].calls_received)
    sent, received = _expected(7_777, 8_888, 3)
    got = stats[to_b6.pid]
    assert (got.bytes_sent, got.bytes_received, got.bytes_sent_external, got.bytes_received_external) == (
        sent, received, sent, received)
    sent, received = _expected(9_999, 123_456, 1)
    got = stats[to_self.pid]
    assert (got.bytes_sent, got.bytes_received, got.bytes_sent_external, got.bytes_received_external) == (
        sent, received, 0, 0)
    # The server in B sees the clients in A as another host; it served three of the four clients
    # traced or not, so its receive side is exactly theirs.
    served_received = sum(_expected(u, d, r)[0] for u, d, r in ((200_000, 50_000, 2), (7_777, 8_888, 3),
                                                                (1_500_000, 1_500_000, 1)))
    served_sent = sum(_expected(u, d, r)[1] for u, d, r in ((200_000, 50_000, 2), (7_777, 8_888, 3),
                                                            (1_500_000, 1_500_000, 1)))
    got = stats[server_b.pid]
    assert (got.bytes_received, got.bytes_sent) == (served_received, served_sent)
    assert (got.bytes_received_external, got.bytes_sent_external) == (served_received, served_sent)
    assert other.pid not in stats


def test_pid_added_mid_window_counts_from_then_on(traffic_workers: WorkerFactory) -> None:
    server = traffic_workers.server("127.0.0.1")
    assert server.port
    before = traffic_workers.client("127.0.0.1", server.port, 50_000, 50_000, rounds=2)
    after = traffic_workers.client("127.0.0.1", server.port, 40_000, 30_000, rounds=2)
    tracer = NetTracer()
    try:
        tracer.start()
        _run([before])  # not added yet: not counted
        tracer.add_pid(after.pid)
        tracer.add_pid(before.pid)
        _run([after])
        stats = tracer.collect()  # while still attached
    finally:
        tracer.close()
    assert stats[before.pid] == NetStats(before.pid)
    sent, received = _expected(40_000, 30_000, 2)
    assert (stats[after.pid].bytes_sent, stats[after.pid].bytes_received) == (sent, received)


def test_kprobe_fallback_program_passes_the_verifier() -> None:
    # This kernel has no kprobes, so the fallback cannot be attached here; compile and load it so
    # the verifier checks it, then unload.
    tracer = NetTracer()
    bpf = BPF(text=with_own_ids(tracer.bpf_text(MECHANISM_KPROBE)).encode())  # as compile_program builds it
    try:
        for name in (b"net_send_entry", b"net_send_return", b"net_recv_copied"):
            assert bpf.load_func(name, BPF.KPROBE).fd >= 0
    finally:
        bpf.cleanup()
    assert not bpf_programs_held_by({psutil.Process().pid})


def test_failed_calls_peeks_and_udp_in_this_process() -> None:
    # GIVEN the tracer on this test process itself, with room for one peer only (two are used:
    # 127.0.0.1 of the connected socket, and 0.0.0.0 of the unconnected ones: unknown peer)
    tracer = NetTracer(peer_entries=1)
    sent = received = calls_sent = calls_received = 0
    try:
        tracer.start()
        tracer.add_pid(os.getpid())
        # a send on an unconnected TCP socket fails (EPIPE): no bytes, no call
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as unconnected, pytest.raises(OSError):
            unconnected.send(b"x" * 100)
        # connected UDP over loopback, and unconnected sendto (peer unknown: total only)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            server.bind(("127.0.0.1", 0))
            client.connect(server.getsockname())
            for size in (1000, 1, 65000):
                sent += client.send(b"u" * size)
                calls_sent += 1
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as loose:
                for size in (10, 20):
                    sent += loose.sendto(b"v" * size, server.getsockname())
                    calls_sent += 1
            # a peek leaves the datagram queued: only the real read counts
            assert len(server.recv(70000, socket.MSG_PEEK)) == 1000
            for _ in range(5):
                received += len(server.recv(70000))
                calls_received += 1
            tracer.stop()
            client.send(b"after stop: not counted")
            server.recv(100)
        stats = tracer.collect()[os.getpid()]
    finally:
        tracer.close()
    # THEN exactly the successful bytes, nothing external
    assert received == sent == 1000 + 1 + 65000 + 10 + 20
    assert (stats.bytes_sent, stats.bytes_received) == (sent, received), stats
    assert (stats.calls_sent, stats.calls_received) == (calls_sent, calls_received), stats
    assert stats.bytes_sent_external == stats.bytes_received_external == 0
    # the totals stay exact when the peer map is full, and the run says what to raise
    assert len(tracer.warnings) == 1 and "peer_entries" in tracer.warnings[0], tracer.warnings
