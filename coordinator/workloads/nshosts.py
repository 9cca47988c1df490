"""Hosts on one machine (the tests' harness and `coordinator demo --hosts N`): each in its own network,
UTS, mount and PID namespaces, running a real sshd (coordinator/workloads/sshd.py) as the PID 1 of
its namespace, reachable from ours on a private subnet through a bridge. What runs in a host
(``host.enter()``) sees its own hostname, its own /tmp and /run, its own /proc and only
its own processes; everything is torn down on exit, even after a failure.

    harness = NamespacedHosts()
    hosts = harness.start(3)                          # node1..node3 at 10.213.<n>.11..13, sshd ready
    subprocess.run([*hosts[0].enter(), "hostname"])   # -> node1
    harness.cluster_file(...)                         # cluster.txt and known_hosts for `coordinator profile`

Layout (docs/cluster-namespaces.md): a bridge ``tpfb<tag>`` in our namespace holds 10.213.<n>.1/24; host i
is the network namespace ``tpf<tag>h<i>`` (``ip netns``) whose ``eth0`` (a veth pair, our end on the bridge)
holds 10.213.<n>.(10+i). Its sshd is started by ``nsenter --net`` (not ``ip netns exec``, which would
mount a fresh /sys without tracefs, where bcc finds tracepoints) and ``unshare --pid --fork --mount --uts
--kill-child``; the host's /tmp and /run are bind mounts of its directory (outside /tmp, so sshd's keys
stay visible), its /proc is mounted for its PID namespace. The harness's files live under /var/tmp.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from coordinator.workloads.sshd import SshdFactory, SshdHost

SUBNET = "10.213"  # the third octet is per harness (below); only our own namespaces use it
MAX_HOSTS = 16
PREFIX = "tpf"  # every bridge, veth and namespace name starts with it (the leftovers check looks for it)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def host_script(hostname: str, directory: Path) -> str:
    """The shell run as PID 1 of a new host before it execs sshd: its hostname, its own /tmp and /run,
    a /proc of its PID namespace."""
    return (
        f"hostname {hostname} && "
        f"mount --bind {directory}/tmp /tmp && mount --bind {directory}/run /run && "
        "mkdir -p /run/sshd && chmod 0755 /run/sshd && "
        "mount -t proc proc /proc && "
        'exec "$@"'
    )


@dataclass
class NamespacedHost:
    """One host: its network namespace, address, and the sshd that is its PID 1."""

    name: str
    netns: str
    address: str
    directory: Path
    sshd: SshdHost

    @property
    def init_pid(self) -> int:
        """The host's PID 1 (its sshd) as our namespace sees it: the child of unshare."""
        assert self.sshd.process is not None, f"{self.name}: not running"
        children = psutil.Process(self.sshd.process.pid).children()
        assert len(children) == 1, f"{self.name}: unshare has {len(children)} children"
        return children[0].pid

    def pid_namespace(self) -> int:
        """The inode of the host's PID namespace."""
        return os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino

    def enter(self) -> list[str]:
        """Words before a command to run it inside the host (all five namespaces; a fork for the PID one)."""
        return ["nsenter", "-t", str(self.init_pid), "--net", "--uts", "--mount", "--pid", "--"]

    def pids(self) -> set[int]:
        """Our PIDs of every process in the host."""
        inode = self.pid_namespace()
        found = set()
        for proc in psutil.process_iter():
            try:
                if os.stat(f"/proc/{proc.pid}/ns/pid").st_ino == inode:
                    found.add(proc.pid)
            except OSError:
                continue
        return found


def ns_pid(pid: int) -> int:
    """``pid`` (ours) as its own PID namespace sees it (the last NSpid entry)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"pid {pid}: no NSpid")


class NamespacedHosts:
    """Starts hosts on one bridge; ``stop()`` removes every process, link and namespace it made."""

    def __init__(self, tag: int | None = None) -> None:
        self.tag = (os.getpid() if tag is None else tag) % 10000
        self.octet = 100 + self.tag % 100  # 10.213.100-199: other fixtures use 10.213.0.x
        self.bridge = f"{PREFIX}b{self.tag}"
        self.base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-hosts-", dir="/var/tmp"))
        os.chmod(self.base, 0o755)
        self.factory = SshdFactory(self.base / "sshd")
        self.hosts: list[NamespacedHost] = []
        self._netns: list[str] = []
        self._links: list[str] = []

    @property
    def gateway(self) -> str:
        return f"{SUBNET}.{self.octet}.1"

    def start(self, count: int) -> list[NamespacedHost]:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"{count} hosts: 1..{MAX_HOSTS}")
        if not self._links:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        for _ in range(count):
            self.hosts.append(self._start_one(len(self.hosts) + 1))
        return self.hosts[-count:]

    def _start_one(self, index: int) -> NamespacedHost:
        name = f"node{index}"
        netns, ours = f"{PREFIX}{self.tag}h{index}", f"{PREFIX}{self.tag}v{index}"
        address = f"{SUBNET}.{self.octet}.{10 + index}"
        _ip("netns", "add", netns)
        self._netns.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("link", "add", ours, "type", "veth", "peer", "name", "eth0", "netns", netns)
        self._links.append(ours)
        _ip("link", "set", ours, "master", self.bridge)
        _ip("link", "set", ours, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        directory = self.base / "roots" / name
        for sub in ("tmp", "run"):
            (directory / sub).mkdir(parents=True)
        os.chmod(directory / "tmp", 0o1777)
        prefix = [
            "nsenter", f"--net=/run/netns/{netns}", "--",
            "unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--propagation", "private", "--",
            "sh", "-c", host_script(name, directory), "sh",
        ]  # fmt: skip
        sshd = self.factory.start(name, env={"TMPDIR": "/tmp"}, prefix=prefix, address=address)
        # sessions see the host's /tmp, which is this directory from our side
        sshd.session_tmp = directory / "tmp"
        return NamespacedHost(name, netns, address, directory, sshd)

    def cluster_file(self, hosts: list[NamespacedHost] | None = None) -> tuple[Path, Path]:
        """cluster.txt (root over SSH to each host's address) and the known_hosts that goes with it."""
        chosen = hosts if hosts is not None else self.hosts
        lines = [h.sshd.cluster_line(self.factory.user_key) for h in chosen]
        return self.factory.cluster_file(lines), self.factory.known_hosts([h.sshd for h in chosen])

    def stop(self) -> None:
        """Every host's processes (killing its PID 1 kills the whole namespace), then links, namespaces, files.
        Each step runs even when an earlier one failed."""
        namespaces = []
        for host in self.hosts:
            try:
                namespaces.append(host.pid_namespace())
                # unshare ignores SIGTERM while it waits for its child: end the host at its PID 1
                os.kill(host.init_pid, signal.SIGKILL)
            except (AssertionError, OSError, psutil.Error):
                pass
        self.factory.stop_all()
        _wait_namespaces_empty(namespaces)
        for link in reversed(self._links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        for netns in self._netns:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        self._links.clear()
        self._netns.clear()
        shutil.rmtree(self.base, ignore_errors=True)


def _wait_namespaces_empty(namespaces: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while namespaces and time.monotonic() < deadline:
        if not any(pid for pid in _pids_in(namespaces)):
            return
        time.sleep(0.05)


def _pids_in(namespaces: list[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/pid").st_ino in namespaces:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def leftovers(tag: int, base: Path) -> list[str]:
    """Links, network namespaces, processes and files of harness ``tag`` (files under ``base``) still
    present: empty after stop()."""
    left = []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == f"{PREFIX}b{tag}" or name.startswith(f"{PREFIX}{tag}v"):
            left.append(f"link {name}")
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    left += [f"netns {line.split()[0]}" for line in namespaces.splitlines() if line.startswith(f"{PREFIX}{tag}h")]
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(base) in word for word in proc.info["cmdline"] or []):
            left.append(f"process {proc.pid} {' '.join(proc.info['cmdline'])[:80]}")
    if base.exists():
        left.append(f"directory {base}")
    return left
