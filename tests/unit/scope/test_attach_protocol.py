"""The HotSpot attach client against a fake listener: request bytes, reply parsing, refusal."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.scope import attach


class FakeListener:
    """Plays the JVM's side of /tmp/.java_pid<pid> for this test process."""

    def __init__(self, path: Path, reply: bytes | None) -> None:
        self.path = path
        self.reply = reply
        self.requests: list[bytes] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            data = b""
            # a request is "1\0" + command + three arguments, each NUL-terminated
            while data.count(b"\0") < 5:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            self.requests.append(data)
            if self.reply is not None:
                conn.sendall(self.reply)

    def close(self) -> None:
        self.server.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def listener_path() -> Iterator[Path]:
    path = Path(f"/proc/{os.getpid()}/root/tmp/.java_pid{attach.namespace_pid(os.getpid())}")
    # A JVM killed with SIGKILL leaves its socket file behind; a later process given the same pid (this
    # test's) would then fail to bind: the stale file is not ours to keep.
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


def test_request_bytes_and_reply(listener_path: Path) -> None:
    fake = FakeListener(listener_path, b"0\nreturn code: 0\n")
    try:
        status, output = attach.attach_command(os.getpid(), "load", "/tmp/agent.so", "true", "")
    finally:
        fake.thread.join(5)
        fake.close()
    assert fake.requests == [b"1\0load\0/tmp/agent.so\0true\0\0"]
    assert (status, output) == (0, "return code: 0\n")


def test_missing_arguments_are_sent_empty(listener_path: Path) -> None:
    fake = FakeListener(listener_path, b"-1\njava.lang.IllegalArgumentException: Unknown diagnostic command\n")
    try:
        status, output = attach.attach_command(os.getpid(), "jcmd", "Compiler.perfmap")
    finally:
        fake.thread.join(5)
        fake.close()
    assert fake.requests == [b"1\0jcmd\0Compiler.perfmap\0\0\0"]
    assert status == -1 and "Unknown diagnostic command" in output


def test_a_silent_close_is_a_refusal(listener_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a JVM that closes without a word (what HotSpot does when the peer's uid does not match), also
    # when asked again as its own user (the attach child, a fake here: the real one needs root and is
    # tests/integration/test_attach_child.py)
    fake = FakeListener(listener_path, None)
    asked_again: list[int] = []

    def child_also_refused(pid: int, request: bytes, deadline: float) -> bytes:
        asked_again.append(pid)
        return b""

    monkeypatch.setattr(attach, "exchange_as_target", child_also_refused)
    monkeypatch.setattr(attach, "_owner_uid", lambda pid: 65534)
    try:
        with pytest.raises(attach.AttachError, match="refused"):
            attach.attach_command(os.getpid(), "jcmd", "VM.version")
    finally:
        fake.thread.join(5)
        fake.close()
    # THEN the target was asked again once, as its user, before the refusal
    assert asked_again == [os.getpid()]


def test_too_many_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        attach.attach_command(os.getpid(), "jcmd", "a", "b", "c", "d")


def test_a_stale_socket_of_a_dead_jvm_is_replaced(listener_path: Path) -> None:
    # GIVEN the socket file a killed JVM with this pid left behind (bound, nobody listening)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(listener_path))
    stale.close()
    # AND a process that, like HotSpot, starts its listener on SIGQUIT when the trigger file exists
    started: list[FakeListener] = []

    def on_sigquit(signum: int, frame: object) -> None:
        if not listener_path.exists():
            started.append(FakeListener(listener_path, b"0\nreturn code: 0\n"))

    previous = signal.signal(signal.SIGQUIT, on_sigquit)
    try:
        # WHEN an attach command is sent
        status, output = attach.attach_command(os.getpid(), "jcmd", "VM.version", timeout=5)
    finally:
        signal.signal(signal.SIGQUIT, previous)
        for fake in started:
            fake.thread.join(5)
            fake.close()
    # THEN the stale file was replaced by the listener the signal started, which got the request
    assert len(started) == 1 and started[0].requests == [b"1\0jcmd\0VM.version\0\0\0"]
    assert (status, output) == (0, "return code: 0\n")
