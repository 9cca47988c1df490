"""`coordinator profile` over real sshd against hosts in their own network, UTS, mount and PID namespaces
(tests/fixtures/nshosts.py), each running one CpuSplit JVM that burns a method of its own: every host's
agent runs inside its host's PID namespace, finds its JVM by the namespace's PIDs and must sample that JVM
and nothing of the other hosts (docs/cluster-namespaces.md).

Prints one `FIGURE` line (pytest -s): the window skew between hosts and the samples per host.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator import rundir
from coordinator.cli import main as coordinator_main
from profiler.capture.read import read_meta, read_net, read_scope
from tests.fixtures import netns
from tests.fixtures.jvm import CpuSplitJvm, start_cpu_split, wait_cpu_splits_ready
from tests.fixtures.netns import Worker
from tests.fixtures.nshosts import NamespacedHost, NamespacedHosts, ns_pid
from tests.fixtures.privileges import requires

pytestmark = requires("root", "unshare")

HOSTS = 3
BURNERS = {"node1": "alpha", "node2": "beta", "node3": "gamma"}  # each host's JVM burns only its own method
TASKS = {"alpha": "Alpha", "beta": "Beta", "gamma": "Gamma"}
PROFILE = "# one task per burner\nAlpha: burnAlpha\nBeta: burnBeta\nGamma: burnGamma\n"
KNOWN_SPES = "cpusplit workload burner com.example.CpuSplit\n"
MAX_SKEW_S = 1.0  # hosts start sampling within this of each other (the coordinator's common start)


def test_harness_hosts_are_isolated_and_reach_each_other(namespaced_hosts: NamespacedHosts) -> None:
    hosts = namespaced_hosts.start(2)
    inside = [
        subprocess.run(
            [*host.enter(), "sh", "-c", "hostname; ls /proc | grep -c '^[0-9]*$'; ls -A /tmp; echo $$"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split("\n")
        for host in hosts
    ]  # fmt: skip
    for host, (hostname, processes, *_rest) in zip(hosts, inside, strict=True):
        assert hostname == host.name
        # its sshd, nsenter's shell and ls: not the thousands of this machine
        assert int(processes) < 10, f"{host.name} sees {processes} processes"
    (hosts[0].directory / "tmp" / "mine").write_text("")
    assert "mine" in subprocess.run([*hosts[0].enter(), "ls", "/tmp"], capture_output=True, text=True).stdout
    assert "mine" not in subprocess.run([*hosts[1].enter(), "ls", "/tmp"], capture_output=True, text=True).stdout
    # host 1 reaches host 2's sshd on its address (a real banner), through the bridge
    peer = (hosts[1].address, hosts[1].sshd.port)
    probe = f"import socket; print(socket.create_connection({peer!r}, 5).recv(4))"
    reply = subprocess.run([*hosts[0].enter(), "python3", "-c", probe], capture_output=True, text=True, timeout=30)
    assert reply.stdout.strip() == "b'SSH-'", reply.stderr
    # and our namespace cannot bind the hosts' addresses: they are theirs alone
    with socket.socket() as sock, pytest.raises(OSError):
        sock.bind((hosts[0].address, 0))


@pytest.fixture
def classpath(cpu_split_classpath: Path, namespaced_hosts: NamespacedHosts) -> Path:
    """CpuSplit's classes where the hosts see them (their /tmp is their own)."""
    target = namespaced_hosts.base / "classes"
    shutil.copytree(cpu_split_classpath, target)
    os.chmod(target, 0o755)
    return target


@pytest.fixture
def host_jvms(namespaced_hosts: NamespacedHosts, classpath: Path) -> Iterator[dict[str, CpuSplitJvm]]:
    hosts = namespaced_hosts.start(HOSTS)
    jvms: dict[str, CpuSplitJvm] = {}
    try:
        for host in hosts:  # side by side: their start-ups and warm-ups overlap
            burner = BURNERS[host.name]
            jvms[host.name] = start_cpu_split(
                classpath, weights={burner: 100}, threads=1, warmup_ms=1500, prefix=host.enter(), wait=False
            )  # fmt: skip
        wait_cpu_splits_ready(list(jvms.values()))
        yield jvms
    finally:
        for jvm in jvms.values():
            jvm.kill()


def _java_of(host: NamespacedHost) -> int:
    """The host's JVM as its own namespace numbers it."""
    javas = [pid for pid in host.pids() if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java"]
    assert len(javas) == 1, f"{host.name}: {javas}"
    return ns_pid(javas[0])


def test_each_host_samples_only_its_own_jvm(
    namespaced_hosts: NamespacedHosts, host_jvms: dict[str, CpuSplitJvm], tmp_path: Path
) -> None:
    # GIVEN three namespaced hosts, each with one JVM burning its own method
    hosts = namespaced_hosts.hosts
    own_pid = {host.name: _java_of(host) for host in hosts}
    cluster, known_hosts = namespaced_hosts.cluster_file()
    profile, known = tmp_path / "profile.txt", tmp_path / "known_spes.txt"
    profile.write_text(PROFILE)
    known.write_text(KNOWN_SPES)
    out = tmp_path / "run"
    # WHEN the real CLI profiles them over SSH for 6 s (the start delay, the latest start, covers three agents'
    # BPF compiles at once on two cores when the compile cache is cold: 20 s was short by 1.9 s in the suite;
    # the hosts start together as soon as all are attached, so a long bound costs nothing)
    started = time.monotonic()
    code = coordinator_main([
        "profile", "--cluster", str(cluster), "--known-hosts", str(known_hosts), "--out", str(out),
        "--profile", str(profile), "--known-spes", str(known), "--duration", "6", "--quiet", "--start-delay", "60",
    ])  # fmt: skip
    elapsed = time.monotonic() - started
    # THEN every host is ok, and its capture holds its own JVM only, by its namespace's PID
    assert code == 0
    info = rundir.read_run(out)
    assert sorted(h.host for h in info.hosts) == [h.name for h in hosts]
    for host in info.hosts:
        assert host.state == "ok", f"{host.host}: {host.state}"
        scope = read_scope(rundir.host_capture_dir(out, host.host))
        assert [(p.pid, p.kind) for p in scope] == [(own_pid[host.host], "burner")], scope
        assert f"--weights {BURNERS[host.host]}=100" in scope[0].cmdline  # the summary keeps the arguments
        # our own walker loads inside a namespace too (the namespace's ids read once per sample, not per frame)
        warnings = read_meta(rundir.host_capture_dir(out, host.host)).warnings
        assert not [w for w in warnings if "walker unavailable" in w], warnings
    rows = list(csv.DictReader((out / "summary.csv").open(newline="")))
    samples = _samples(rows)
    for host in hosts:
        mine = TASKS[BURNERS[host.name]]
        assert samples[(host.name, mine)] > 0, f"{host.name} has no sample of its own JVM's {mine}"
        others = {task: samples.get((host.name, task), 0) for task in TASKS.values() if task != mine}
        assert others == dict.fromkeys(others, 0), f"{host.name} sampled another host's burner: {others}"
        pids = {row["pid"] for row in rows if row["host"] == host.name and row["pid"] != "*"}
        assert pids == {str(own_pid[host.name])}
    # AND the host rows add up to the cluster rows, task by task
    for task in [*TASKS.values(), "unmatched", "*"]:
        assert samples[("*", task)] == sum(samples.get((h.name, task), 0) for h in hosts), task
    # AND the windows start together
    starts = [h.start_time - (h.clock_offset or 0.0) for h in info.hosts]
    skew = max(starts) - min(starts)
    print(
        f"FIGURE namespaced hosts: hosts={len(hosts)}, skew_s={skew:.3f}, elapsed_s={elapsed:.1f}, "
        + ", ".join(f"{h.name}={samples[(h.name, '*')]}" for h in hosts)
        + f", ns_pids={sorted(own_pid.values())}, load={os.getloadavg()[0]:.1f}"
    )
    assert skew < MAX_SKEW_S


def _samples(rows: list[dict[str, str]]) -> dict[tuple[str, str], int]:
    """Samples of the host rows (host, task) and cluster rows ("*", task)."""
    return {(row["host"], row["task"]): int(row["samples"] or 0) for row in rows if row["pid"] == "*"}


ROUNDS, UPLOAD, DOWNLOAD = 40, 10_000, 30_000
HEADER_BYTES = netns.HEADER.size
TRAFFIC_SPES = "traffic workload worker netns.py\n"  # the workers of tests/fixtures/netns.py


def _worker(host: NamespacedHost, *args: object) -> Worker:
    command = [*host.enter(), sys.executable, str(netns.WORKER), *map(str, args)]
    return Worker(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))


def _wait_sampling(hosts: list[NamespacedHost], timeout: float = 120.0) -> None:
    """Until every host's agent says it samples (its status file in the host's /tmp)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for host in hosts:
            for path in (host.directory / "tmp").glob("taskprof.*/status.json"):
                try:
                    states.append(json.loads(path.read_text()).get("state"))
                except (OSError, ValueError):
                    continue
        if states.count("sampling") == len(hosts):
            return
        time.sleep(0.1)
    raise AssertionError(f"not every host sampling within {timeout} s")


def test_bytes_between_hosts_are_external_loopback_is_not(namespaced_hosts: NamespacedHosts, tmp_path: Path) -> None:
    # GIVEN node2 serving on its address; on node1 a client of it, and a client of a loopback server
    node1, node2 = namespaced_hosts.start(2)
    workers: list[Worker] = []
    try:
        remote_server = _worker(node2, "server", node2.address)
        local_server = _worker(node1, "server", "127.0.0.1")
        workers += [remote_server, local_server]
        remote_server.port = int(remote_server.expect("ready").split()[1])
        local_server.port = int(local_server.expect("ready").split()[1])
        remote_client = _worker(node1, "client", node2.address, remote_server.port, UPLOAD, DOWNLOAD, ROUNDS)
        local_client = _worker(node1, "client", "127.0.0.1", local_server.port, UPLOAD, DOWNLOAD, ROUNDS)
        workers += [remote_client, local_client]
        for client in (remote_client, local_client):
            client.expect("ready")
        pid_of = {name: _ns_pid_of_cmdline(host, marker) for name, host, marker in (
            ("remote_client", node1, f"client {node2.address}"), ("local_client", node1, "client 127.0.0.1"),
            ("remote_server", node2, f"server {node2.address}"), ("local_server", node1, "server 127.0.0.1"),
        )}  # fmt: skip
        cluster, known_hosts = namespaced_hosts.cluster_file()
        profile, known = tmp_path / "profile.txt", tmp_path / "known_spes.txt"
        profile.write_text("Python: re:.+\n")
        known.write_text(TRAFFIC_SPES)
        out = tmp_path / "run"
        codes: list[int] = []
        # WHEN both hosts are profiled with --net and the clients talk while they sample
        coordinator = threading.Thread(target=lambda: codes.append(coordinator_main([
            "profile", "--cluster", str(cluster), "--known-hosts", str(known_hosts), "--out", str(out), "--net",
            "--profile", str(profile), "--known-spes", str(known), "--duration", "6", "--quiet", "--start-delay", "3",
            "--no-analyze",
        ])))  # fmt: skip
        coordinator.start()
        _wait_sampling([node1, node2])
        for client in (remote_client, local_client):
            client.send("go")
        for client in (remote_client, local_client):
            client.expect("done", timeout=30)
        coordinator.join(timeout=300)
    finally:
        for worker in workers:
            worker.stop()
    # THEN the bytes to the other host are external on both ends, the loopback ones are not
    assert codes == [0]
    sent, received = ROUNDS * (HEADER_BYTES + UPLOAD), ROUNDS * DOWNLOAD
    net = {
        name: read_net(rundir.host_capture_dir(out, host.name), pid_of[name])
        for name, host in (("remote_client", node1), ("local_client", node1), ("remote_server", node2))
    }
    print(f"FIGURE namespaced net: {net}")
    got = net["remote_client"]
    assert got is not None and (got.bytes_sent_external, got.bytes_received_external) == (sent, received), got
    got = net["local_client"]
    assert got is not None and (got.bytes_sent, got.bytes_received) == (sent, received), got
    assert (got.bytes_sent_external, got.bytes_received_external) == (0, 0), got
    got = net["remote_server"]
    assert got is not None and (got.bytes_received_external, got.bytes_sent_external) == (sent, received), got


def _ns_pid_of_cmdline(host: NamespacedHost, marker: str) -> int:
    """The host's one process whose command line holds ``marker``, as its namespace numbers it."""
    found = [pid for pid in host.pids() if marker in " ".join(psutil.Process(pid).cmdline())]
    assert len(found) == 1, f"{host.name} {marker}: {found}"
    return ns_pid(found[0])
