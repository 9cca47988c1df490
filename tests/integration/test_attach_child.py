"""The attach request asked again from inside a target's namespaces, as its user: a stand-in for a JDK 8
JVM (answers only its own user, closes on root without a word) in its own pid, mount, net, ipc and uts
namespaces as ``nobody``; the child that asks has entered all of them, has no capability, and no program
of the target's runs."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from profiler.scope import attach
from tests.fixtures.privileges import SYSTEM_PYTHON, requires

# pid_for_children: setns moves a process's children into a pid namespace, never the process itself (it
# starts none; the JVM's pid it checks its peer against is the host's)
NAMESPACES = ("mnt", "pid_for_children", "net", "ipc", "uts")

pytestmark = requires("root", "unshare", "setpriv", "system-python")

# Plays HotSpot 8's listener: /tmp/.java_pid<its pid>, a peer of another uid gets a silent close; its own
# user gets "0\n" and the peer's uid/gid once /tmp/go exists (the test looks at the asking child meanwhile).
LISTENER = r"""
import os, socket, struct, sys, time
path = f"/tmp/.java_pid{os.getpid()}"
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(4)
print("READY", flush=True)
while True:
    conn, _ = server.accept()
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    print(f"PEER {uid} {gid}", flush=True)
    if uid != os.geteuid():
        conn.close()
        continue
    data = b""
    while data.count(b"\0") < 5:
        data += conn.recv(4096)
    print("ASKED", flush=True)
    for _ in range(200):
        if os.path.exists("/tmp/go"):
            break
        time.sleep(0.05)
    conn.sendall(b"0\npeer " + f"{uid} {gid}".encode() + b" asked " + data.split(b"\0")[2] + b"\n")
    conn.close()
"""


@dataclass
class Target:
    process: subprocess.Popen[str]
    pid: int  # the listener, as the host sees it
    others: frozenset[int]  # children of this process before the test (the suite's, not the attach's)

    @property
    def tmp(self) -> Path:
        return Path(f"/proc/{self.pid}/root/tmp")


@pytest.fixture
def target() -> Iterator[Target]:
    nobody = pwd.getpwnam("nobody")
    script = (
        "mount -t tmpfs -o mode=1777 target-tmp /tmp && echo target-uts > /proc/sys/kernel/hostname && "
        f"exec setpriv --reuid={nobody.pw_uid} --regid={nobody.pw_gid} --clear-groups {SYSTEM_PYTHON} -c '{LISTENER}'"
    )
    process = subprocess.Popen(
        ["unshare", "--fork", "--pid", "--mount", "--mount-proc", "--net", "--ipc", "--uts", "--kill-child",
         "sh", "-c", script],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True, cwd="/",
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "READY"
        listener = next(c for c in psutil.Process(process.pid).children(recursive=True) if c.uids().real != 0)
        others = frozenset(child.pid for child in psutil.Process().children())
        yield Target(process, listener.pid, others)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def _ns(pid: int, name: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{name}")


def _ours(target: Target) -> list[psutil.Process]:
    """This process's children but the target's unshare and those the test found: the attach children."""
    return [child for child in psutil.Process().children() if child.pid not in target.others]


def _inode(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


def _look(pid: int) -> dict[str, object]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        "ns": {name: _ns(pid, name) for name in NAMESPACES},
        "status": dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line),
        "exe": os.readlink(f"/proc/{pid}/exe"),
        "tmp": _inode(f"/proc/{pid}/root/tmp"),
    }


def test_a_jvm_that_refuses_root_is_asked_from_inside_its_namespaces_as_its_user(target: Target) -> None:
    nobody = pwd.getpwnam("nobody")
    answers: list[tuple[int, str]] = []
    # WHEN root asks it (the stand-in closes on root without a word)
    asking = threading.Thread(
        target=lambda: answers.append(attach.attach_command(target.pid, "jcmd", "VM.version", timeout=20)),
        daemon=True,
    )
    asking.start()
    try:
        # (the stand-in holds the second request until the test has looked at the child that sent it)
        assert target.process.stdout is not None
        while (line := target.process.stdout.readline().strip()) != "ASKED":
            assert line.startswith("PEER"), line
        children = _ours(target)
        assert len(children) == 1, children
        found = _look(children[0].pid)
    finally:
        (target.tmp / "go").touch()
        asking.join(20)
    (status, output), = answers
    # THEN the second request came from its own user and got the answer
    assert (status, output) == (0, f"peer {nobody.pw_uid} {nobody.pw_gid} asked VM.version\n")
    # AND the asking child was in every one of the target's namespaces, without a capability, with
    # no_new_privs, as nobody with no supplementary group, and it ran no program (our own executable)
    assert found["ns"] == {name: _ns(target.pid, name) for name in NAMESPACES}
    assert all(_ns(target.pid, name) != _ns(os.getpid(), name) for name in NAMESPACES)
    assert found["tmp"] == _inode(str(target.tmp)) != _inode("/tmp")  # its /tmp: through its root and mounts
    status_of = found["status"]
    assert isinstance(status_of, dict)
    assert status_of["Uid"].split() == [str(nobody.pw_uid)] * 4 and status_of["Gid"].split()[0] == str(nobody.pw_gid)
    assert status_of["Groups"].strip() == ""
    assert int(status_of["CapEff"], 16) == 0 and int(status_of["CapPrm"], 16) == 0
    assert status_of["NoNewPrivs"].strip() == "1"
    assert found["exe"] == os.readlink("/proc/self/exe")
    # AND nothing of the child is left
    assert not _ours(target)


def test_a_link_at_the_socket_is_refused_inside_too(
    target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the target's socket moved aside and a link planted in its place (by the target's user) after
    # the host's own check of the socket passed
    socket_file = target.tmp / f".java_pid{attach.namespace_pid(target.pid)}"
    os.rename(socket_file, target.tmp / "elsewhere")
    socket_file.symlink_to("/tmp/elsewhere")
    monkeypatch.setattr(attach, "_start_attach_listener", lambda pid, timeout: os.open("/", os.O_PATH))
    # WHEN the child asks THEN it refuses the link by name
    request = b"1\0jcmd\0VM.version\0\0\0"
    with pytest.raises(attach.AttachError, match="a symbolic link, not the JVM's socket"):
        attach.exchange_as_target(target.pid, request, time.monotonic() + 10)


def test_a_target_that_never_answers_costs_the_deadline_and_leaves_nothing(target: Target) -> None:
    # GIVEN the target stopped (its socket accepts, nobody answers)
    os.kill(target.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(attach.AttachError):
            attach.exchange_as_target(target.pid, b"1\0jcmd\0VM.version\0\0\0", time.monotonic() + 1.5)
        assert time.monotonic() - began < 4.0
    finally:
        os.kill(target.pid, signal.SIGCONT)
    assert not _ours(target)
