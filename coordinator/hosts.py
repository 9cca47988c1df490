"""One interface to a cluster host: deploy the agent, start/poll/stop the profiler, fetch, clean up.

``LocalHost`` runs the profiler as a local subprocess (the bare ``localhost`` entry); ``SshHost``
(coordinator/ssh.py) does the same over SSH; ``FakeHost`` scripts behaviours for unit tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler import capture
from profiler.capture import DEFAULT_INTERVAL
from profiler.errors import ProfilerError

from . import deploy
from .cluster import HostSpec
from .deploy import RemoteLayout

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
class SamplingOptions:
    """How every host samples beyond duration and frequency (``profiler run`` options)."""

    interval: float = DEFAULT_INTERVAL  # seconds per timeline slice
    perf_map_refresh: float = 60.0  # seconds between Java perf-map refreshes; 0 = at the end only


@dataclass(frozen=True)
class RunRequest:
    """What every host is asked to do; the transport fills in its own paths."""

    duration: float
    frequency: int
    profile: Path
    known_spes: Path
    start_at: float | None = None  # coordinator clock; the transport converts to the host clock
    net: bool = False
    events: int | None = None
    pids: tuple[int, ...] = ()
    sampling: SamplingOptions = SamplingOptions()


class HostTransport(ABC):
    """A host of the cluster, reached locally or over SSH. Methods block; call them from one thread."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.clock_offset = 0.0  # host clock minus coordinator clock

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

    @abstractmethod
    def start_profiler(self, request: RunRequest) -> None: ...

    def run_args(self, layout: RemoteLayout, request: RunRequest) -> list[str]:
        """``profiler run`` arguments for this host, the common start converted to the host's clock."""
        return deploy.profiler_run_args(
            layout,
            self.spec.label,
            request.duration,
            request.frequency,
            None if request.start_at is None else request.start_at + self.clock_offset,
            net=request.net,
            events=request.events,
            pids=request.pids,
            interval=request.sampling.interval,
            perf_map_refresh=request.sampling.perf_map_refresh,
        )

    @abstractmethod
    def read_status(self) -> ProfilerStatus | None: ...

    @abstractmethod
    def profiler_alive(self) -> bool: ...

    @abstractmethod
    def signal_profiler(self, signal_name: str) -> bool:
        """Send INT/TERM/KILL; True when the profiler was alive to receive it."""

    @abstractmethod
    def fetch_capture(self, dest: Path) -> None:
        """Copy the capture directory into ``dest`` (created)."""

    @abstractmethod
    def log_tail(self, lines: int = 20) -> str: ...

    @abstractmethod
    def run_profiler(self, args: Sequence[str], timeout: float) -> CommandResult:
        """A short foreground ``profiler`` subcommand, e.g. ``doctor --json`` (needs ``deploy`` first)."""

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

    def read_status(self) -> ProfilerStatus | None:
        try:
            return ProfilerStatus.from_json(Path(self.layout.status).read_text(encoding="utf-8"))
        except OSError:
            return None

    def profiler_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_profiler(self, signal_name: str) -> bool:
        if not self.profiler_alive():
            return False
        assert self.process is not None
        self.process.send_signal(getattr(signal, f"SIG{signal_name}"))
        return True

    def fetch_capture(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        if Path(self.layout.out).is_dir():  # absent when the profiler failed before writing anything
            shutil.copytree(self.layout.out, dest, dirs_exist_ok=True)

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

    def cleanup(self) -> None:
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


# ----------------------------------------------------------------------------------------------- fake


@dataclass
class FakeScript:
    """How a FakeHost behaves; times are seconds of the fake's clock after start_profiler."""

    connect_error: Exception | None = None
    deploy_error: Exception | None = None
    clock_offset: float = 0.0
    compile_seconds: float = 0.0
    lose_connection_at: float | None = None  # one read_status raises TransportLost after this time
    reconnect_failures: int = 0
    crash_at: float | None = None  # the profiler dies without "done"
    samples_per_second: int = 100
    fetch_error: Exception | None = None


@dataclass
class FakeHost(HostTransport):
    """A scripted host for unit tests of the orchestration: no processes, no network."""

    fake_spec: HostSpec
    script: FakeScript = field(default_factory=FakeScript)
    clock: Callable[[], float] = time.time
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.fake_spec)
        self._started: float | None = None
        self._request: RunRequest | None = None
        self._stopped_at: float | None = None
        self._lost = False
        self._reconnects_left = self.script.reconnect_failures
        self._connected = False
        self._lock = threading.Lock()
        self.cleaned = False

    def connect(self) -> None:
        self.calls.append("connect")
        if self.script.connect_error is not None:
            raise self.script.connect_error
        if self._lost and self._reconnects_left > 0:
            self._reconnects_left -= 1
            raise TransportLost(f"{self.spec.label}: connection refused (fake)")
        self._connected = True

    def measure_clock_offset(self) -> float:
        self.clock_offset = self.script.clock_offset
        return self.clock_offset

    def deploy(self, profile: Path, known_spes: Path) -> None:
        self.calls.append("deploy")
        if self.script.deploy_error is not None:
            raise self.script.deploy_error

    def start_profiler(self, request: RunRequest) -> None:
        self.calls.append("start")
        self._started = self.clock()
        self._request = request

    def _window(self) -> tuple[float, float]:
        assert self._request is not None and self._started is not None
        begin = max(self._started + self.script.compile_seconds, self._request.start_at or 0.0)
        end = begin + self._request.duration
        if self._stopped_at is not None:
            end = min(end, max(begin, self._stopped_at))
        return begin, end

    def _state(self) -> ProfilerStatus:
        now = self.clock()
        assert self._started is not None
        if self.script.crash_at is not None and now - self._started >= self.script.crash_at:
            return ProfilerStatus("failed", error="crashed (fake)")
        begin, end = self._window()
        if self._stopped_at is not None and now >= self._stopped_at:
            return ProfilerStatus("done", elapsed=end - begin, remaining=0.0)
        if now < begin:
            return ProfilerStatus("waiting" if now >= self._started + self.script.compile_seconds else "starting")
        if now < end:
            elapsed = now - begin
            return ProfilerStatus(
                "sampling",
                elapsed=elapsed,
                remaining=end - now,
                samples=int(elapsed * self.script.samples_per_second),
            )
        return ProfilerStatus("done", elapsed=end - begin, remaining=0.0)

    def read_status(self) -> ProfilerStatus | None:
        if not self._connected:
            raise TransportLost(f"{self.spec.label}: not connected")
        lose = self.script.lose_connection_at
        if lose is not None and not self._lost and self._started is not None and self.clock() - self._started >= lose:
            self._lost = True
            self._connected = False
            raise TransportLost(f"{self.spec.label}: connection lost (fake)")
        return self._state()

    def profiler_alive(self) -> bool:
        return self._started is not None and not self._state().finished

    def signal_profiler(self, signal_name: str) -> bool:
        self.calls.append(f"signal {signal_name}")
        alive = self.profiler_alive()
        if alive and self._stopped_at is None:
            self._stopped_at = self.clock()
        return alive

    def fetch_capture(self, dest: Path) -> None:
        self.calls.append("fetch")
        if self.script.fetch_error is not None:
            raise self.script.fetch_error
        begin, end = self._window()
        capture.write_meta(
            dest,
            capture.RunMeta(
                host=self.spec.label,
                hostname=self.spec.hostname,
                kernel="fake",
                profiler_version="fake",
                frequency=self._request.frequency if self._request else 99,
                duration_requested=self._request.duration if self._request else 0.0,
                start_time=begin + self.script.clock_offset,
                end_time=end + self.script.clock_offset,
                stopped_by="signal" if self._stopped_at is not None else "duration",
                cycles_source="estimated",
                exec_watch="polling",
            ),
        )

    def log_tail(self, lines: int = 20) -> str:
        return "fake log"

    def run_profiler(self, args: Sequence[str], timeout: float) -> CommandResult:
        self.calls.append("profiler " + " ".join(args))
        payload = [{"check": "fake", "status": "ok", "detail": self.spec.label, "fix": ""}]
        return CommandResult(0, json.dumps(payload), "")

    def cleanup(self) -> None:
        self.calls.append("cleanup")
        self.cleaned = True

    def close(self) -> None:
        self._connected = False
