"""Every process the agent starts, by one rule: a total deadline (not one per read), its own process group
killed as a whole (``killpg`` while the leader is still unreaped, so the group id cannot have been reused)
so nothing it started survives, and a parent-death signal so nothing outlives the agent either.

``run`` starts a program (output capped); ``fork_call`` runs a Python function in a forked child (the
credential switches of safeio, the attach child that enters a target's namespaces).

May import: the standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

PR_SET_PDEATHSIG = 1
OUTPUT_MAX_BYTES = 1 << 20  # per stream of a program: the agent runs only make (the JVMTI agent's build)
CHILD_ANSWER_MAX_BYTES = 64 << 20  # a forked child's answer (an attach reply is capped at 8 MiB before it)

_libc = ctypes.CDLL(None, use_errno=True)


class ChildError(OSError):
    """A forked child failed (its own error, or no answer before the deadline)."""

    def __str__(self) -> str:
        return str(self.strerror)


def die_with_parent(parent: int) -> None:
    """In a child: SIGKILL when ``parent`` dies; exit now if it already has. Call it after any change of
    credentials: the kernel clears the parent-death signal when they change."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def kill_group(leader: int) -> None:
    """SIGKILL the process group of ``leader`` (a child not reaped yet), whatever is left of it."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    argv: Sequence[str],
    timeout: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    preexec: Callable[[], None] | None = None,
    max_output: int = OUTPUT_MAX_BYTES,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group with a parent-death signal, for at most ``timeout`` seconds
    in all; the group is killed at the end (subprocess.TimeoutExpired when the deadline came first).
    stdout and stderr are kept up to ``max_output`` bytes each, the rest read and dropped."""
    parent = os.getpid()

    def setup() -> None:
        if preexec is not None:
            preexec()
        die_with_parent(parent)

    deadline = time.monotonic() + timeout
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
        process_group=0, preexec_fn=setup,  # noqa: PLW1509 - prctl has no Popen parameter; setup takes no lock
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    kept = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    try:
        finished = _read_until(kept, deadline, max_output) and _exited(process.pid, deadline)
        kill_group(process.pid)  # the leader is not reaped yet: its group id is still ours
        process.wait()
    finally:
        process.stdout.close()
        process.stderr.close()
    out, err = (bytes(kept[fd]).decode("utf-8", "replace") for fd in kept)
    if not finished:
        raise subprocess.TimeoutExpired(list(argv), timeout, out, err)
    return subprocess.CompletedProcess(list(argv), process.returncode, out, err)


def _read_until(buffers: dict[int, bytearray], deadline: float, max_output: int) -> bool:
    """Read every fd of ``buffers`` to its end; False when the deadline came first."""
    poller = select.poll()  # not select(): the agent holds thousands of fds (perf events per thread)
    for fd in buffers:
        poller.register(fd, select.POLLIN)
    open_fds = set(buffers)
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for fd, _ in poller.poll(min(remaining, 0.5) * 1000):
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif len(buffers[fd]) < max_output:
                buffers[fd] += chunk[: max_output - len(buffers[fd])]
    return True


def _exited(pid: int, deadline: float) -> bool:
    """Whether ``pid`` exits before the deadline; it is left unreaped (WNOWAIT) for kill_group."""
    delay = 0.005
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    return False


def fork_call(
    work: Callable[[], bytes],
    timeout: float,
    setup: Callable[[], None] | None = None,
    keep_fds: Sequence[int] | None = None,
    max_bytes: int = CHILD_ANSWER_MAX_BYTES,
) -> bytes:
    """``work()`` in a forked child (its own process group, a parent-death signal, an alarm at the
    deadline), after ``setup()`` (a switch of credentials or namespaces); its bytes come back through a
    pipe. With ``keep_fds``, every other inherited fd is closed before ``setup``. The parent's own state
    never changes; the child's group is killed at the deadline. ChildError on failure."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the parent's handler must not catch it
            signal.alarm(max(1, int(timeout) + 1))
            if keep_fds is not None:
                _close_all_but([write_fd, *keep_fds])
            if setup is not None:
                setup()
            die_with_parent(parent)
            payload, code = b"ok\n" + work(), 0
        except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
            payload = f"error\n{getattr(exc, 'errno', None) or 0}\n{exc}".encode()
        try:
            write_all(write_fd, payload)
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        os.setpgid(child, child)  # also from here: the group exists before any kill_group
    except OSError:
        pass
    answer, complete = _collect(read_fd, child, timeout, max_bytes)
    if not complete:
        raise ChildError(errno.ETIMEDOUT, f"no answer within {timeout:g} s (or one over {max_bytes} bytes)")
    head, _, body = answer.partition(b"\n")
    if head != b"ok":
        number, _, detail = body.decode("utf-8", "replace").partition("\n")
        failure = int(number) if number.isdigit() and int(number) else errno.EPERM
        raise ChildError(failure, detail.strip()[:300] or f"no answer within {timeout:g} s")
    return body


def _close_all_but(keep: Sequence[int]) -> None:
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def write_all(fd: int, content: bytes) -> None:
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]


def _collect(read_fd: int, child: int, timeout: float, max_bytes: int) -> tuple[bytes, bool]:
    """(the child's answer, whether it is whole): read until it closes the pipe, the deadline or
    ``max_bytes``; then its group is killed (nothing of it stays) and it is reaped."""
    chunks: list[bytes] = []
    total = 0
    complete = False
    deadline = time.monotonic() + timeout + 1
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    try:
        while total <= max_bytes and (remaining := deadline - time.monotonic()) > 0:
            if poller.poll(min(remaining, 0.5) * 1000):
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    complete = True
                    break
                chunks.append(chunk)
                total += len(chunk)
    finally:
        os.close(read_fd)
        kill_group(child)
        os.waitpid(child, 0)
    return b"".join(chunks), complete
