"""Faults injected into real `coordinator profile` runs: real sshd hosts (loopback ports, one in its own
network namespace), the real host profiler with eBPF, real JVMs. Each case checks what survives the
fault (samples kept), what run.json says per host, the exit code, and that nothing is left: no work
directory, no remote profiler process, no BPF program held, kernel.perf_event_max_stack and
kernel.bpf_stats_enabled as before.

Each case prints one `FIGURE` line (run pytest with -s to see them); docs/reliability.md quotes them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from coordinator import rundir
from coordinator.cli import main as coordinator_main
from coordinator.errors import PartialRunError
from coordinator.remote import deploy
from coordinator.remote.cluster import HostSpec, load_cluster
from coordinator.remote.hosts import HostTransport, run_request
from coordinator.remote.session import ProfileOutcome, RunOptions, TransportFactory, profile_cluster
from coordinator.remote.ssh import SshHost, SshOptions
from profiler.capture.journal import read_journal
from profiler.capture.read import read_meta
from tests.fixtures.captures import folded_text
from tests.fixtures.coordinator_child import CoordinatorChild
from tests.fixtures.faults import (
    DelayProxy,
    HostNetns,
    SshUser,
    clock_ahead_env,
    fill_filesystem,
    hide_paths_prefix,
    kernel_headers_dir,
)
from tests.fixtures.jvm import CpuSplitJvm
from tests.fixtures.leaks import bpf_programs_held_by
from tests.fixtures.sshcluster import Cluster, make_cluster, write_inputs
from tests.fixtures.sshd import SSHD, SshdFactory, SshdHost

REPO = Path(__file__).resolve().parents[2]


def figure(case: str, **values: object) -> None:
    print(f"FIGURE {case}: " + ", ".join(f"{key}={value}" for key, value in values.items()))


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    os.chmod(tmp_path, 0o755)
    return write_inputs(tmp_path, "Burn: burnAlpha, burnBeta, burnGamma\nPython: re:.+\n")


def cli_args(cluster: Cluster, out: Path, inputs: tuple[Path, Path], pid: int, duration: float) -> list[str]:
    return [
        "profile", "--cluster", str(cluster.cluster_file), "--known-hosts", str(cluster.known_hosts),
        "--out", str(out), "--profile", str(inputs[0]), "--known-spes", str(inputs[1]), "--pid", str(pid),
        "--duration", str(duration), "--no-analyze", "--start-delay", "3",
    ]  # fmt: skip


def in_process(
    cluster: Cluster, out: Path, inputs: tuple[Path, Path], pid: int, duration: float, **options: object
) -> ProfileOutcome:
    """profile_cluster itself, for options the CLI does not have (shorter grace and reconnect windows)."""
    request = run_request(duration, inputs[0], inputs[1], pids=(pid,))
    defaults: dict[str, object] = {"known_hosts": cluster.known_hosts, "start_delay": 3.0, "progress": False}
    return profile_cluster(
        load_cluster(cluster.cluster_file), request, out, RunOptions(**{**defaults, **options})  # type: ignore[arg-type]
    )


def samples(run_dir: Path, host: str) -> dict[int, int]:
    """Samples per sampled PID in a fetched host capture."""
    found = {}
    for path in (rundir.host_capture_dir(run_dir, host) / "pids").glob("*/sampler.json"):
        found[int(path.parent.name)] = int(json.loads(path.read_text())["samples"])
    return found


def wait_run_json(out: Path, predicate: Callable[[rundir.RunInfo], bool], timeout: float) -> float:
    """Seconds until run.json satisfies ``predicate``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if predicate(rundir.read_run(out)):
                return time.monotonic() - began
        except Exception:  # noqa: BLE001 - between writes
            pass
        time.sleep(0.05)
    raise AssertionError(f"run.json not as expected within {timeout} s")


def test_the_agent_deployed_is_this_tree() -> None:
    assert deploy.package_dir() == REPO / "profiler"


# ------------------------------------------------------------------ kill -9 of a host profiler


def journal_checkpoints(host: SshdHost) -> int:
    """Whole checkpoints in the journal of the host's profiler (its work directory is local here)."""
    for path in host.session_tmp.glob("taskprof.*/out/checkpoint/journal.tpj"):
        try:
            return len(read_journal(path.read_bytes()).checkpoints)
        except (OSError, ValueError):
            return 0
    return 0


def test_host_profiler_killed_mid_window(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    out = tmp_path / "killed-profiler"
    child = CoordinatorChild([*cli_args(cluster, out, inputs, busy_process.pid, 9), "--checkpoint", "2"])
    coordinators.append(child)
    # GIVEN both hosts sampling, checkpoints every 2 s; WHEN node2's profiler is killed with SIGKILL once
    # its journal holds two checkpoints (about 4 s into the 9 s window: node1 samples 5 s more)
    cluster.wait_sampling(["node1", "node2"])
    node2_host = cluster.host("node2")
    deadline = time.monotonic() + 60
    while journal_checkpoints(node2_host) < 2:
        assert time.monotonic() < deadline, "no two checkpoints within 60 s"
        time.sleep(0.1)
    (victim,) = cluster.profiler_pids(node2_host)
    last = max((s for s in cluster.statuses(node2_host)), key=lambda s: s.get("time") or 0)
    before, elapsed_before = int(last.get("samples") or 0), float(last.get("elapsed") or 0)
    killed_at = time.time()  # the hosts share this machine's clock
    os.kill(victim, signal.SIGKILL)
    detect = wait_run_json(out, lambda i: i.hosts[1].reason.startswith("profiler"), timeout=60)
    code = child.finish(timeout=120)
    # THEN node1 is whole; node2 is partial, saying it was killed and what was recovered: the samples
    # up to its last checkpoint (the journal, symbolized on the host by `profiler recover`)
    assert code == PartialRunError.exit_code, "\n".join(child.lines)
    node1, node2 = rundir.read_run(out).hosts
    assert node1.state == "ok" and sum(samples(out, "node1").values()) > 0
    assert node2.state == "partial", node2
    assert "vanished without an error" in node2.reason and "SIGKILL" in node2.reason
    kept = sum(samples(out, "node2").values())
    assert f"recovered {kept} samples up to" in node2.reason, node2.reason
    meta = read_meta(rundir.host_capture_dir(out, "node2"))
    window = meta.end_time - meta.start_time
    assert meta.stopped_by == "recovered" and window >= 2.0 and meta.end_time <= killed_at, (window, elapsed_before)
    # the last status (at most a second old at the kill) scaled to the recovered window, ± 2 s of samples
    assert 0 < kept <= before + 2 * 99 * 2
    assert kept >= before * min(1.0, window / max(elapsed_before, 0.1)) - 2 * 99 * 2
    assert any(line.startswith("node2: partial") for line in child.lines), "\n".join(child.lines)
    assert not (rundir.host_capture_dir(out, "node2") / "checkpoint").exists()
    assert node1.workdir == node2.workdir == ""
    cluster.assert_nothing_left()
    figure(
        "profiler-kill9",
        samples_at_kill=before,
        window_at_kill_s=round(elapsed_before, 1),
        samples_kept=kept,
        recovered_window_s=round(window, 1),
        other_host_samples=sum(samples(out, "node1").values()),
        detect_s=round(detect, 1),
        exit=code,
    )


# ------------------------------------------------------------------ kill -9 of the coordinator


def test_coordinator_killed_mid_window_profilers_finish_and_fetch_recovers(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    out = tmp_path / "killed-coordinator"
    duration = 8.0
    child = CoordinatorChild(cli_args(cluster, out, inputs, busy_process.pid, duration))
    coordinators.append(child)
    # GIVEN both hosts sampling; WHEN the coordinator is killed with SIGKILL 2 s into the window
    cluster.wait_sampling(["node1", "node2"])
    time.sleep(2)
    child.process.kill()
    killed = time.monotonic()
    child.finish(timeout=30)
    # THEN run.json names each host's work directory and the recovery command
    left = rundir.read_run(out)
    assert not left.complete and left.start_time is not None
    for host in left.hosts:
        assert host.state == "failed" and host.workdir and "coordinator fetch" in host.reason, host
    # AND the profilers finish their window on their own, write their captures and exit
    pids = set().union(*cluster.seen_profilers.values())
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() - killed < duration + 30, "profilers outlived their window by 30 s"
        time.sleep(0.1)
    ended = time.monotonic() - killed
    assert bpf_programs_held_by(pids) == []
    # WHEN `coordinator fetch RUN` runs
    began = time.monotonic()
    code = coordinator_main(["fetch", str(out), "--known-hosts", str(cluster.known_hosts), "--quiet"])
    fetch_s = time.monotonic() - began
    # THEN every capture is home, whole, run.json is complete and nothing is left on the hosts
    assert code == 0
    info = rundir.read_run(out)
    assert info.complete and all(h.state == "ok" and h.workdir == "" for h in info.hosts), info.hosts
    kept = {h.host: sum(samples(out, h.host).values()) for h in info.hosts}
    for host in info.hosts:
        meta = read_meta(rundir.host_capture_dir(out, host.host))
        assert meta.stopped_by == "duration" and kept[host.host] > 0
    cluster.assert_nothing_left()
    # AND a second fetch finds nothing to do
    assert coordinator_main(["fetch", str(out), "--known-hosts", str(cluster.known_hosts), "--quiet"]) == 0
    figure(
        "coordinator-kill9",
        profilers_ended_after_kill_s=round(ended, 1),
        window_left_at_kill_s=round(duration - 2, 1),
        samples_kept=kept,
        fetch_s=round(fetch_s, 1),
        exit_before_fetch="SIGKILL",
        exit_fetch=code,
    )


def test_coordinator_and_a_profiler_killed_fetch_recovers_the_dead_one(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    out = tmp_path / "killed-both"
    child = CoordinatorChild([*cli_args(cluster, out, inputs, busy_process.pid, 8), "--checkpoint", "2"])
    coordinators.append(child)
    # GIVEN both hosts sampling; WHEN the coordinator is killed, then node1's profiler once its journal
    # holds two checkpoints
    cluster.wait_sampling(["node1", "node2"])
    child.process.kill()
    child.finish(timeout=30)
    deadline = time.monotonic() + 60
    while journal_checkpoints(cluster.host("node1")) < 2:
        assert time.monotonic() < deadline, "no two checkpoints within 60 s"
        time.sleep(0.1)
    (victim,) = cluster.profiler_pids(cluster.host("node1"))
    os.kill(victim, signal.SIGKILL)
    # AND `coordinator fetch RUN` runs later
    code = coordinator_main(["fetch", str(out), "--known-hosts", str(cluster.known_hosts), "--quiet"])
    # THEN node2's whole window is home, node1's up to its last checkpoint, the run partial, nothing left
    assert code == PartialRunError.exit_code
    node1, node2 = rundir.read_run(out).hosts
    assert node2.state == "ok" and node2.workdir == ""
    kept = sum(samples(out, "node1").values())
    assert node1.state == "partial" and f"recovered {kept} samples up to" in node1.reason and kept > 0, node1
    assert node1.workdir == "" and read_meta(rundir.host_capture_dir(out, "node1")).stopped_by == "recovered"
    cluster.assert_nothing_left()
    other = sum(samples(out, "node2").values())
    figure("coordinator-and-profiler-kill9", samples_kept=kept, other_host_samples=other, exit_fetch=code)


# ------------------------------------------------------------------ an executor replaced mid-run


def test_executor_killed_and_replaced_mid_run(
    sshd_factory: SshdFactory,
    start_cpu_split_jvm: Callable[..., CpuSplitJvm],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start()])
    inputs[1].write_text("testengine workload executor com.example.CpuSplit\n")  # CpuSplit JVMs are executors
    first = start_cpu_split_jvm(threads=1, warmup_ms=500)
    out = tmp_path / "replaced-executor"
    # an 8 s window: the new JVM (up in about 1 s) is sampled for its last 4 s
    args = cli_args(cluster, out, inputs, first.pid, 8)
    args[args.index("--pid") : args.index("--pid") + 2] = []  # found by known_spes, not given
    child = CoordinatorChild(args)
    coordinators.append(child)
    # GIVEN the host sampling the first executor; WHEN it is killed 3 s in and a new one starts
    cluster.wait_sampling(["node1"])
    first_cpu = psutil.Process(first.pid).cpu_times()
    time.sleep(3)
    cpu = psutil.Process(first.pid).cpu_times()
    first.kill()
    killed_at = time.time()
    # what 99 Hz sampling should have seen of it since the window began (the busy thread's CPU time)
    expected_first = (cpu.user + cpu.system - first_cpu.user - first_cpu.system) * 99
    second = start_cpu_split_jvm(threads=1, warmup_ms=500)
    code = child.finish(timeout=120)
    # THEN both PIDs are in the capture: the dead one's samples kept, the new one sampled from its start
    assert code == 0, "\n".join(child.lines)
    capture_dir = rundir.host_capture_dir(out, "node1")
    scope = {p["pid"]: p for p in json.loads((capture_dir / "scope.json").read_text())}
    assert scope[first.pid]["exited"] and scope[first.pid]["role"] == "workload"
    assert not scope[second.pid]["exited"] and scope[second.pid]["source"] in ("exec", "scan")
    counts = samples(out, "node1")
    assert counts[first.pid] > 0.7 * expected_first, (counts, expected_first)
    assert counts[second.pid] > 0
    burns = sum(
        int(line.rsplit(" ", 1)[1])
        for line in folded_text(capture_dir, first.pid).splitlines()
        if "burn" in line
    )
    cluster.assert_nothing_left()
    figure(
        "executor-replaced",
        dead_pid_samples=counts[first.pid],
        dead_pid_expected=round(expected_first),
        dead_pid_named_burn_samples=burns,
        new_pid_samples=counts[second.pid],
        new_pid_seen_after_start_s=round(scope[second.pid]["first_seen"] - killed_at, 2),
        exit=code,
    )


# ------------------------------------------------------------------ SSH dropped beyond the reconnect window

# The silent link is noticed by TCP_USER_TIMEOUT (SshOptions.dead_peer_timeout, 20 s in production), then
# retried for the reconnect window: the same path with a 5 s timeout and keepalives every second (the
# dead peer's bytes unacknowledged from the first keepalive after the drop) takes ~11 s less.
QUICK_DEAD_PEER = SshOptions(connect_timeout=3.0, keepalive=1, dead_peer_timeout=5.0)


def quick_dead_peer_transport(cluster: Cluster) -> TransportFactory:
    options = replace(QUICK_DEAD_PEER, known_hosts=cluster.known_hosts)

    def factory(spec: HostSpec) -> HostTransport:
        return SshHost(spec, options)

    return factory



def test_ssh_dropped_longer_than_the_reconnect_window_then_fetched(
    sshd_factory: SshdFactory,
    host_netns: HostNetns,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    near = sshd_factory.start()
    far = sshd_factory.start("far", prefix=host_netns.prefix, address=host_netns.address)
    cluster = make_cluster(sshd_factory, [near, far])
    out = tmp_path / "dropped"
    result: list[ProfileOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            in_process(
                cluster, out, inputs, busy_process.pid, 8, finish_grace=5.0, reconnect_window=3.0,
                transport_factory=quick_dead_peer_transport(cluster),
            )
        )
    )
    runner.start()
    try:
        # GIVEN both hosts sampling; WHEN far's link goes down 2 s into the window and stays down
        cluster.wait_sampling(["node1", "far"])
        time.sleep(2)
        host_netns.link_down()
        before = max(s.get("samples") or 0 for s in cluster.statuses(far))
        detect = wait_run_json(out, lambda i: i.hosts[1].reason.startswith("connection lost"), timeout=180)
        runner.join(180)
        assert not runner.is_alive(), "the coordinator hangs on a silent host"
    finally:
        host_netns.link_up()
    (outcome,) = result
    # THEN the run is partial, far failed with the reason and the recovery command
    assert outcome.exit_code == PartialRunError.exit_code
    node1, far_outcome = rundir.read_run(out).hosts
    assert node1.state == "ok"
    assert far_outcome.state == "failed" and far_outcome.workdir and "coordinator fetch" in far_outcome.reason
    # WHEN the link is back (far's sshd answers through it) and `coordinator fetch` runs
    wait_ssh_banner(far, timeout=20)
    code = coordinator_main(["fetch", str(out), "--known-hosts", str(cluster.known_hosts), "--quiet"])
    # THEN far's whole window is home (its profiler never noticed), nothing is left
    assert code == 0
    far_after = rundir.read_run(out).hosts[1]
    assert far_after.state == "ok" and far_after.workdir == ""
    meta = read_meta(rundir.host_capture_dir(out, "far"))
    assert meta.stopped_by == "duration"
    cluster.assert_nothing_left()
    figure(
        "ssh-dropped",
        samples_at_drop=before,
        detect_s=round(detect, 1),
        samples_kept_after_fetch=sum(samples(out, "far").values()),
        exit=outcome.exit_code,
        exit_fetch=code,
    )


# ------------------------------------------------------------------ a host's sshd killed mid-window


def wait_ssh_banner(host: SshdHost, timeout: float) -> None:
    """Until the host's sshd answers a connection with its banner (its link up, its listener there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.address, host.port), timeout=2) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{host.name}: sshd not answering on {host.address}:{host.port}")


def restart_sshd(host: SshdHost) -> None:
    """The host's sshd again, on its port with its key and configuration (as its service manager would)."""
    with open(host.log, "ab") as log:
        config = str(host.directory / "sshd_config")
        host.process = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdout=log, stderr=log)
    wait_ssh_banner(host, timeout=20)


def test_host_sshd_killed_mid_window_then_fetched(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    node2 = cluster.host("node2")
    out = tmp_path / "sshd-killed"
    result: list[ProfileOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            in_process(cluster, out, inputs, busy_process.pid, 8, finish_grace=5.0, reconnect_window=3.0)
        )
    )
    runner.start()
    # GIVEN both hosts sampling; WHEN node2's sshd (its listener and every session) is killed 2 s into the
    # window: the host's profiler, started with setsid, keeps sampling, but nobody answers on port 22
    cluster.wait_sampling(["node1", "node2"])
    time.sleep(2)
    assert node2.process is not None
    victims = [node2.process.pid, *(p.pid for p in node2.session_processes())]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    node2.process.wait(10)
    killed_at = time.monotonic()
    runner.join(180)
    assert not runner.is_alive(), "the coordinator hangs on a host without sshd"
    given_up = time.monotonic() - killed_at
    (outcome,) = result
    # THEN the run ends partial: node1 whole, node2 failed with its work directory and the fetch hint
    assert outcome.exit_code == PartialRunError.exit_code
    first, second = rundir.read_run(out).hosts
    assert first.state == "ok" and sum(samples(out, "node1").values()) > 0
    assert second.state == "failed" and second.workdir and "coordinator fetch" in second.reason, second
    # WHEN its sshd is back and `coordinator fetch` runs
    restart_sshd(node2)
    code = coordinator_main(["fetch", str(out), "--known-hosts", str(cluster.known_hosts), "--quiet"])
    # THEN node2's whole window is home (its profiler sampled to the end), nothing is left
    assert code == 0
    after = rundir.read_run(out).hosts[1]
    assert after.state == "ok" and after.workdir == ""
    meta = read_meta(rundir.host_capture_dir(out, "node2"))
    assert meta.stopped_by == "duration" and meta.end_time - meta.start_time >= 7.5
    kept = sum(samples(out, "node2").values())
    assert kept > 0
    cluster.assert_nothing_left()
    figure(
        "sshd-killed",
        reason=repr(second.reason[:60]),
        given_up_after_kill_s=round(given_up, 1),
        samples_after_fetch=kept,
        other_host_samples=sum(samples(out, "node1").values()),
        exit=outcome.exit_code,
        exit_fetch=code,
    )


# ------------------------------------------------------------------ a host 100 times slower to answer

SLOW_DELAY_S = 0.05  # each way, per chunk: a 100 ms round trip where loopback answers in about 1 ms


def test_host_100_times_slower_to_answer(
    sshd_factory: SshdFactory,
    delay_proxies: Callable[[int, float], DelayProxy],
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    # GIVEN node2 reached through a relay that holds every chunk 50 ms each way
    node1, node2 = sshd_factory.start(), sshd_factory.start()
    proxy = delay_proxies(node2.port, SLOW_DELAY_S)
    cluster = make_cluster(sshd_factory, [node1, replace(node2, port=proxy.port)])
    out = tmp_path / "slow"
    args = cli_args(cluster, out, inputs, busy_process.pid, 6)
    args[args.index("--start-delay") + 1] = "60"  # the latest start: they start together once both attached
    began = time.monotonic()
    child = CoordinatorChild(args)
    coordinators.append(child)
    code = child.finish(timeout=240)
    elapsed = time.monotonic() - began
    # THEN the run is whole: both hosts sample the same 6 s, node2's clock offset is measured within its
    # round trip, and every chunk to and from node2 went through the relay
    assert code == 0, "\n".join(child.lines)
    info = rundir.read_run(out)
    assert [h.state for h in info.hosts] == ["ok", "ok"]
    starts = [h.start_time - h.clock_offset for h in info.hosts]
    assert max(starts) - min(starts) < 1.0
    assert abs(info.hosts[1].clock_offset) < 2 * SLOW_DELAY_S
    assert all(sum(samples(out, h.host).values()) > 0 for h in info.hosts)
    assert proxy.chunks > 20
    cluster.assert_nothing_left()
    figure(
        "slow-host",
        delay_each_way_s=SLOW_DELAY_S,
        relayed_chunks=proxy.chunks,
        measured_offset_s=round(info.hosts[1].clock_offset, 3),
        start_skew_s=round(max(starts) - min(starts), 3),
        elapsed_s=round(elapsed, 1),
        exit=code,
    )


# ------------------------------------------------------------------ a host clock 30 s ahead


def test_host_clock_30_s_ahead(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    # GIVEN node2 whose SSH sessions see a wall clock 30 s ahead (libfaketime; monotonic clocks true)
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start(env=clock_ahead_env(30))])
    out = tmp_path / "skewed"
    args = cli_args(cluster, out, inputs, busy_process.pid, 6)
    # the latest start beyond both BPF compilations (slow under load): they start together once both are
    # attached, through the start file in each host's own clock
    args[args.index("--start-delay") + 1] = "60"
    child = CoordinatorChild(args)
    coordinators.append(child)
    code = child.finish(timeout=180)
    # THEN the offset is measured, both hosts sample the same 6 s, and the run is whole
    assert code == 0, "\n".join(child.lines)
    info = rundir.read_run(out)
    node1, node2 = info.hosts
    assert abs(node2.clock_offset - 30) < 0.5 and abs(node1.clock_offset) < 0.5
    starts = [h.start_time - h.clock_offset for h in info.hosts]
    assert max(starts) - min(starts) < 1.0
    assert "every profiler attached; sampling starts at" in (out / "coordinator.log").read_text()
    assert all(sum(samples(out, h.host).values()) > 0 for h in info.hosts)
    cluster.assert_nothing_left()
    figure(
        "clock-30s",
        measured_offset_s=round(node2.clock_offset, 3),
        start_skew_s=round(max(starts) - min(starts), 3),
        exit=code,
    )


# ------------------------------------------------------------------ the host disk full


def test_remote_disk_full_while_the_capture_is_written(
    sshd_factory: SshdFactory,
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    small_tmpfs: Callable[[Path, str], Path],
    coordinators: list[CoordinatorChild],
) -> None:
    cluster = make_cluster(sshd_factory, [sshd_factory.start(), sshd_factory.start()])
    full = small_tmpfs(cluster.host("node2").session_tmp, "16m")
    out = tmp_path / "disk-full"
    child = CoordinatorChild(cli_args(cluster, out, inputs, busy_process.pid, 6))
    coordinators.append(child)
    # GIVEN both hosts sampling; WHEN node2's TMPDIR (a 16 MB tmpfs) is filled to the last byte
    cluster.wait_sampling(["node1", "node2"])
    filler = fill_filesystem(full)
    detect = wait_run_json(out, lambda i: i.hosts[1].reason.startswith("profiler"), timeout=120)
    before = max(s.get("samples") or 0 for s in cluster.statuses(cluster.host("node2")))
    code = child.finish(timeout=120)
    filler.unlink()
    # THEN node2 failed with the reason, node1 is whole, the run is partial, nothing is left
    assert code == PartialRunError.exit_code, "\n".join(child.lines)
    node1, node2 = rundir.read_run(out).hosts
    assert node1.state == "ok" and sum(samples(out, "node1").values()) > 0
    assert node2.state == "failed" and "No space left on device" in node2.reason, node2.reason
    cluster.assert_nothing_left()
    figure(
        "disk-full",
        reason=node2.reason,
        samples_at_end=before,
        samples_kept=sum(samples(out, "node2").values()),
        detect_s_after_fill=round(detect, 1),
        exit=code,
    )


# ------------------------------------------------------------------ hosts that cannot sample; least privilege


def test_hosts_that_cannot_sample_are_refused_and_a_sudo_user_profiles(
    public_sshd_factory: SshdFactory,
    linux_users: Callable[[str, bool], SshUser],
    busy_process: subprocess.Popen[bytes],
    inputs: tuple[Path, Path],
    tmp_path: Path,
    coordinators: list[CoordinatorChild],
) -> None:
    factory = public_sshd_factory
    empty = factory.base / "empty"
    bcc_dir = Path("/usr/lib/python3/dist-packages/bcc")
    # GIVEN a host logged in as a user with sudo rights for the coordinator's commands only, one as a
    # user without sudo, one without bcc and one without kernel headers (hidden in their mount namespace)
    tag = os.getpid() % 10000
    with_sudo, without_sudo = linux_users(f"tpfsudo{tag}", True), linux_users(f"tpfnosudo{tag}", False)
    hosts = [
        factory.start("sudoer"),
        factory.start("nosudo"),
        factory.start("nobcc", prefix=hide_paths_prefix([bcc_dir], empty)),
        factory.start("noheaders", prefix=hide_paths_prefix([kernel_headers_dir()], empty)),
    ]
    cluster = make_cluster(factory, hosts, {"sudoer": with_sudo.name, "nosudo": without_sudo.name})
    out = tmp_path / "refused"
    began = time.monotonic()
    child = CoordinatorChild(cli_args(cluster, out, inputs, busy_process.pid, 4))
    coordinators.append(child)
    code = child.finish(timeout=180)
    elapsed = time.monotonic() - began
    # THEN the three are refused before sampling with the reason, the sudo user's host is profiled
    assert code == PartialRunError.exit_code, "\n".join(child.lines)
    states = {h.host: h for h in rundir.read_run(out).hosts}
    assert states["sudoer"].state == "ok", states["sudoer"]
    assert states["sudoer"].address.startswith(f"{with_sudo.name}@")
    assert sum(samples(out, "sudoer").values()) > 0
    assert states["nosudo"].state == "failed" and "sudo" in states["nosudo"].reason
    assert states["nobcc"].state == "failed" and "bcc" in states["nobcc"].reason
    assert states["noheaders"].state == "failed" and "kernel-headers" in states["noheaders"].reason
    log = (out / "coordinator.log").read_text()
    for name in ("nosudo", "nobcc", "noheaders"):
        assert f"{name}: starting" not in log, f"{name} was started"
        assert not rundir.host_capture_dir(out, name).exists()
    cluster.assert_nothing_left(ignore=("empty",))
    figure(
        "refused-at-start",
        reasons={n: states[n].reason[:90] for n in ("nosudo", "nobcc", "noheaders")},
        sudo_user_samples=sum(samples(out, "sudoer").values()),
        run_s=round(elapsed, 1),
        exit=code,
    )
