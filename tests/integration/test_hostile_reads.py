"""The scope's reads of a tenant's process (issue 46's smaller holes), on real processes of another user:
the Spark properties file a tenant names, SIGQUIT through a pidfd, the owner of a setuid program."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.files import safeio
from profiler.scope import attach
from profiler.scope.analyzer import LiveProcSource
from tests.fixtures.privileges import requires

pytestmark = requires("root", "setpriv")


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def tenant() -> Iterator[subprocess.Popen[bytes]]:
    """A process of ``nobody`` that sleeps (its cwd and root are the host's)."""
    uid, gid = _nobody()
    # a child inherits ignored and blocked signals: the tenant starts with SIGQUIT's default whatever the
    # suite's process did to its own before (the SIGQUIT test below needs sleep to die of it)
    ignored = signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGQUIT})
    try:
        process = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sleep", "60"], stdin=subprocess.DEVNULL
        )
    finally:
        signal.signal(signal.SIGQUIT, ignored)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        deadline = time.monotonic() + 10  # setpriv switches user, then execs sleep
        while not Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(b"sleep\0"):
            assert time.monotonic() < deadline, "the tenant never ran sleep"
            time.sleep(0.01)
        yield process
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture
def area() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="props-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _wait_for_user(pid: int, uid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.stat(f"/proc/{pid}").st_uid == uid:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never became uid {uid}")


def test_a_properties_file_is_read_only_if_the_tenant_owns_it(tenant: subprocess.Popen[bytes], area: Path) -> None:
    # GIVEN a tenant naming a root-owned file as its --properties-file (a one-bit oracle with read side effects)
    uid, gid = _nobody()
    _wait_for_user(tenant.pid, uid)
    path = area / "spark-defaults.conf"
    path.write_text("spark.master yarn\n")
    os.chmod(path, 0o644)
    source = LiveProcSource()
    # WHEN the scope reads it, THEN it is refused; once the tenant owns it, it is read
    assert source.read_text(tenant.pid, str(path)) is None
    assert any("not by the process's user" in warning for warning in safeio.take_warnings())
    os.chown(path, uid, gid)
    assert source.read_text(tenant.pid, str(path)) == "spark.master yarn\n"
    source.close()


def test_the_snapshot_names_the_real_user(tenant: subprocess.Popen[bytes]) -> None:
    uid, _ = _nobody()
    _wait_for_user(tenant.pid, uid)
    snap = LiveProcSource().snapshot(tenant.pid)
    assert snap is not None and snap.user == "nobody" and snap.cmdline == ("sleep", "60")


def test_sigquit_goes_to_the_process_the_pidfd_names(tenant: subprocess.Popen[bytes]) -> None:
    pidfd = os.pidfd_open(tenant.pid)
    try:
        attach._send_sigquit(tenant.pid, pidfd)
        try:
            assert tenant.wait(10) == -signal.SIGQUIT  # sleep has no handler: SIGQUIT ends it
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{tenant.pid}/status").read_text()
            raise AssertionError([x for x in status.splitlines() if x.startswith(("State", "Sig", "Shd"))]) from None
        # the process is gone (its pid free for reuse): the same pidfd signals nobody
        with pytest.raises(attach.AttachError, match="exited before SIGQUIT"):
            attach._send_sigquit(tenant.pid, pidfd)
    finally:
        os.close(pidfd)


def test_the_pidfd_is_opened_before_the_sigcgt_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a JVM whose SigCgt check passes but which exits (its pid reused) before the signal
    order: list[str] = []
    monkeypatch.setattr(attach, "_open_socket", lambda pid: None)
    monkeypatch.setattr(attach, "_open_pidfd", lambda pid: order.append("pidfd") or -1)
    monkeypatch.setattr(attach, "_catches_sigquit", lambda pid: order.append("sigcgt") or True)
    monkeypatch.setattr(attach, "_create_trigger", lambda pid: None)

    def exited(pid: int, pidfd: int | None) -> None:
        order.append(f"send {pidfd}")
        raise attach.AttachError(f"pid {pid}: the process exited before SIGQUIT; not signalled")

    monkeypatch.setattr(attach, "_send_sigquit", exited)
    monkeypatch.setattr(os, "close", lambda fd: order.append(f"close {fd}"))
    # WHEN the listener is started, THEN the signal goes through the pidfd opened first, and nothing else
    with pytest.raises(attach.AttachError, match="exited before SIGQUIT"):
        attach._start_attach_listener_alone(12345, 1.0)
    assert order == ["pidfd", "sigcgt", "send -1", "close -1"]


def test_a_setuid_program_is_nobodys_jvm(tmp_path: Path) -> None:
    # GIVEN a setuid-root program run by nobody (real uid nobody, effective root) with a java-looking argv
    uid, gid = _nobody()
    area = Path(tempfile.mkdtemp(prefix="setuid-", dir="/var/tmp"))
    try:
        os.chmod(area, 0o755)
        program = area / "java"
        shutil.copy2("/bin/sleep", program)
        os.chmod(program, 0o4755)
        process = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", str(program), "60"],
            stdin=subprocess.DEVNULL,
        )
        try:
            _wait_for_exe(process.pid, str(program))
            # WHEN its owner is asked, THEN it is refused: neither root nor nobody
            with pytest.raises(safeio.UnsafeFile, match="a setuid program"):
                safeio.owner(process.pid)
        finally:
            process.kill()
            process.wait(10)
    finally:
        shutil.rmtree(area, ignore_errors=True)
    safeio.take_warnings()


def _wait_for_exe(pid: int, path: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{pid}/exe") == path:
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never ran {path}")
