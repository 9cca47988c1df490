"""A private redis-server on a free loopback port, and a minimal RESP client (no extra dependency)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from coordinator.workloads.processes import Lifecycle, die_with_parent, free_port
from profiler.errors import CapabilityError, ProfilerError

RespValue = Union[str, int, bytes, None, list["RespValue"]]


class RedisError(ProfilerError):
    """redis-server did not start, or answered a command with an error."""

    exit_code = 11


def redis_server_binary() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )


def encode_command(*args: str | bytes | int) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


class RespClient:
    """Blocking RESP2 client over one TCP connection; enough for PING, HSET, HGETALL, SCAN, DBSIZE."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._reader = self._sock.makefile("rb")

    def close(self) -> None:
        self._reader.close()
        self._sock.close()

    def __enter__(self) -> RespClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> RespValue:
        self._sock.sendall(encode_command(*args))
        return self._read()

    def pipeline(self, commands: Sequence[Sequence[str | bytes | int]]) -> list[RespValue]:
        """Several commands in one write, then their replies in order: one round trip, not one per command."""
        self._sock.sendall(b"".join(encode_command(*args) for args in commands))
        return [self._read() for _ in commands]

    def _read(self) -> RespValue:
        line = self._reader.readline()
        if not line.endswith(b"\r\n"):
            raise RedisError("redis: connection closed in the middle of a reply; is redis-server still running?")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body.decode()
        if kind == b"-":
            raise RedisError(f"redis answered an error: {body.decode(errors='replace')}")
        if kind == b":":
            return int(body)
        if kind == b"$":
            length = int(body)
            if length < 0:
                return None
            data = self._reader.read(length + 2)
            return data[:-2]
        if kind == b"*":
            count = int(body)
            return None if count < 0 else [self._read() for _ in range(count)]
        raise RedisError(f"redis: unexpected reply type {kind!r}")

    def keys(self, pattern: str) -> list[str]:
        """All keys matching ``pattern``, by SCAN (never KEYS on a busy server)."""
        found: list[str] = []
        cursor = "0"
        while True:
            reply = self.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            assert isinstance(reply, list) and len(reply) == 2
            cursor_raw, batch = reply
            assert isinstance(cursor_raw, bytes) and isinstance(batch, list)
            found.extend(k.decode() for k in batch if isinstance(k, bytes))
            cursor = cursor_raw.decode()
            if cursor == "0":
                return found

    def hgetall(self, key: str) -> dict[str, str]:
        reply = self.command("HGETALL", key)
        assert isinstance(reply, list)
        items = [v.decode() if isinstance(v, bytes) else str(v) for v in reply]
        return dict(zip(items[0::2], items[1::2]))


@dataclass
class RedisServer(Lifecycle):
    """Context manager: ``redis-server`` on 127.0.0.1 and a free port, no persistence, data in a tmp dir."""

    port: int = 0
    process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _dir: Path | None = field(init=False, default=None)

    def start(self, timeout: float = 20.0) -> RedisServer:
        binary = redis_server_binary()
        if binary is None:
            raise CapabilityError("redis-server not found; install Debian's redis-server (scripts/setup.sh does)")
        self.port = self.port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="ysb-redis-"))
        with open(self._dir / "redis.log", "wb") as log:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self._dir), "--protected-mode", "yes", "--daemonize", "no"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - own session, SIGTERM when we die
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with RespClient("127.0.0.1", self.port, timeout=2) as client:
                    if client.command("PING") == "PONG":
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                log_tail = (self._dir / "redis.log").read_text(errors="replace").strip().splitlines()[-1:]
                self.stop()
                raise RedisError(f"redis-server on port {self.port} did not start: {' '.join(log_tail) or 'no log'}")
            time.sleep(0.1)

    def client(self) -> RespClient:
        return RespClient("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.process is not None:
            process, self.process = self.process, None
            try:
                if process.poll() is None:
                    process.terminate()
                    process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if self._dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir)
            self._dir = None
