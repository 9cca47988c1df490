"""profiler/files/safeio.py's work as a target's user: a forked child that switched to another uid and gid
(root's right to ``setuid``), files created there never through a planted link."""

from __future__ import annotations

import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from profiler.files import safeio
from tests.fixtures.privileges import requires

PID = os.getpid()
pytestmark = requires("root")


def test_run_as_switches_user_and_keeps_the_parent_as_it_was() -> None:
    nobody = pwd.getpwnam("nobody")
    answer = safeio.run_as(nobody.pw_uid, nobody.pw_gid, lambda: f"{os.getuid()} {os.getgid()}".encode(), 5)
    assert answer == f"{nobody.pw_uid} {nobody.pw_gid}".encode()
    assert os.getuid() == 0


def test_run_as_reports_the_childs_error_and_kills_a_hung_child() -> None:
    def fail() -> bytes:
        raise OSError("no such thing")

    with pytest.raises(safeio.TargetError, match="no such thing"):
        safeio.run_as(0, 0, fail, 5)
    began = time.monotonic()
    with pytest.raises(safeio.TargetError, match="no answer"):
        safeio.run_as(0, 0, lambda: time.sleep(60) or b"", 1)
    assert time.monotonic() - began < 5


def test_create_as_target_never_follows_a_planted_link(tmp_path: Path) -> None:
    # GIVEN a root-owned 0600 file and a link to it planted where the trigger file goes (cwd)
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        (tmp_path / ".attach_pid1").symlink_to(secret)
        # WHEN the file is created as this process's user, then a fresh one
        with pytest.raises(safeio.TargetError, match="File exists"):
            safeio.create_as_target(PID, "cwd", ".attach_pid1", b"")
        shown = safeio.create_as_target(PID, "cwd", ".attach_pid2", b"hello", mode=0o600)
        created_mode = stat.S_IMODE((tmp_path / ".attach_pid2").stat().st_mode)
        safeio.remove_as_target(PID, "cwd", ".attach_pid2")
    finally:
        os.chdir(previous)
    # THEN the root file kept owner, mode and content; the new file exists, 0600
    info = secret.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode), secret.read_text()) == (0, 0o600, "root only")
    assert shown == f"/proc/{PID}/cwd/.attach_pid2"
    assert created_mode == 0o600
    assert not (tmp_path / ".attach_pid2").exists()
