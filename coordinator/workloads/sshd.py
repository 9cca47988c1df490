"""Real OpenSSH servers started by the project (the namespaced hosts of `coordinator demo --hosts`, and
the coordinator tests): each on 127.0.0.1 (or a given address) with a free port, its own generated
ed25519 host key, a private authorized_keys holding a generated user key, and a private TMPDIR for
sessions (so a test can see what the coordinator left behind). sshd runs in the foreground
(``-D -e``) as a child of the test; teardown kills it and every session it forked."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from profiler.errors import ProfilerError

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


class SshdError(ProfilerError):
    """An sshd the project started exited or never answered (its log is in the message)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def generate_key(path: Path, comment: str) -> Path:
    """An ed25519 key pair without passphrase; returns the private key path (``.pub`` beside it)."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, timeout=30
    )
    return path


def public_key_line(private_key: Path) -> str:
    return Path(f"{private_key}.pub").read_text().strip()


@dataclass
class SshdHost:
    """One running sshd; ``session_tmp`` is TMPDIR of its sessions (where the agent is deployed)."""

    name: str
    port: int
    directory: Path
    host_key: Path
    session_tmp: Path
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)
    address: str = "127.0.0.1"

    def known_hosts_line(self, host_key: Path | None = None) -> str:
        kind, blob = public_key_line(host_key or self.host_key).split()[:2]
        return f"[{self.address}]:{self.port} {kind} {blob}"

    def cluster_line(self, identity: Path, roles: str = "worker", user: str = "root") -> str:
        return f"{user}@{self.address}:{self.port} {roles} identity={identity} name={self.name}"

    def session_processes(self) -> list[psutil.Process]:
        """The per-connection sshd processes forked by this server (not the listener)."""
        if self.process is None:
            return []
        try:
            return [p for p in psutil.Process(self.process.pid).children(recursive=True) if p.name() == "sshd"]
        except psutil.NoSuchProcess:
            return []

    def kill_sessions(self) -> int:
        """Kill every SSH connection to this server, as a network cut or sshd crash would."""
        victims = self.session_processes()
        for proc in victims:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return len(victims)

    def leftovers(self) -> list[str]:
        """Anything still under the sessions' TMPDIR (the coordinator must remove its work directory)."""
        return sorted(p.name for p in self.session_tmp.iterdir())

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for proc in tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=10)
        self.process = None


def _write_config(host: SshdHost, authorized_keys: Path, env: dict[str, str] | None = None) -> Path:
    config = host.directory / "sshd_config"
    environment = " ".join(f"{key}={value}" for key, value in {"TMPDIR": str(host.session_tmp), **(env or {})}.items())
    config.write_text(
        "\n".join(
            [
                f"Port {host.port}",
                f"ListenAddress {host.address}",
                f"HostKey {host.host_key}",
                f"PidFile {host.directory / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized_keys}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                # the key files live in pytest's tmp dir, which sshd's ownership checks would refuse
                "StrictModes no",
                "Subsystem sftp internal-sftp",
                f"SetEnv {environment}",
                "ClientAliveInterval 5",
                "MaxStartups 50",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    return config


def _wait_ready(host: SshdHost, timeout: float = 20.0) -> None:
    """Ready when the port answers with an SSH banner (not merely accepts)."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        assert host.process is not None
        if host.process.poll() is not None:
            log_tail = host.log.read_text()[-2000:]
            raise SshdError(f"sshd {host.name} exited with {host.process.returncode}: {log_tail}")
        try:
            with socket.create_connection((host.address, host.port), timeout=2) as sock:
                sock.settimeout(2)
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError as exc:
            last_error = str(exc)
        time.sleep(0.05)
    raise SshdError(f"sshd {host.name} not ready on port {host.port}: {last_error}")


class SshdFactory:
    """Starts sshd instances sharing one authorized user key; stops them all at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.user_key = generate_key(base / "id_user", "taskprof-test-user")
        self.authorized_keys = base / "authorized_keys"
        self.authorized_keys.write_text(public_key_line(self.user_key) + "\n")
        os.chmod(self.authorized_keys, 0o600)
        self.hosts: list[SshdHost] = []

    def start(
        self,
        name: str | None = None,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        address: str = "127.0.0.1",
    ) -> SshdHost:
        """One more sshd. ``env``: extra environment of its sessions (sshd ``SetEnv``); ``prefix``: words
        before the sshd command (``ip netns exec NS``, ``unshare …``, which exec it: the pid stays sshd's);
        ``address``: where it listens."""
        # sshd's privilege separation directory; Debian's ssh service would create the same.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        name = name or f"node{len(self.hosts) + 1}"
        directory = self.base / name
        directory.mkdir()
        session_tmp = directory / "tmp"
        session_tmp.mkdir(mode=0o1777)
        os.chmod(session_tmp, 0o1777)
        host = SshdHost(
            name=name,
            port=free_port(),
            directory=directory,
            host_key=generate_key(directory / "ssh_host_ed25519_key", f"host-{name}"),
            session_tmp=session_tmp,
            log=directory / "sshd.log",
            address=address,
        )
        config = _write_config(host, self.authorized_keys, env)
        with open(host.log, "wb") as log:
            host.process = subprocess.Popen(
                [*(prefix or []), SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log
            )
        self.hosts.append(host)
        _wait_ready(host)
        return host

    def stop_all(self) -> None:
        for host in self.hosts:
            host.stop()

    def known_hosts(self, hosts: list[SshdHost], path: Path | None = None) -> Path:
        path = path or self.base / "known_hosts"
        path.write_text("".join(h.known_hosts_line() + "\n" for h in hosts))
        return path

    def cluster_file(self, lines: list[str], path: Path | None = None) -> Path:
        path = path or self.base / "cluster.txt"
        path.write_text("# generated by coordinator/workloads/sshd.py\n" + "\n".join(lines) + "\n")
        return path
