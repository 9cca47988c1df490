"""The HTTP client of the engines' REST APIs (a Spark driver's UI, a Flink JobManager): one GET, a total
deadline over connect, send and every read (an endpoint trickling a byte a second is cut at the deadline,
not kept alive by each byte), a cap on the body checked before any JSON is parsed, no proxy from the
environment and no redirect followed (the endpoints are the profiled processes' own ports, on this host).

May import: the standard library only.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from typing import Any

REST_MAX_BYTES = 16 << 20  # an engine's largest answers (stage lists) are a few MB; parsed JSON takes ~10x


class EndpointError(Exception):
    """An HTTP endpoint did not answer with the JSON we expected (internal; becomes a reason)."""


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive waits at most until one deadline for the whole request."""

    deadline = 0.0

    def _arm(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's deadline passed")
        self.settimeout(remaining)

    def recv(self, size: int, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(size, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        self._arm()
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._arm()
        super().sendall(data, flags)


class _Connection(http.client.HTTPConnection):
    """http.client's connection over a _DeadlineSocket (http.client itself bounds header lines and counts)."""

    def __init__(self, host: str, port: int, deadline: float) -> None:
        super().__init__(host, port, timeout=max(0.001, deadline - time.monotonic()))
        self.deadline = deadline
        self._create_connection = self._connect_until_deadline

    def _connect_until_deadline(
        self, address: tuple[str, int], timeout: float | None = None, source_address: Any = None
    ) -> socket.socket:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's deadline passed")
        plain = socket.create_connection(address, remaining)
        bounded = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        bounded.deadline = self.deadline
        return bounded


def _request(url: str, method: str, timeout: float) -> tuple[int, bytes]:
    """(status, body of at most REST_MAX_BYTES) of one request, all of it within ``timeout`` seconds."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise EndpointError(f"{url}: not an http:// URL")
    deadline = time.monotonic() + timeout
    connection = _Connection(parts.hostname, parts.port or 80, deadline)
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(method, target, headers={"Accept": "application/json", "Connection": "close"})
        response = connection.getresponse()
        if method == "HEAD":
            return response.status, b""
        if not 200 <= response.status < 300:
            raise EndpointError(f"{url}: HTTP {response.status} {response.reason[:80]}")
        declared = response.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > REST_MAX_BYTES:
            raise EndpointError(f"{url}: an answer of {declared} bytes, over the limit of {REST_MAX_BYTES}; not read")
        body = response.read(REST_MAX_BYTES + 1)
        if len(body) > REST_MAX_BYTES:
            raise EndpointError(f"{url}: an answer over the limit of {REST_MAX_BYTES} bytes; not parsed")
        return response.status, body
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if time.monotonic() >= deadline:
            raise EndpointError(f"{url}: no complete answer within {timeout:g} s") from None
        raise EndpointError(f"{url}: {exc or type(exc).__name__}") from None
    finally:
        connection.close()


def http_json(url: str, timeout: float = 30.0) -> Any:
    """GET ``url`` and decode JSON, all within ``timeout`` seconds; EndpointError for anything else
    (refused, too slow, too large, not HTTP, not JSON)."""
    _, body = _request(url, "GET", timeout)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # a crafted answer nests arrays deeper than the parser goes
        raise EndpointError(f"{url}: not JSON") from None


def speaks_http(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether ``host:port`` answers an HTTP HEAD at all, within ``timeout`` seconds. Cheap and quick even
    where the JSON API is slow to answer its first request (Spark initialises its REST servlet lazily,
    seconds under load); it keeps the slow JSON probe away from RPC ports."""
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    try:
        status, _ = _request(url, "HEAD", timeout)
    except EndpointError:
        return False
    return 100 <= status < 600
