"""Java JIT symbols on a real JVM: the Compiler.perfmap path (the JDK's jcmd as a reference, our attach
client) and our JVMTI agent."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from profiler.sampling.sampler import StackSampler
from profiler.scope import attach
from profiler.symbols import perfmap
from profiler.symbols.frames import java_frame_name
from tests.fixtures.jvm import java_home, method_counts, without_approximate
from tests.fixtures.sampling import folded_and_stats

CPU_SPLIT = re.compile(r"^com\.example\.CpuSplit::burn\w+$")


@pytest.fixture(scope="module")
def agent() -> Path:
    return perfmap.build_agent()  # what scripts/setup.sh does; a no-op when up to date


def _map_file(pid: int) -> Path:
    return Path(f"/tmp/perf-{pid}.map")


def _burner_entries(pid: int) -> dict[int, str]:
    """start address -> normalized name of the CpuSplit burner methods in the current map."""
    entries = {}
    for line in _map_file(pid).read_text().splitlines():
        start, _size, name = line.split(" ", 2)
        normalized = java_frame_name(name)
        if CPU_SPLIT.match(normalized):
            entries[int(start, 16)] = normalized
    return entries


def test_jcmd_attach_client_and_agent_give_the_same_java_frames(cpu_split_jvm, agent):
    pid = cpu_split_jvm.pid
    expected = {f"com.example.CpuSplit::{m}" for m in cpu_split_jvm.methods}

    # the test JDK's jcmd itself (a reference only: the agent never runs a jcmd)
    done = subprocess.run(
        [str(java_home() / "bin" / "jcmd"), str(pid), "Compiler.perfmap"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    by_jcmd = _burner_entries(pid)
    assert expected <= set(by_jcmd.values()), by_jcmd
    raw = _map_file(pid).read_text()
    assert re.search(r"^0x[0-9a-f]+ 0x[0-9a-f]+ long com\.example\.CpuSplit\.burnAlpha\(long, long\)$", raw, re.M)

    # our attach client sending the same diagnostic command
    _map_file(pid).unlink()
    result = perfmap.dump_perf_map(pid)
    assert result.ok and result.method == "attach", result
    assert set(_burner_entries(pid).values()) >= expected

    # the JVMTI agent: perf-map-agent's spelling, same code addresses, same frames after normalization
    result = perfmap.load_agent(pid, agent)
    assert result.ok, result
    raw = _map_file(pid).read_text()
    assert re.search(r"^[0-9a-f]+ [0-9a-f]+ Lcom/example/CpuSplit;::burnAlpha$", raw, re.M), raw[:500]
    by_agent = _burner_entries(pid)
    assert expected <= set(by_agent.values())
    shared = set(by_jcmd) & set(by_agent)
    assert shared, "jcmd and the agent saw no common compiled burner (all recompiled in between?)"
    assert all(by_jcmd[addr] == by_agent[addr] for addr in shared)
    lookup = perfmap.read_perf_map(pid)
    assert lookup is not None
    assert all(java_frame_name(lookup.lookup(addr + 1) or "") == by_agent[addr] for addr in shared)

    # the agent keeps appending: code compiled after the load shows up without another dump
    lines_before = len(raw.splitlines())
    time.sleep(1)
    assert len(_map_file(pid).read_text().splitlines()) >= lines_before


def test_sampler_with_the_agent_resolves_the_workload(start_cpu_split_jvm, agent):
    workload = start_cpu_split_jvm(weights={"alpha": 60, "gamma": 40}, threads=1)
    sampler = StackSampler(perf_map_mode="agent")
    try:
        sampler.start()
        sampler.add_pid(workload.pid)
        sampler.prepare_symbols(workload.pid)
        time.sleep(3)  # ~300 samples of the one burner at 99 Hz (~180 alpha, ~120 gamma) for > 0 each (issue 48)
        sampler.stop()
        folded, stats = folded_and_stats(sampler.collect()[workload.pid])
    finally:
        sampler.close()
    counts = method_counts(folded, ["burnAlpha", "burnGamma", "burnBeta"])
    assert counts["burnAlpha"] > 0 and counts["burnGamma"] > 0, folded.most_common(5)
    assert counts["burnBeta"] == 0
    # read as method_counts reads them: a compiled frame whose scope came from a later PcDesc ends in " [approx]"
    frames = {without_approximate(frame) for stack in folded for frame in stack.split(";")}
    assert "com.example.CpuSplit::burnAlpha" in frames
    assert "Lcom/example/CpuSplit;::burnAlpha" not in frames  # one spelling whichever path wrote the map
    assert stats.samples > 0


def test_jvm_of_another_user_gets_its_map_and_the_agent(start_cpu_split_jvm, cpu_split_classpath, agent):
    # GIVEN a JVM running as nobody (its classes copied where nobody can read them)
    shared = Path(tempfile.mkdtemp(prefix="cpu-split-"))
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(cpu_split_classpath, shared / "classes")
        workload = start_cpu_split_jvm(classpath=shared / "classes", user="nobody", threads=1)
        pid = workload.pid
        assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam("nobody").pw_uid
        # WHEN the map is dumped (root peer) and the agent loaded as the JVM's user from inside its
        # namespaces (the JDK 8 route)
        result = perfmap.dump_perf_map(pid)
        assert result.ok, result
        assert os.stat(_map_file(pid)).st_uid == pwd.getpwnam("nobody").pw_uid  # written by the JVM itself
        assert "com.example.CpuSplit::burnAlpha" in _burner_entries(pid).values()
        host_path, jvm_path = perfmap._copy_agent_into(pid, agent)
        assert host_path.stat().st_uid == pwd.getpwnam("nobody").pw_uid  # created as the JVM's user
        try:
            request = b"1\0load\0" + jvm_path.encode() + b"\0true\0\0"
            reply = attach.exchange_as_target(pid, request, time.monotonic() + 30).decode()
            status, output = int(reply.partition("\n")[0]), reply.partition("\n")[2]
        finally:
            perfmap._remove_agent_copy(pid, jvm_path)
        assert not host_path.exists()
        # THEN the agent rewrote the map in its own spelling
        assert status == 0 and "return code: 0" in output, output
        assert "Lcom/example/CpuSplit;::burnAlpha" in _map_file(pid).read_text()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
