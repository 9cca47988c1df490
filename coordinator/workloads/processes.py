"""Child processes of the demo workloads (local Spark and Flink clusters, Redis, spark-submit): start
them in their own process group tied to our life, find their process trees, stop them for sure.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

import psutil

_PR_SET_PDEATHSIG = 1
_Self = TypeVar("_Self", bound="Lifecycle")
_T = TypeVar("_T")


class Lifecycle(ABC):
    """A context manager over ``start()`` and ``stop()``: what every local workload component is."""

    @abstractmethod
    def start(self) -> object: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self: _Self) -> _Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class ScratchLifecycle(Lifecycle):
    """A component with a scratch directory for its logs and files (the Spark and Flink clusters, the
    Kafka broker): made by ``start()``, removed by ``stop()`` when it is the component's own."""

    not_started: ClassVar[type[Exception]] = RuntimeError  # raised by tmp_dir before start()

    _tmp: Path | None = field(init=False, default=None)
    _owns_tmp: bool = field(init=False, default=False)

    @property
    def tmp_dir(self) -> Path:
        if self._tmp is None:
            raise self.not_started(f"{type(self).__name__}: not started; call start() or use it as a context manager")
        return self._tmp

    def make_scratch(self, log_dir: Path | None, prefix: str) -> None:
        self._tmp, self._owns_tmp = scratch_dir(log_dir, prefix)

    def release_scratch(self, keep: bool) -> None:
        """The end of ``stop()``: see the function of the same name."""
        self._tmp = release_scratch(self.stop, self._tmp, self._owns_tmp, keep)


def scratch_dir(log_dir: Path | None, prefix: str) -> tuple[Path, bool]:
    """The directory for a component's logs and files: ``log_dir`` (created) or a new temporary one;
    the flag says whether it is ours to delete at the end."""
    if log_dir is not None:
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


def release_scratch(stop: Callable[[], None], scratch: Path | None, owned: bool, keep: bool) -> Path | None:
    """The end of a cluster's stop(): no stop() at exit any more, and its scratch directory removed when
    it is ours and not to be kept. Returns what is left of it (None once removed)."""
    with contextlib.suppress(ValueError):
        atexit.unregister(stop)
    if owned and scratch is not None and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
        return None
    return scratch


def poll_until(
    ready: Callable[[], _T | None],
    timeout: float,
    timed_out: Callable[[], Exception],
    check: Callable[[], None] = lambda: None,
    every: float = 0.3,
) -> _T:
    """``ready()`` every ``every`` seconds until it returns something other than None, and that. ``check()``
    raises when a process waited on has died; after ``timeout`` seconds ``timed_out()`` is raised (built
    then, so its message can say how far the wait got)."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        value = ready()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise timed_out()
        time.sleep(every)


def spawn_logged(argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log_path``, in its own session, SIGTERM'd
    when we die (``die_with_parent``)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only setsid and prctl, no locks
        )


def stop_in_order(*steps: Callable[[], object] | None) -> None:
    """Run each step (None: nothing to stop) even when one before failed; a failure is raised after the
    steps that follow it ran (a later failure chains the earlier one as its context, as try/finally)."""
    if not steps:
        return
    first, *rest = steps
    try:
        if first is not None:
            first()
    finally:
        stop_in_order(*rest)


def stop_all(groups: Sequence[subprocess.Popen[bytes]], pids: Sequence[int], grace: float) -> None:
    """Terminate each process group in ``groups`` (in order), then kill whatever of ``pids`` (taken
    before: the whole process tree) left its group; wait for all of them."""
    leftovers: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            leftovers.append(psutil.Process(pid))
    for process in groups:
        terminate_group(process, grace)
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.kill()
    psutil.wait_procs(leftovers, timeout=5)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (Spark retries the next port if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """Run in the child before exec: new session (own process group) and SIGTERM when we die.

    The death signal keeps a killed test runner from leaving JVMs behind; a Worker's shutdown hook
    then stops its executors. It fires when the *thread* that started the child exits, so start
    clusters from a long-lived thread (normally the main thread).
    """
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def log_tail(path: Path, lines: int = 3) -> str:
    """The last non-empty lines of a log, joined on one line (error messages are one line)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) or "(empty log)"


# "java.lang.OutOfMemoryError: Java heap space", "TypeError: ...", "org.apache...SparkException: ..."
_ERROR_LINE = re.compile(r"(?:^|\s)(?:[\w$]+\.)*[\w$]*(?:Error|Exception)(?::\s|$)")


def first_error_line(logs: Sequence[Path]) -> str | None:
    """The first line of the first log that names an error or exception class (the cause, usually;
    the lines after it are the consequences and the shutdown), or None."""
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if _ERROR_LINE.search(line):
                return line.strip()
    return None


def live_process_tree(roots: Sequence[int]) -> list[int]:
    """The live (non-zombie) processes among ``roots`` and all their descendants."""
    pids: set[int] = set()
    for root in roots:
        try:
            proc = psutil.Process(root)
            if proc.status() != psutil.STATUS_ZOMBIE:
                pids.add(root)
            pids.update(c.pid for c in proc.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            continue
    return sorted(pids)


def terminate_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace`` seconds, and reap the leader."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # Children may outlive the leader (a Python driver, an executor): kill whatever is left in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)


