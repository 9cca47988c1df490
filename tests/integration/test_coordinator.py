"""`coordinator profile` against real sshd servers on loopback ports, running the real host profiler.

Each sshd is its own "host" (own host key, own TMPDIR for sessions); the profiler samples a small busy
process given by --pid, and a known_spes file that matches nothing keeps other processes on this
shared machine out of the scope.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from coordinator import rundir
from coordinator.cli import main as coordinator_main
from coordinator.errors import HostKeyError, PartialRunError
from coordinator.remote.cluster import parse_cluster
from coordinator.remote.ssh import SshHost, SshOptions
from profiler.errors import OutputExistsError
from tests.fixtures.coordinator_child import CoordinatorChild, profiler_processes
from tests.fixtures.leaks import bpf_programs_held_by
from tests.fixtures.sshcluster import make_cluster, write_inputs
from tests.fixtures.sshd import SshdFactory, SshdHost, free_port, generate_key, public_key_line

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    return write_inputs(tmp_path, "Python: re:.+\n")


def _profile_args(cluster: Path, known_hosts: Path, out: Path, inputs: tuple[Path, Path], pid: int) -> list[str]:
    return [
        "profile",
        "--cluster", str(cluster),
        "--known-hosts", str(known_hosts),
        "--out", str(out),
        "--profile", str(inputs[0]),
        "--known-spes", str(inputs[1]),
        "--pid", str(pid),
        "--quiet",
    ]  # fmt: skip


def _assert_nothing_left(hosts: list[SshdHost], marker: str) -> None:
    for host in hosts:
        assert host.leftovers() == [], f"{host.name}: work directory left behind: {host.leftovers()}"
    assert profiler_processes(marker) == [], "a remote profiler is still running"


def test_two_hosts_profiled_end_to_end(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    # GIVEN two sshd "hosts" with known keys
    two = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    hosts, cluster, known_hosts = two.hosts, two.cluster_file, two.known_hosts
    out = tmp_path / "runs" / "two"
    # WHEN profiled for 3 s by the CLI (a child process: the analysis's Spark JVM ends with it), with
    # a latest start far enough to cover two BPF compilations on this shared 2-core machine
    args = _profile_args(cluster, known_hosts, out, inputs, busy_process.pid)
    child = CoordinatorChild([*args, "--duration", "3", "--label", "load=low", "--start-delay", "60"])
    coordinators.append(child)
    code = child.finish(timeout=400)
    # THEN both hosts are ok, in sync, with their captures, and the summary holds both
    info = rundir.read_run(out)
    assert code == 0, "\n".join(child.lines)
    assert info.complete and [h.host for h in info.hosts] == ["node1", "node2"]
    assert info.labels == {"load": "low"} and info.duration == 3.0
    for host in info.hosts:
        assert host.state == "ok" and host.address.startswith("root@127.0.0.1:")
        assert host.clock_offset is not None and abs(host.clock_offset) < 0.5
        capture = rundir.host_capture_dir(out, host.host)
        assert (capture / "meta.json").is_file() and (capture / f"{host.host}_result.csv").is_file()
        assert host.end_time - host.start_time == pytest.approx(3.0, abs=1.0)
    starts = [h.start_time - h.clock_offset for h in info.hosts]
    assert max(starts) - min(starts) < 1.0, "hosts must start sampling within one second of each other"
    # as soon as both profilers were attached (the start file), not at the latest start
    log = (out / "coordinator.log").read_text()
    assert "every profiler attached; sampling starts at" in log, log
    assert (out / "application_profile.txt").read_text() == inputs[0].read_text()
    assert (out / "cluster.txt").read_text() == cluster.read_text()
    with open(out / "summary.csv", newline="") as handle:
        summary_hosts = {row["host"] for row in csv.DictReader(handle)}
    assert {"node1", "node2"} <= summary_hosts
    assert any(line.startswith("next: ") for line in child.lines)
    _assert_nothing_left(hosts, str(sshd_factory.base))
    # AND a second run into the same directory is refused without --force, before connecting
    assert coordinator_main([*args, "--duration", "1", "--no-analyze"]) == OutputExistsError.exit_code


def test_one_host_down_gives_partial_run(
    sshd_factory: SshdFactory, busy_process: subprocess.Popen[bytes], inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    up = sshd_factory.start()
    dead_port = free_port()  # nobody listens there
    cluster = sshd_factory.cluster_file(
        [
            up.cluster_line(sshd_factory.user_key),
            f"root@127.0.0.1:{dead_port} worker identity={sshd_factory.user_key} name=down",
        ]
    )
    known_hosts = sshd_factory.known_hosts([up])
    out = tmp_path / "partial"
    args = _profile_args(cluster, known_hosts, out, inputs, busy_process.pid)
    code = coordinator_main([*args, "--duration", "2", "--no-analyze", "--start-delay", "1"])
    assert code == PartialRunError.exit_code
    info = rundir.read_run(out)
    assert not info.complete
    node, down = info.hosts
    assert node.state == "ok"
    assert down.state == "failed" and "cannot connect" in down.reason and str(dead_port) in down.reason
    assert not rundir.host_capture_dir(out, "down").exists()
    _assert_nothing_left([up], str(sshd_factory.base))


def test_unknown_host_key_refused_with_fingerprint_then_accepted(sshd_factory: SshdFactory, tmp_path: Path) -> None:
    host = sshd_factory.start()
    spec = parse_cluster([host.cluster_line(sshd_factory.user_key)], "cluster.txt")[0]
    known_hosts = tmp_path / "known_hosts_empty"
    expected = subprocess.run(
        ["ssh-keygen", "-lf", f"{host.host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    # WHEN the host is unknown THEN it is refused, the message shows its fingerprint and the option
    with pytest.raises(HostKeyError) as refused:
        SshHost(spec, SshOptions(known_hosts=known_hosts)).connect()
    assert expected in str(refused.value) and "--accept-new-hosts" in str(refused.value)
    assert not known_hosts.exists() or host.known_hosts_line().split()[2] not in known_hosts.read_text()
    # WHEN accepted THEN it is recorded, and later connections need no option
    accepting = SshHost(spec, SshOptions(known_hosts=known_hosts, accept_new_hosts=True))
    accepting.connect()
    accepting.close()
    assert host.known_hosts_line().split()[2] in known_hosts.read_text()
    again = SshHost(spec, SshOptions(known_hosts=known_hosts))
    again.connect()
    again.close()


def test_changed_host_key_always_refused(
    sshd_factory: SshdFactory, busy_process: subprocess.Popen[bytes], inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    host = sshd_factory.start()
    impostor_key = generate_key(tmp_path / "other_host_key", "someone else")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(host.known_hosts_line(impostor_key) + "\n")
    cluster = sshd_factory.cluster_file([host.cluster_line(sshd_factory.user_key)])
    out = tmp_path / "changed"
    args = _profile_args(cluster, known_hosts, out, inputs, busy_process.pid)
    # even with --accept-new-hosts: a changed key is never accepted
    code = coordinator_main([*args, "--duration", "1", "--no-analyze", "--accept-new-hosts"])
    assert code == PartialRunError.exit_code
    (outcome,) = rundir.read_run(out).hosts
    assert outcome.state == "failed" and "HOST KEY CHANGED" in outcome.reason
    assert known_hosts.read_text() == host.known_hosts_line(impostor_key) + "\n"
    assert public_key_line(host.host_key).split()[1] not in known_hosts.read_text()
    assert host.leftovers() == []


def test_ctrl_c_stops_every_host_and_keeps_partial_results(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    two = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    hosts, cluster, known_hosts = two.hosts, two.cluster_file, two.known_hosts
    out = tmp_path / "interrupted"
    args = _profile_args(cluster, known_hosts, out, inputs, busy_process.pid)
    args.remove("--quiet")
    child = CoordinatorChild([*args, "--duration", "120", "--no-analyze", "--start-delay", "2"])
    coordinators.append(child)
    # GIVEN both hosts sampling, each profiler holding its BPF programs
    child.wait_for(": sampling", 2, timeout=90)
    time.sleep(1.5)
    # this test's two profilers: one per host's session TMPDIR (the module's sshd base may still hold an
    # earlier test's profiler that is finishing its own stop)
    remote_profilers = {p.pid for host in hosts for p in profiler_processes(str(host.session_tmp))}
    assert len(remote_profilers) == 2 and bpf_programs_held_by(remote_profilers)
    # WHEN the coordinator gets SIGINT (Ctrl-C)
    child.process.send_signal(signal.SIGINT)
    began = time.monotonic()
    code = child.finish(timeout=90)
    # THEN it stops well before the 120 s window, every host has a partial capture, nothing is left
    assert time.monotonic() - began < 60
    assert code == PartialRunError.exit_code, "\n".join(child.lines)
    info = rundir.read_run(out)
    for host in info.hosts:
        assert host.state == "partial" and "Ctrl-C" in host.reason, host
        assert host.end_time - host.start_time < 60
        assert (rundir.host_capture_dir(out, host.host) / f"{host.host}_result.csv").is_file()
    for host in hosts:
        _assert_nothing_left([host], str(host.session_tmp))
    assert bpf_programs_held_by(remote_profilers) == []
    deadline = time.monotonic() + 5  # an exited profiler may linger a moment as a zombie until init reaps it
    while any(psutil.pid_exists(pid) for pid in remote_profilers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in remote_profilers)


def test_ssh_connection_killed_mid_run_results_still_collected(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    two = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    hosts, cluster, known_hosts = two.hosts, two.cluster_file, two.known_hosts
    out = tmp_path / "dropped"
    args = _profile_args(cluster, known_hosts, out, inputs, busy_process.pid)
    args.remove("--quiet")
    child = CoordinatorChild([*args, "--duration", "6", "--no-analyze", "--start-delay", "2"])
    coordinators.append(child)
    child.wait_for(": sampling", 2, timeout=90)
    # WHEN every SSH connection to node1 is cut mid-window (its sshd session processes killed)
    assert hosts[0].kill_sessions() >= 1
    code = child.finish(timeout=120)
    # THEN the coordinator reconnected and collected node1's full capture anyway
    assert code == 0, "\n".join(child.lines)
    # the progress lines may skip a short-lived phase; the run's log records every event
    log = (out / "coordinator.log").read_text()
    assert "node1: connection lost" in log and "node1: reconnected" in log, log
    info = rundir.read_run(out)
    assert [h.state for h in info.hosts] == ["ok", "ok"]
    for host in info.hosts:
        assert (rundir.host_capture_dir(out, host.host) / f"{host.host}_result.csv").is_file()
    _assert_nothing_left(hosts, str(sshd_factory.base))


def test_profile_help_shows_an_example_session() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "profile", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "examples:" in done.stdout and "coordinator profile --duration" in done.stdout
    assert "--accept-new-hosts" in done.stdout and "coordinator analyze" in done.stdout


def test_bad_cluster_line_fails_before_anything_starts(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    cluster = tmp_path / "cluster.txt"
    cluster.write_text("localhost\nworker1:99999 worker\n")
    out = tmp_path / "never"
    code = coordinator_main(["profile", "--cluster", str(cluster), "--duration", "1", "--out", str(out), "--quiet"])
    assert code == 2 and not out.exists()
    assert os.path.exists(cluster)
