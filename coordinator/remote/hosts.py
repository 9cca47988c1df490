"""One interface to a cluster host: deploy the agent, start/poll/stop the profiler, fetch, clean up.

``LocalHost`` runs the profiler as a local subprocess (the bare ``localhost`` entry); ``SshHost``
(coordinator/remote/ssh.py) does the same over SSH; tests script behaviours with ``tests.fixtures.fake_host``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.remote import deploy
from coordinator.remote.cluster import HostSpec
from coordinator.remote.deploy import RemoteLayout
from profiler.capture.checkpoint import CHECKPOINT_DIR
from profiler.errors import ProfilerError
from profiler.files import procstat
from profiler.files.atomic import atomic_write_text
from profiler.run.options import RunOptions


def terminal_text(value: Any) -> str:
    """Remote text for a terminal table: one line, printable characters only."""
    text = " ".join(str(value if value is not None else "").split())
    return "".join(c if c.isprintable() else "?" for c in text)


def parse_doctor_output(text: str) -> tuple[Mapping[str, str], ...]:
    """The JSON list `profiler doctor --json` prints; ValueError when it is something else."""
    payload = json.loads(text)
    if not isinstance(payload, list):
        raise ValueError("not a JSON list")
    checks = []
    for item in payload:
        if not isinstance(item, dict) or "check" not in item or "status" not in item:
            raise ValueError("an entry lacks check/status")
        checks.append({key: terminal_text(item.get(key, "")) for key in ("check", "status", "detail", "fix")})
    return tuple(checks)


STATES = ("starting", "waiting", "sampling", "writing", "done", "failed")


def one_line(text: str, limit: int = 300) -> str:
    """A remote message made fit for one progress line and run.json: first line, bounded length."""
    first = text.replace("\\n", "\n").strip().splitlines()[0] if text.strip() else ""
    cleaned = "".join(c if c.isprintable() else " " for c in first).strip()
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


class TransportLost(ProfilerError):
    """The connection to a host dropped; the profiler there keeps running and we may reconnect."""

    exit_code = 7


@dataclass(frozen=True)
class ProfilerStatus:
    """The status file the host profiler rewrites about once a second."""

    state: str
    pid: int | None = None
    elapsed: float = 0.0
    remaining: float | None = None
    samples: int | None = None
    processes: int | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, text: str) -> ProfilerStatus | None:
        try:
            payload = json.loads(text)
        except json.JSONDecodeError:
            return None  # caught between writes on a filesystem without atomic rename: next poll
        if not isinstance(payload, dict) or payload.get("state") not in STATES:
            return None

        def number(key: str) -> Any:
            value = payload.get(key)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(
            state=str(payload["state"]),
            pid=number("pid"),
            elapsed=float(number("elapsed") or 0.0),
            remaining=number("remaining"),
            samples=number("samples"),
            processes=number("processes"),
            error=one_line(str(payload["error"])) if payload.get("error") else None,
        )

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class RunRequest:
    """What every host is asked to do: ``profiler run``'s options (profiler/run/options.py declares them),
    their paths the coordinator's own until each transport puts its host's (out, profile, known_spes, host
    label, status file, start)."""

    options: RunOptions
    start_at: float | None = None  # coordinator clock; the transport converts to the host clock
    fetch_all: bool = False  # fetch deploy.FETCH_SKIPPED's files too

    @property
    def duration(self) -> float:
        return self.options.duration

    @property
    def frequency(self) -> int:
        return self.options.frequency

    @property
    def profile(self) -> Path:
        return self.options.profile

    @property
    def known_spes(self) -> Path:
        return self.options.known_spes


def run_request(
    duration: float,
    profile: Path,
    known_spes: Path,
    start_at: float | None = None,
    fetch_all: bool = False,
    **options: Any,
) -> RunRequest:
    """A request with ``options`` of ``profiler run`` by field name (RunOptions); the rest are its defaults."""
    run_options = RunOptions(
        duration=float(duration), out=Path(), profile=Path(profile), known_spes=Path(known_spes), host="", **options
    )
    return RunRequest(run_options, start_at, fetch_all)


class HostTransport(ABC):
    """A host of the cluster, reached locally or over SSH. Methods block; call them from one thread."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.clock_offset = 0.0  # host clock minus coordinator clock
        self.round_trip = 0.0  # seconds of the quickest command round trip (measure_clock_offset)

    @property
    def address(self) -> str:
        return self.spec.address

    @abstractmethod
    def connect(self) -> None:
        """Reach and authenticate; raises HostUnreachable or HostKeyError."""

    def reconnect(self) -> None:
        self.close()
        self.connect()

    @abstractmethod
    def measure_clock_offset(self) -> float: ...

    @abstractmethod
    def deploy(self, profile: Path, known_spes: Path) -> None:
        """Create the private work directory and ship the agent and input files."""

    @property
    @abstractmethod
    def work_directory(self) -> str | None:
        """The private work directory on the host once deployed (None before, and after clean-up)."""

    @abstractmethod
    def attach(self, workdir: str) -> None:
        """Take over the work directory of an earlier run (``coordinator fetch``), after connect()."""

    @abstractmethod
    def start_profiler(self, request: RunRequest) -> None: ...

    def run_args(self, layout: RemoteLayout, request: RunRequest) -> list[str]:
        """``profiler run`` arguments for this host, the common start converted to the host's clock."""
        start_at = None if request.start_at is None else request.start_at + self.clock_offset
        return deploy.profiler_run_args(layout, self.spec.label, request.options, start_at)

    def confirm_start(self, start_at: float) -> None:
        """Bring the common start forward to ``start_at`` (coordinator clock) for a profiler that waits with
        its programs attached: its start file, in the host's clock. TransportLost when it could not be
        written; the profiler then starts at its --start-at, as without a start file."""
        self.write_start_file(deploy.start_file_text(start_at + self.clock_offset))

    @abstractmethod
    def write_start_file(self, text: str) -> None:
        """The start file (deploy.RemoteLayout.start), whole or not at all."""

    @abstractmethod
    def read_status(self) -> ProfilerStatus | None: ...

    @abstractmethod
    def profiler_alive(self) -> bool: ...

    @abstractmethod
    def signal_profiler(self, signal_name: str) -> bool:
        """Send INT/TERM/KILL; True when the profiler was alive to receive it."""

    @abstractmethod
    def fetch_capture(self, dest: Path, everything: bool = False) -> None:
        """Copy the capture directory into ``dest`` (created): what the analysis and the report read, or
        with ``everything`` deploy.FETCH_SKIPPED's files too."""

    @abstractmethod
    def log_tail(self, lines: int = 20) -> str: ...

    @abstractmethod
    def run_profiler(self, args: Sequence[str], timeout: float) -> CommandResult:
        """A short foreground ``profiler`` subcommand, e.g. ``doctor --json`` (needs ``deploy`` first)."""

    def recover_capture(self, timeout: float) -> CommandResult:
        """``profiler recover`` on the work directory's output (a profiler that died without writing its
        capture left a checkpoint journal there); the transports that deploy a profiler override it."""
        return CommandResult(1, "", "profiler recover: this transport cannot run it")

    @abstractmethod
    def cleanup(self) -> None:
        """Stop a still-running profiler and remove the work directory (best effort, idempotent)."""

    @abstractmethod
    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------- local


class LocalHost(HostTransport):
    """This machine: the profiler runs as ``sys.executable -m profiler`` in its own session."""

    def __init__(self, spec: HostSpec) -> None:
        super().__init__(spec)
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None

    @property
    def layout(self) -> deploy.RemoteLayout:
        assert self.workdir is not None, "deploy() first"
        return deploy.RemoteLayout(str(self.workdir))

    def _command_prefix(self) -> list[str]:
        prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
        return [*prefix, sys.executable, "-m", "profiler"]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        package_parent = str(deploy.package_dir().parent)
        env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def connect(self) -> None:
        return None

    def measure_clock_offset(self) -> float:
        self.clock_offset = 0.0
        return 0.0

    def deploy(self, profile: Path, known_spes: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{deploy.TEMP_PREFIX}."))
        shutil.copyfile(profile, self.layout.profile)
        shutil.copyfile(known_spes, self.layout.known_spes)

    @property
    def work_directory(self) -> str | None:
        return None if self.workdir is None else str(self.workdir)

    def attach(self, workdir: str) -> None:
        deploy.check_workdir(workdir)
        self.workdir = Path(workdir)

    def start_profiler(self, request: RunRequest) -> None:
        layout = self.layout
        args = self.run_args(layout, request)
        self._log_handle = open(layout.log, "wb")  # noqa: SIM115 - closed in cleanup()
        self.process = subprocess.Popen(
            [*self._command_prefix(), *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,  # a terminal's Ctrl-C reaches the coordinator only; it forwards SIGINT
        )

    def write_start_file(self, text: str) -> None:
        atomic_write_text(Path(self.layout.start), text)  # the profiler runs as root (sudo): 0600 is enough

    def read_status(self) -> ProfilerStatus | None:
        if self.workdir is None:  # not deployed, or cleaned up
            return None
        try:
            return ProfilerStatus.from_json(Path(self.layout.status).read_text(encoding="utf-8"))
        except OSError:
            return None

    def profiler_alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self._attached_pid() is not None

    def _attached_pid(self) -> int | None:
        """The profiler of an attached work directory (an earlier coordinator's child): the pid its status
        file names, while that process still runs with our status file on its command line."""
        status = self.read_status()
        if status is None or status.pid is None:
            return None
        proc = Path(f"/proc/{int(status.pid)}")
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            line = procstat.split_stat((proc / "stat").read_bytes())
        except OSError:
            return None
        if line is None:
            return None
        state = line.state
        # as deploy.alive_command: an empty command line (exec or exit under way) still counts until a zombie
        ours = self.layout.status.encode() in cmdline or (not cmdline and state not in ("Z", "X"))
        return int(status.pid) if ours else None

    def signal_profiler(self, signal_name: str) -> bool:
        if not self.profiler_alive():
            return False
        if self.process is None:
            pid = self._attached_pid()
            if pid is None:
                return False
            os.kill(pid, getattr(signal, f"SIG{signal_name}"))
            return True
        self.process.send_signal(getattr(signal, f"SIG{signal_name}"))
        return True

    def fetch_capture(self, dest: Path, everything: bool = False) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        if Path(self.layout.out).is_dir():  # absent when the profiler failed before writing anything
            skipped = () if everything else deploy.FETCH_SKIPPED
            ignore = shutil.ignore_patterns(CHECKPOINT_DIR, *skipped)  # the journal stays (see deploy.fetch_command)
            shutil.copytree(self.layout.out, dest, dirs_exist_ok=True, ignore=ignore)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.layout.log).read_text(encoding="utf-8", errors="replace")
        except (OSError, AssertionError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def run_profiler(self, args: Sequence[str], timeout: float) -> CommandResult:
        try:
            done = subprocess.run(
                [*self._command_prefix(), *args], capture_output=True, text=True, timeout=timeout, env=self._env()
            )
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"timed out after {timeout:g} s")
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def recover_capture(self, timeout: float) -> CommandResult:
        return self.run_profiler(["recover", self.layout.out, "--quiet"], timeout)

    def cleanup(self) -> None:
        if self.process is None and self.workdir is not None and self.signal_profiler("INT"):
            for _ in range(100):  # an attached profiler is not our child: poll its end
                if not self.profiler_alive():
                    break
                time.sleep(0.2)
            else:
                self.signal_profiler("KILL")
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def close(self) -> None:
        return None
