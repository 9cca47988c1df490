"""A root profiler among a tenant's JVMs (issue 27, docs/security.md): links and FIFOs planted at every
path the agent creates or reads never make it act with root's rights, never hang it, and the run still
profiles the other processes."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.read import pid_stacks_file, read_meta, read_overhead, read_stack_counts
from profiler.scope import attach
from profiler.symbols import perfmap
from tests.fixtures.hostile import TenantJvm, give_to_tenant, tenant_ids

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agent() -> Path:
    return perfmap.build_agent()  # what scripts/setup.sh does; a no-op when up to date


class RootDaemon:
    """A root-only UNIX socket (as docker.sock is) that counts who connects."""

    def __init__(self, path: Path) -> None:
        self.connections = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.server.settimeout(0.5)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.server.close()


def _plant_link(link: Path, target: Path) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    give_to_tenant(link)


def _plant_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)
    give_to_tenant(path)


def _profile(out: Path, *pids: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "profiler", "run", "--duration", "8", "--out", str(out), "--force"]
    for pid in pids:
        argv += ["--pid", str(pid)]
    # a hang anywhere (a FIFO opened, a socket never answering) fails here instead of stalling the suite
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)


def _plant_everything(tenant: TenantJvm, secrets: dict[str, Path]) -> None:
    """Links to root's files and FIFOs where the agent creates triggers and reads maps and counters."""
    ns = tenant.ns_pid
    _plant_link(tenant.cwd / f".attach_pid{ns}", secrets["cwd trigger"])
    _plant_fifo(tenant.tmp / f".attach_pid{ns}")
    _plant_link(tenant.tmp / f"perf-{ns}.map", secrets["perf map"])
    _plant_link(tenant.home / "release", secrets["release"])
    hsperfdata = tenant.tmp / f"hsperfdata_{'nobody'}" / str(ns)
    assert hsperfdata.exists(), "the JVM writes its hsperfdata (UsePerfData is the default)"
    _plant_fifo(hsperfdata)



def _stacks_text(out: Path, pid: int) -> str:
    """Every folded stack of ``pid`` in the capture, one a line, whichever form it stores them in."""
    path = pid_stacks_file(out, pid)
    assert path is not None, f"the capture holds no stacks of pid {pid}"
    return "\n".join(read_stack_counts(path))


def test_planted_links_and_fifos_never_act_with_roots_rights(
    tenant_jvm, root_secret, start_cpu_split_jvm, tenant_area: Path, tmp_path: Path
) -> None:
    # GIVEN root-owned 0600 files, a root-only socket, and a normal JVM of root's
    secrets = {name: root_secret(name.replace(" ", "-")) for name in ("cwd trigger", "perf map", "release")}
    daemon = RootDaemon(tenant_area / "root-only" / "daemon.sock")
    normal = start_cpu_split_jvm(threads=1)
    # AND two JVMs of the tenant (nobody, own PID and mount namespace, private /tmp): one with links and
    # FIFOs at its trigger files, perf map, hsperfdata and JDK release file; one whose attach socket
    # path is a link to the root-only socket
    planted = tenant_jvm()
    _plant_everything(planted, {name: secret.path for name, secret in secrets.items()})
    socket_link = tenant_jvm()
    _plant_link(socket_link.tmp / f".java_pid{socket_link.ns_pid}", tenant_area / "root-only" / "daemon.sock")
    try:
        # WHEN root profiles all three
        out = tmp_path / "cap"
        done = _profile(out, planted.pid, socket_link.pid, normal.pid)
    finally:
        daemon.close()
    # THEN the run ended normally, root's files kept owner, mode and content, nobody knocked on the socket
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(secret.intact() for secret in secrets.values())
    assert daemon.connections == 0
    # AND each refusal is one warning naming the PID and the path
    warnings = read_meta(out).warnings
    assert any(
        w.startswith(f"pid {planted.pid}: /proc/{planted.pid}/root/tmp/perf-{planted.ns_pid}.map: a symbolic link")
        for w in warnings
    ), warnings
    assert any(f"pid {socket_link.pid}: /proc/{socket_link.pid}/root/tmp/.java_pid" in w for w in warnings), warnings
    # AND no program of a tenant's ran (the attach socket refused, its image's jcmd is not a way around)
    assert (tenant_area / "shared" / "jcmd-runs").read_text() == ""
    # AND the other JVM was profiled, its Java frames named from its perf map
    assert "com.example.CpuSplit::burn" in _stacks_text(out, normal.pid)
    # AND the capture is root's alone
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / capture.META_FILE).stat().st_mode) == 0o600


def test_a_tenant_jvm_is_asked_from_inside_its_namespaces_and_its_jcmd_never_runs(
    tenant_jvm, root_secret, tenant_area: Path
) -> None:
    # GIVEN a tenant JVM (own pid and mount namespace, private /tmp) whose JDK's bin/jcmd is the tenant's
    # script (it records who runs it and tries to take root's files)
    secret = root_secret("jcmd-target")
    tenant = tenant_jvm()
    # WHEN the agent asks it as it asks a JVM that refuses root (JDK 8): from a child inside its namespaces
    reply = attach.exchange_as_target(tenant.pid, b"1\0jcmd\0VM.version\0\0\0", time.monotonic() + 60)
    # THEN the JVM itself answered (HotSpot checks the peer's uid: the child was the tenant), the tenant's
    # jcmd never ran, and root's file is untouched
    assert reply.startswith(b"0\n") and b"OpenJDK" in reply, reply[:300]
    assert (tenant_area / "shared" / "jcmd-runs").read_text() == ""
    assert secret.intact()
    # AND Thread.print for thread names takes the same socket: status 0, the JVM's own threads
    status, output = attach.attach_command(tenant.pid, "jcmd", "Thread.print", timeout=60)
    assert status == 0 and '"main"' in output, output[:300]


def test_the_agent_copy_is_the_tenants_and_goes(tenant_jvm, root_secret, agent) -> None:
    # GIVEN a tenant JVM whose /tmp is its own (a private tmpfs)
    tenant = tenant_jvm()
    # WHEN the perf-map agent is copied in and loaded
    result = perfmap.load_agent(tenant.pid, agent)
    # THEN it loaded (the copy was readable by the JVM's user) and no copy is left in the tenant's /tmp
    assert result.ok, result
    assert not [p for p in tenant.tmp.iterdir() if p.name.startswith(".spe-perfmap-agent-")]
    assert os.stat(tenant.tmp / f"perf-{tenant.ns_pid}.map").st_uid == tenant_ids()[0]


def test_a_crafted_jvm_is_skipped_and_the_real_one_profiled(fake_jvm, start_cpu_split_jvm, tmp_path: Path) -> None:
    # GIVEN a crafted "JVM" (absurd vmStructs, .eh_frame claiming 1 TB, a 10-million-line perf map, a
    # 10 KB thread name, attach replies of 40 MB) beside a real JVM, and the agent's peak RSS when it
    # profiles the real one alone (about 200 MB: docs/benchmarks/memory.md)
    real = start_cpu_split_jvm(threads=1)
    alone = _profile(tmp_path / "alone", real.pid)
    assert alone.returncode == 0, alone.stderr[-2000:]
    usual = read_overhead(tmp_path / "alone")
    # WHEN both are profiled
    out = tmp_path / "cap"
    done = _profile(out, fake_jvm.pid, real.pid)
    # THEN the run ended, the fake one's perf map was refused with one warning naming its PID and path
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = read_meta(out).warnings
    perf_map = f"pid {fake_jvm.pid}: /proc/{fake_jvm.pid}/root{fake_jvm.perf_map}: "
    assert any(w.startswith(perf_map) and "over the limit" in w for w in warnings), warnings
    # AND the real one was profiled with its Java frames named
    assert "com.example.CpuSplit::burn" in _stacks_text(out, real.pid)
    # AND no name of the fake one's reached the capture longer than the agent keeps
    assert "N" * 300 not in _stacks_text(out, fake_jvm.pid)
    # AND the fake one cost the agent what a second process costs, not its hostile sizes (parsed, the
    # perf map alone would take gigabytes; the attach replies 40 MB each)
    overhead = read_overhead(out)
    assert usual is not None and overhead is not None
    assert overhead.peak_rss_bytes < usual.peak_rss_bytes + 64 * 1024 * 1024, (usual, overhead)
