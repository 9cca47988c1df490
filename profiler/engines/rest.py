"""The HTTP client of the engines' REST APIs (a Spark driver's UI, a Flink JobManager): one GET, a total
deadline over connect, send and every read (an endpoint trickling a byte a second is cut at the deadline,
not kept alive by each byte), a cap on the body checked before any JSON is parsed, no proxy from the
environment and no redirect followed (the endpoints are the profiled processes' own ports, on this host).

May import: the standard library only.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

REST_MAX_BYTES = 16 << 20  # an engine's largest answers (stage lists) are a few MB; parsed JSON takes ~10x
# After the window, the last readings of one reader (the event counter, the plan collector) end within this,
# requests in flight included: an endpoint that trickles its answer costs the run this, once. 5 s cut a
# loaded Spark driver's honest answer (the suite's spark-cp demo at the end of a full run: no plan read).
FINISH_SECONDS = 15.0

Fetch = Callable[[str], Any]  # a URL's JSON answer (http_json, or an Endpoints' fetch)
Probe = Callable[[str, int], bool]  # whether host:port speaks HTTP (speaks_http)


class EndpointError(Exception):
    """An HTTP endpoint did not answer with the JSON we expected (internal; becomes a reason)."""


class EndpointRefused(EndpointError):
    """An endpoint kept its answer past the request's deadline or sent more than REST_MAX_BYTES: Endpoints
    asks it nothing more."""


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive waits at most until one deadline for the whole request."""

    deadline = 0.0
    guard: Endpoints | None = None  # its end, when earlier, is the deadline

    def _arm(self) -> None:
        end = self.deadline if self.guard is None else min(self.deadline, self.guard.end)
        remaining = end - time.monotonic()
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

    def __init__(self, host: str, port: int, deadline: float, guard: Endpoints | None = None) -> None:
        super().__init__(host, port, timeout=max(0.001, deadline - time.monotonic()))
        self.deadline = deadline
        self.guard = guard
        self.bounded: _DeadlineSocket | None = None
        self._create_connection = self._connect_until_deadline

    def _connect_until_deadline(
        self, address: tuple[str, int], timeout: float | None = None, source_address: Any = None
    ) -> socket.socket:
        end = self.deadline if self.guard is None else min(self.deadline, self.guard.end)
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's deadline passed")
        plain = socket.create_connection(address, remaining)
        bounded = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        bounded.deadline, bounded.guard, self.bounded = self.deadline, self.guard, bounded
        if self.guard is not None:
            self.guard.opened(bounded)
        return bounded


def _request(url: str, method: str, timeout: float, guard: Endpoints | None = None) -> tuple[int, bytes]:
    """(status, body of at most REST_MAX_BYTES) of one request, all of it within ``timeout`` seconds (and
    before ``guard``'s end, which cuts it short)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise EndpointError(f"{url}: not an http:// URL")
    deadline = time.monotonic() + timeout
    connection = _Connection(parts.hostname, parts.port or 80, deadline, guard)
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
            raise EndpointRefused(f"{url}: an answer of {declared} bytes, over the limit of {REST_MAX_BYTES}; not read")
        body = response.read(REST_MAX_BYTES + 1)
        if guard is not None and guard.ended():  # the cut's shutdown ends a body early, as if it were whole
            raise EndpointRefused(f"{url}: no complete answer by the end of the readings")
        if len(body) > REST_MAX_BYTES:
            raise EndpointRefused(f"{url}: an answer over the limit of {REST_MAX_BYTES} bytes; not parsed")
        return response.status, body
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if guard is not None and guard.ended():
            raise EndpointRefused(f"{url}: no complete answer by the end of the readings") from None
        if time.monotonic() >= deadline:
            raise EndpointRefused(f"{url}: no complete answer within {timeout:g} s") from None
        raise EndpointError(f"{url}: {exc or type(exc).__name__}") from None
    finally:
        connection.close()
        if guard is not None and connection.bounded is not None:
            guard.closed(connection.bounded)


def http_json(url: str, timeout: float = 30.0, guard: Endpoints | None = None) -> Any:
    """GET ``url`` and decode JSON, all within ``timeout`` seconds; EndpointError for anything else
    (refused, too slow, too large, not HTTP, not JSON)."""
    _, body = _request(url, "GET", timeout, guard)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # a crafted answer nests arrays deeper than the parser goes
        raise EndpointError(f"{url}: not JSON") from None


def speaks_http(host: str, port: int, timeout: float = 2.0, guard: Endpoints | None = None) -> bool:
    """Whether ``host:port`` answers an HTTP HEAD at all, within ``timeout`` seconds. Cheap and quick even
    where the JSON API is slow to answer its first request (Spark initialises its REST servlet lazily,
    seconds under load); it keeps the slow JSON probe away from RPC ports."""
    url = f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
    try:
        status, _ = _request(url, "HEAD", timeout, guard)
    except EndpointError:
        return False
    return 100 <= status < 600


def origin_of(url: str) -> str:
    """``http://host:port`` of a URL: what one process serves (the unit Endpoints refuses)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class Endpoints:
    """The requests of one reader of the engines' endpoints (the event counter, the plan collector), so that a
    profiled process serving a hostile endpoint costs the run one deadline, not one per request or poll:

    - ``fetch(url)`` is http_json within ``timeout`` seconds and before the readings' end;
    - an endpoint (``origin_of``) that kept an answer past its deadline (or the end) or sent more than
      REST_MAX_BYTES is refused from then on (``refused``: origin -> why, the first time);
    - ``end_in(seconds)``: every request ends by then, those in flight too (their sockets are shut down).
    """

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.refused: dict[str, str] = {}
        self.end = math.inf  # time.monotonic() by which every request ends
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def fetch(self, url: str, timeout: float | None = None) -> Any:
        origin = origin_of(url)
        with self._lock:
            why = self.refused.get(origin)
        if why is not None:
            raise EndpointError(f"{url}: not asked again ({why})")
        try:
            return http_json(url, self._left(url, timeout), self)
        except EndpointRefused as exc:
            with self._lock:
                self.refused.setdefault(origin, str(exc))
            raise

    def speaks_http(self, host: str, port: int) -> bool:
        """rest.speaks_http within the readings' end (False once it passed)."""
        left = self.end - time.monotonic()
        return left > 0 and speaks_http(host, port, min(2.0, left), self)

    def _left(self, url: str, timeout: float | None) -> float:
        left = min(self.timeout if timeout is None else timeout, self.end - time.monotonic())
        if left <= 0:
            raise EndpointError(f"{url}: not asked: the readings ended")
        return left

    def end_in(self, seconds: float) -> None:
        """Every request ends within ``seconds`` from now (the end set before is replaced): new ones get what is
        left, those in flight are cut there, and their endpoints refused from then on."""
        with self._lock:
            self.end = time.monotonic() + seconds
        cutter = threading.Timer(max(0.0, seconds), self._cut)
        cutter.daemon = True
        cutter.start()

    def ended(self) -> bool:
        return time.monotonic() >= self.end

    def _cut(self) -> None:
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked on a silent endpoint
            except OSError:
                pass

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
