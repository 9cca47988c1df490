"""SSH transport (paramiko): key authentication only, known_hosts enforced, the agent run detached.

An unknown host key is refused with its fingerprint unless ``accept_new`` (then recorded, like
OpenSSH's ``StrictHostKeyChecking=accept-new``); a changed key is always refused.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from coordinator.errors import HostKeyError, HostUnreachable, ProfilerError
from coordinator.remote import deploy, untar
from coordinator.remote.cluster import HostSpec
from coordinator.remote.hosts import CommandResult, HostTransport, ProfilerStatus, RunRequest, TransportLost

DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
_known_hosts_lock = threading.Lock()  # hosts connect in parallel and may record keys in one file


@dataclass(frozen=True)
class SshOptions:
    known_hosts: Path = DEFAULT_KNOWN_HOSTS
    accept_new_hosts: bool = False
    connect_timeout: float = 10.0
    keepalive: int = 5  # seconds between keepalive packets, so a dead peer is noticed
    # A silent peer (link down, packets dropped) keeps the TCP connection "up" for ~15 minutes of
    # retransmissions; the kernel drops it once sent data stays unacknowledged this long (TCP_USER_TIMEOUT,
    # the keepalives guarantee there is some), and the transport reconnects.
    dead_peer_timeout: float = 20.0
    command_timeout: float = 60.0
    identity: Path | None = None  # default key for hosts without identity=


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, e.g. ``SHA256:47DEQpj8…`` (what ``ssh-keygen -lf`` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _UnknownHostPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown hosts with their fingerprint, or record them when told to (accept-new)."""

    def __init__(self, options: SshOptions, spec: HostSpec) -> None:
        self.options = options
        self.spec = spec

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        path = self.options.known_hosts.expanduser()
        if not self.options.accept_new_hosts:
            raise HostKeyError(
                f"{self.spec.source or self.spec.label}: unknown host key for {hostname} "
                f"({key.get_name()} {fingerprint(key)}); verify it, then re-run with --accept-new-hosts "
                f"to record it in {path}"
            )
        with _known_hosts_lock:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Append rather than rewrite: other tools' entries and comments stay untouched.
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            os.chmod(path, 0o600)
        client.get_host_keys().add(hostname, key.get_name(), key)


class SshHost(HostTransport):
    """A host reached over SSH; the profiler runs there in a private temporary directory."""

    def __init__(self, spec: HostSpec, options: SshOptions | None = None) -> None:
        super().__init__(spec)
        self.options = options or SshOptions()
        self.client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.workdir: str | None = None
        self.needs_sudo = False
        self.python = spec.python or deploy.SYSTEM_PYTHON
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ connection

    def _key_filename(self) -> str | None:
        if self.spec.identity:
            return str(Path(self.spec.identity).expanduser())
        return str(self.options.identity.expanduser()) if self.options.identity else None

    def connect(self) -> None:
        spec = self.spec
        client = paramiko.SSHClient()
        known_hosts = self.options.known_hosts.expanduser()
        if self.options.known_hosts == DEFAULT_KNOWN_HOSTS and SYSTEM_KNOWN_HOSTS.is_file():
            try:
                client.load_system_host_keys(str(SYSTEM_KNOWN_HOSTS))
            except (OSError, paramiko.SSHException):
                pass  # the user's file decides; a broken system file must not block
        if known_hosts.exists():
            try:
                client.load_host_keys(str(known_hosts))
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(f"{known_hosts}: cannot read ({exc}); fix or move the file") from None
        client.set_missing_host_key_policy(_UnknownHostPolicy(self.options, spec))
        key_filename = self._key_filename()
        if key_filename is not None and not os.path.exists(key_filename):
            raise HostUnreachable(f"{spec.source}: identity file {key_filename} not found; fix identity=")
        try:
            client.connect(
                spec.hostname,
                port=spec.port,
                username=spec.user or _local_user(),
                key_filename=key_filename,
                allow_agent=True,
                look_for_keys=True,
                timeout=self.options.connect_timeout,
                banner_timeout=self.options.connect_timeout,
                auth_timeout=self.options.connect_timeout,
                # Never fall back to a password: none is configured, and prompts would hang threads.
                password=None,
                passphrase=None,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"{spec.source or spec.label}: HOST KEY CHANGED for {spec.address}: known_hosts has "
                f"{fingerprint(exc.expected_key)}, the host sent {exc.key.get_name()} {fingerprint(exc.key)}; "
                f"this may be an attack — if the host was really reinstalled, remove its line from "
                f"{known_hosts} (ssh-keygen -R '{known_hosts_name(spec.hostname, spec.port)}')"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise HostUnreachable(
                f"{spec.source or spec.label}: authentication failed for {spec.address} ({exc}); "
                "load a key into ssh-agent, put it in ~/.ssh, or set identity= on the line"
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            client.close()
            raise HostUnreachable(
                f"{spec.source or spec.label}: cannot connect to {spec.address} ({exc or type(exc).__name__}); "
                "check that the host is up and sshd listens on that port"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.options.keepalive)
            _set_user_timeout(transport.sock, self.options.dead_peer_timeout)
        with self._lock:
            self.client = client
            self._sftp = None

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                try:
                    self._sftp.close()
                except Exception:  # noqa: BLE001 - closing a dead session
                    pass
            if self.client is not None:
                self.client.close()
            self.client = None
            self._sftp = None

    def _client(self) -> paramiko.SSHClient:
        client = self.client
        transport = client.get_transport() if client is not None else None
        if client is None or transport is None or not transport.is_active():
            raise TransportLost(f"{self.spec.label}: SSH connection to {self.address} lost")
        return client

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = self._client().open_sftp()
                    # A silent network (link down, packets dropped) must not block a poll for ever.
                    self._sftp.get_channel().settimeout(self.options.command_timeout)  # type: ignore[union-attr]
                except (OSError, EOFError, paramiko.SSHException) as exc:
                    raise TransportLost(f"{self.spec.label}: SFTP to {self.address} failed ({exc})") from None
            return self._sftp

    def exec(self, command: str, timeout: float | None = None) -> CommandResult:
        """Run one shell line (already quoted) and wait for it."""
        timeout = self.options.command_timeout if timeout is None else timeout
        try:
            channel = self._client().get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
            channel.settimeout(timeout)
            channel.exec_command(command)
            stdout = channel.makefile("rb")
            stderr = channel.makefile_stderr("rb")
            out = stdout.read()
            err = stderr.read()
            status = channel.recv_exit_status()
            channel.close()
            if status == -1:  # the channel closed without an exit status: the connection went away
                raise TransportLost(f"{self.spec.label}: connection to {self.address} closed during a command")
        except socket.timeout:
            raise TransportLost(f"{self.spec.label}: command timed out after {timeout:g} s on {self.address}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            reason = exc or type(exc).__name__
            raise TransportLost(f"{self.spec.label}: SSH to {self.address} failed ({reason})") from None
        return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    # ------------------------------------------------------------------ the profiler

    @property
    def layout(self) -> deploy.RemoteLayout:
        assert self.workdir is not None, "deploy() first"
        return deploy.RemoteLayout(self.workdir)

    def measure_clock_offset(self) -> float:
        """Host minus coordinator clock, NTP-style: the quickest of a few one-line round trips.

        One shell stays open so each probe costs one network round trip (an exec per probe would put
        channel set-up and shell start-up on one side of the midpoint and skew the estimate).
        """
        best: tuple[float, float] | None = None
        try:
            channel = self._client().get_transport().open_session(timeout=20)  # type: ignore[union-attr]
            channel.settimeout(10)
            channel.exec_command("while read -r _; do date +%s.%N; done")
            reader = channel.makefile("rb")
            for _ in range(5):
                before = time.time()
                channel.sendall(b"\n")
                line = reader.readline()
                after = time.time()
                try:
                    remote = float(line.decode("ascii").strip())
                except (UnicodeDecodeError, ValueError):
                    continue
                round_trip = after - before
                if best is None or round_trip < best[0]:
                    best = (round_trip, remote - (before + after) / 2)
                    self.round_trip = round_trip
            channel.shutdown_write()
            channel.close()
        except socket.timeout:
            raise TransportLost(f"{self.spec.label}: clock probe timed out on {self.address}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportLost(f"{self.spec.label}: clock probe on {self.address} failed ({exc})") from None
        self.clock_offset = best[1] if best is not None else 0.0
        return self.clock_offset

    def deploy(self, profile: Path, known_spes: Path) -> None:
        spec = self.spec
        # One round trip for the facts (each exec starts a login shell, which can be slow).
        probe = self.exec(deploy.probe_command())
        facts = deploy.parse_probe(probe.stdout)
        if probe.returncode != 0 or facts is None:
            raise HostUnreachable(
                f"{spec.source}: preparing {self.address} failed ({probe.stderr.strip() or probe.stdout.strip()}); "
                "check that /tmp is writable and mktemp exists"
            )
        self.needs_sudo = facts.uid != 0
        if self.needs_sudo and not facts.sudo_ok:
            self._remove_workdir_quietly(facts.workdir)
            raise HostUnreachable(
                f"{spec.source}: sudo refused on {self.address} (needs a password); "
                f"log in as root or allow passwordless sudo for {spec.user or _local_user()}"
            )
        if self.spec.python is None:
            if not facts.python.startswith("/"):
                self._remove_workdir_quietly(facts.workdir)
                raise HostUnreachable(
                    f"{spec.source}: no python3 on {self.address}; install python3, python3-bpfcc and "
                    "python3-psutil (Debian), or set python= on the line"
                )
            self.python = facts.python
        workdir = facts.workdir
        self.workdir = workdir
        layout = self.layout
        sftp = self._sftp_client()
        try:
            sftp.putfo(io.BytesIO(deploy.build_bundle()), layout.bundle)
            sftp.put(str(profile), layout.profile)
            sftp.put(str(known_spes), layout.known_spes)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportLost(f"{spec.label}: upload to {self.address} failed ({exc})") from None
        unpacked = self.exec(deploy.unpack_command(layout))
        if unpacked.returncode != 0:
            raise HostUnreachable(f"{spec.source}: unpacking the agent failed on {self.address}: {unpacked.stderr}")

    @property
    def work_directory(self) -> str | None:
        return self.workdir

    def attach(self, workdir: str) -> None:
        """Take over an earlier run's work directory: whether sudo is needed is asked again."""
        deploy.check_workdir(workdir)
        probe = self.exec("id -u")
        if probe.returncode != 0 or not probe.stdout.strip().isdigit():
            raise HostUnreachable(f"{self.spec.source}: `id -u` failed on {self.address}: {probe.stderr.strip()}")
        self.needs_sudo = int(probe.stdout.strip()) != 0
        self.workdir = workdir

    def _remove_workdir_quietly(self, workdir: str) -> None:
        try:
            self.exec(deploy.cleanup_command(deploy.RemoteLayout(workdir), False), timeout=20)
        except (TransportLost, ValueError):
            pass

    def start_profiler(self, request: RunRequest) -> None:
        layout = self.layout
        args = self.run_args(layout, request)
        started = self.exec(deploy.start_command(layout, self.python, args, self.needs_sudo), timeout=30)
        if started.returncode != 0:
            raise HostUnreachable(f"{self.spec.source}: could not start the profiler: {started.stderr.strip()}")

    def write_start_file(self, text: str) -> None:
        """Over SFTP under a second name, then renamed: the profiler never sees a part of it."""
        sftp = self._sftp_client()
        layout = self.layout
        partial = layout.start + ".part"
        try:
            with sftp.open(partial, "w") as handle:
                handle.write(text.encode("ascii"))
            sftp.rename(partial, layout.start)
        except (OSError, EOFError, paramiko.SSHException, socket.timeout) as exc:
            with self._lock:
                self._sftp = None
            raise TransportLost(f"{self.spec.label}: writing the start file on {self.address} failed ({exc})") from None

    def read_status(self) -> ProfilerStatus | None:
        sftp = self._sftp_client()
        try:
            with sftp.open(self.layout.status, "r") as handle:
                text = handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        except (OSError, EOFError, paramiko.SSHException, socket.timeout) as exc:
            with self._lock:
                self._sftp = None
            raise TransportLost(f"{self.spec.label}: reading status from {self.address} failed ({exc})") from None
        return ProfilerStatus.from_json(text)

    def profiler_alive(self) -> bool:
        return self.exec(deploy.alive_command(self.layout, self.needs_sudo), timeout=20).returncode == 0

    def signal_profiler(self, signal_name: str) -> bool:
        if not self.profiler_alive():
            return False
        return self.exec(deploy.signal_command(self.layout, signal_name, self.needs_sudo), timeout=20).returncode == 0

    def fetch_capture(self, dest: Path, everything: bool = False) -> None:
        """Stream a tar of the capture over one channel (far faster than SFTP file by file), taken in by
        untar (regular files and directories under ``dest`` only); CaptureRefused names what was not."""
        dest.mkdir(parents=True, exist_ok=True)
        try:
            channel = self._client().get_transport().open_session(timeout=30)  # type: ignore[union-attr]
            channel.settimeout(self.options.command_timeout)  # seconds without a byte, not for the whole
            channel.exec_command(deploy.fetch_command(self.layout, self.needs_sudo, everything))
            try:
                untar.extract_capture(channel.makefile("rb"), dest)
                status = channel.recv_exit_status()
                err = channel.makefile_stderr("rb").read(4096).decode("utf-8", "replace").strip()
            finally:
                channel.close()
            if status == -1:
                raise TransportLost(f"{self.spec.label}: connection to {self.address} closed during the fetch")
        except untar.CaptureRefused as exc:
            raise untar.CaptureRefused(f"{self.spec.label}: {exc} (into {dest}); the capture is not trusted") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportLost(
                f"{self.spec.label}: fetching the capture from {self.address} failed ({exc or type(exc).__name__})"
            ) from None
        if status != 0:
            raise TransportLost(f"{self.spec.label}: tar failed on {self.address}: {err}")

    def log_tail(self, lines: int = 20) -> str:
        if self.workdir is None:
            return ""
        try:
            return self.exec(f"tail -n {int(lines)} {shlex.quote(self.layout.log)}", timeout=20).stdout
        except TransportLost:
            return ""

    def run_profiler(self, args: Sequence[str], timeout: float) -> CommandResult:
        return self.exec(deploy.profiler_command(self.layout, self.python, args, self.needs_sudo), timeout)

    def recover_capture(self, timeout: float) -> CommandResult:
        return self.run_profiler(["recover", self.layout.out, "--quiet"], timeout)

    def cleanup(self) -> None:
        if self.workdir is None:
            return
        # The profiler writes its capture on SIGINT; the command gives it time, then makes sure.
        done = self.exec(deploy.cleanup_command(self.layout, self.needs_sudo), timeout=90)
        if done.returncode != 0:
            raise ProfilerError(f"{self.spec.label}: cleanup on {self.address} failed: {done.stderr.strip()}")
        self.workdir = None


def _set_user_timeout(sock: object, seconds: float) -> None:
    if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
        except OSError:
            pass  # not TCP (a proxy command): the keepalives and command timeouts still bound a stall


def _local_user() -> str:
    import getpass

    return getpass.getuser()
