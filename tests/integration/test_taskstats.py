"""The real taskstats listener: exits of other namespaces arrive with host pids; forged datagrams do not count."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from profiler.sampling.taskstats import NETLINK_GENERIC, TaskstatsListener, ThreadExit
from tests.fixtures.taskstats import exit_message, stats_record

REPO = Path(__file__).resolve().parents[2]

# Inside a new pid namespace getpid() is 1; /proc (the host's, not remounted) still names its host pid.
BURN = (
    "import os, time\n"
    "print(os.getpid(), os.readlink('/proc/self'), flush=True)\n"
    "end = time.process_time() + 0.2\n"
    "while time.process_time() < end: pass\n"
)


def _records_of(listener: TaskstatsListener, pid: int, timeout: float = 5.0) -> list[ThreadExit]:
    deadline = time.monotonic() + timeout
    found: list[ThreadExit] = []
    while time.monotonic() < deadline and not found:
        found = [record for record in listener.drain() if record.tgid == pid]
        time.sleep(0.05)
    return found


def test_exit_in_its_own_pid_and_network_namespace_arrives_with_its_host_pid() -> None:
    listener = TaskstatsListener()
    try:
        # GIVEN a process that is pid 1 of a new pid namespace, in a new network namespace
        child = subprocess.run(
            ["unshare", "-p", "-n", "-f", "--kill-child", sys.executable, "-c", BURN],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        inner_pid, host_pid = (int(word) for word in child.stdout.split())
        # WHEN it has exited: its record is looked up by its host pid
        records = _records_of(listener, host_pid)
    finally:
        listener.close()
    assert inner_pid == 1 and host_pid != 1
    # THEN the record arrived under the host pid, with the ~0.2 s it burned
    assert [record.tid for record in records] == [host_pid]
    assert 0.15e9 < records[0].cpu_ns < 0.4e9, records[0]


def test_a_datagram_from_another_process_is_not_taken_for_the_kernels() -> None:
    listener = TaskstatsListener()
    forger = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    try:
        forger.bind((0, 0))
        port = listener.port  # an address any local process can learn
        forged = exit_message(listener.family_id, 424242, stats_record(424242, 424242, cpu_ns=10**12))
        forger.sendto(forged, (port, 0))
        time.sleep(0.05)
        assert not [record for record in listener.drain() if record.tid == 424242]
        assert listener.counts.skipped.get("not from the kernel") == 1
    finally:
        forger.close()
        listener.close()
    assert listener.drain() == []  # closed: nothing more, no error


def test_without_cap_net_admin_the_source_says_why_and_delivers_nothing() -> None:
    # GIVEN an agent process that lost CAP_NET_ADMIN (setpriv drops it from every set)
    code = "from profiler.sampling.taskstats import open_exit_source\nsource = open_exit_source()\n"
    code += "print(source.unavailable)\nprint(len(source.drain()))\nsource.close()\n"
    argv = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin", sys.executable, "-c", code]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    # THEN it says why, in the words the counters' notes carry, and never raises
    assert result.stdout.splitlines() == ["taskstats unavailable (registering needs CAP_NET_ADMIN)", "0"]


def test_in_another_network_namespace_registering_succeeds_but_the_source_says_it_hears_nothing() -> None:
    # GIVEN an agent in a network namespace of its own: the kernel accepts the registration there but sends
    # exit records only to sockets of the initial namespace (checked: 0 records where the host gets them)
    code = "from profiler.sampling.taskstats import open_exit_source\nsource = open_exit_source()\n"
    code += "print(source.unavailable)\nsource.close()\n"
    inside = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True, cwd=REPO)  # fmt: skip
    host = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=REPO
    )
    # THEN the source says so instead of promising exits it will never deliver; on the host it registers
    assert inside.stdout.strip().startswith("taskstats unavailable (registered, but no exit record arrives")
    assert host.stdout.strip() == ""
