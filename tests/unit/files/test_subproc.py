"""profiler.files.subproc: a total deadline, the process group killed as a whole, a parent-death signal,
bounded output; the same for forked children."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiler.files import subproc

REPO = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def test_a_program_gives_its_output_and_status() -> None:
    done = subproc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_the_deadline_is_for_the_whole_run_and_the_group_dies(tmp_path: Path) -> None:
    # GIVEN a program that starts a grandchild and keeps printing a byte at a time (each read is quick)
    record = tmp_path / "grandchild"
    script = f"sleep 300 & echo $! > {record}; while :; do printf x; sleep 0.05; done"
    # WHEN it is run with a deadline of 1 s
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        subproc.run(["sh", "-c", script], 1.0)
    # THEN it ends at the deadline and the grandchild it started is killed with it
    assert time.monotonic() - began < 2.5
    assert _gone_within(int(record.read_text()), 2.0)


def test_what_a_finished_program_left_running_in_its_group_is_killed(tmp_path: Path) -> None:
    record = tmp_path / "left"
    done = subproc.run(["sh", "-c", f"sleep 300 > /dev/null 2>&1 & echo $! > {record}"], 10)
    assert done.returncode == 0
    assert _gone_within(int(record.read_text()), 2.0)


def test_output_is_capped() -> None:
    done = subproc.run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a"], 10, max_output=1000)
    assert done.returncode == 0 and done.stdout == "a" * 1000


def test_a_program_dies_with_the_agent(tmp_path: Path) -> None:
    # GIVEN an "agent" process running a long program through subproc
    record = tmp_path / "program"
    code = (
        "from profiler.files import subproc; "
        f"subproc.run(['sh', '-c', 'echo $$ > {record}; exec sleep 300'], 300)"
    )
    agent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 20
        while not (record.exists() and record.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        program = int(record.read_text())
        # WHEN the agent is killed without a word
        agent.kill()
    finally:
        agent.wait(10)
    # THEN its program is killed too (the parent-death signal)
    assert _gone_within(program, 5.0)


def test_a_forked_child_answers_and_fails_by_name() -> None:
    assert subproc.fork_call(lambda: b"hello", 5) == b"hello"

    def fail() -> bytes:
        raise PermissionError(errno.EACCES, "not allowed here")

    with pytest.raises(subproc.ChildError, match="not allowed here") as failed:
        subproc.fork_call(fail, 5)
    assert failed.value.errno == errno.EACCES


def test_a_forked_child_is_killed_at_its_deadline() -> None:
    def hang() -> bytes:
        os.write(1, b"")
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # even one that ignores its alarm
        time.sleep(300)
        return b""

    began = time.monotonic()
    with pytest.raises(subproc.ChildError, match="no answer within 1 s") as late:
        subproc.fork_call(hang, 1.0)
    assert late.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - began < 4.0


def test_a_forked_child_keeps_only_the_fds_it_is_given(tmp_path: Path) -> None:
    kept = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    dropped = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:

        def which_open() -> bytes:
            return " ".join(str(int(_fd_open(fd))) for fd in (kept, dropped)).encode()

        assert subproc.fork_call(which_open, 5, keep_fds=[kept]) == b"1 0"
        assert subproc.fork_call(which_open, 5) == b"1 1"
    finally:
        os.close(kept)
        os.close(dropped)


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
