"""The engines' REST client against hostile endpoints: a total deadline per request (a trickle of bytes
does not keep it reading), a body cap checked before JSON is parsed, no redirect followed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from profiler.engines import rest, sparkbatches
from profiler.engines.rest import EndpointError, http_json, speaks_http

Serve = Callable[[socket.socket], None]


@pytest.fixture
def endpoint() -> Iterator[Callable[[Serve], int]]:
    """``endpoint(serve)``: a port whose every connection is handed to ``serve`` (in its own thread)."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(serve: Serve) -> int:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.2)
        servers.append(server)

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                threading.Thread(target=_handled, args=(serve, conn), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return int(server.getsockname()[1])

    def _handled(serve: Serve, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                serve(conn)
            except OSError:
                pass  # the client went away: what the test wanted

    yield start
    stop.set()
    for server in servers:
        server.close()


def _trickle(prefix: bytes) -> Serve:
    def serve(conn: socket.socket) -> None:
        conn.sendall(prefix)
        for _ in range(200):  # a byte every 50 ms for 10 s: each recv waits far less than any timeout
            conn.sendall(b" ")
            time.sleep(0.05)

    return serve


def _answer(head: bytes, body: bytes) -> Serve:
    return lambda conn: conn.sendall(head + body)


@pytest.mark.parametrize(
    "prefix",
    [b"", b"HTTP/1.1 200 OK\r\nX-Slow: ", b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n["],
    ids=["status-line", "headers", "body"],
)
def test_a_trickling_endpoint_is_cut_at_the_requests_deadline(endpoint: Callable[[Serve], int], prefix: bytes) -> None:
    port = endpoint(_trickle(prefix))
    began = time.monotonic()
    with pytest.raises(EndpointError, match="no complete answer within 1 s"):
        http_json(f"http://127.0.0.1:{port}/api/v1/applications", timeout=1.0)
    assert time.monotonic() - began < 2.0


def test_speaks_http_gives_up_at_its_deadline(endpoint: Callable[[Serve], int]) -> None:
    port = endpoint(_trickle(b"HTTP/1.1 200 OK\r\n"))
    began = time.monotonic()
    assert not speaks_http("127.0.0.1", port, timeout=0.5)
    assert time.monotonic() - began < 1.5


def test_a_body_over_the_cap_is_never_parsed(endpoint: Callable[[Serve], int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rest, "REST_MAX_BYTES", 1000)
    declared = endpoint(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", b"[1]"))
    with pytest.raises(EndpointError, match="999999999999 bytes, over the limit of 1000; not read"):
        http_json(f"http://127.0.0.1:{declared}/x")
    undeclared = endpoint(_answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"[" + b"1," * 1000 + b"1]"))
    with pytest.raises(EndpointError, match="over the limit of 1000 bytes; not parsed"):
        http_json(f"http://127.0.0.1:{undeclared}/x")
    chunk = b"1," * 400
    chunked = endpoint(_answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3 + b"0\r\n\r\n",
    ))  # fmt: skip
    with pytest.raises(EndpointError, match="over the limit"):
        http_json(f"http://127.0.0.1:{chunked}/x")


def test_json_nested_deeper_than_the_parser_goes_is_not_json(endpoint: Callable[[Serve], int]) -> None:
    port = endpoint(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n", b"[" * 200_000))
    with pytest.raises(rest.EndpointError, match="not JSON"):
        http_json(f"http://127.0.0.1:{port}/api/v1/applications")


def test_a_redirect_is_not_followed(endpoint: Callable[[Serve], int]) -> None:
    elsewhere: list[bytes] = []
    target = endpoint(lambda conn: elsewhere.append(b"asked"))
    port = endpoint(_answer(f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{target}/\r\n\r\n".encode(), b""))
    with pytest.raises(EndpointError, match="HTTP 302"):
        http_json(f"http://127.0.0.1:{port}/api/v1/applications")
    time.sleep(0.1)
    assert elsewhere == []


def test_only_http_urls(endpoint: Callable[[Serve], int]) -> None:
    with pytest.raises(EndpointError, match="not an http:// URL"):
        http_json("file:///etc/shadow")


def test_a_spark_poll_stops_at_its_budget() -> None:
    # GIVEN a driver listing 50 finished micro-batches, each of whose reads takes 0.1 s
    listing = [
        {"id": i, "status": "COMPLETED", "description": f"q\nid = a\nrunId = b\nbatch = {i}",
         "submissionTime": "2026-11-22T01:49:20.096GMT", "duration": 10}
        for i in range(50)
    ]  # fmt: skip
    reads: list[str] = []

    def fetch(url: str) -> object:
        if "/sql?" in url:
            return listing
        reads.append(url)
        time.sleep(0.1)
        return {"nodes": []}

    driver = sparkbatches.SparkDriver("http://127.0.0.1:1", "app", fetch, window_start=0.0, max_attempts=0)
    # WHEN it is polled with a budget of 0.5 s THEN it stops after about five reads, with a note
    began = time.monotonic()
    driver.poll(budget=0.5)
    assert time.monotonic() - began < 1.5
    assert 3 <= len(reads) <= 8
    assert driver.errors and "stopped after 0.5 s" in driver.errors[-1]
    # AND the next poll goes on with the executions left
    driver.poll(budget=0.5)
    assert len(set(reads)) > 8


# ---------------------------------------------------------------- Endpoints: one reader's requests


def _silent(conn: socket.socket) -> None:
    time.sleep(10)  # says nothing at all: a recv waits for its whole timeout


def test_an_endpoint_past_its_deadline_is_not_asked_again(endpoint: Callable[[Serve], int]) -> None:
    port = endpoint(_trickle(b"HTTP/1.1 200 OK\r\n\r\n["))
    endpoints = rest.Endpoints(timeout=0.5)
    with pytest.raises(rest.EndpointRefused, match="no complete answer within 0.5 s"):
        endpoints.fetch(f"http://127.0.0.1:{port}/api/v1/applications")
    began = time.monotonic()
    with pytest.raises(EndpointError, match=r"/other: not asked again \(.*no complete answer within 0.5 s\)"):
        endpoints.fetch(f"http://127.0.0.1:{port}/other")
    assert time.monotonic() - began < 0.1 and list(endpoints.refused) == [f"http://127.0.0.1:{port}"]


def test_an_oversized_answer_refuses_its_endpoint(
    endpoint: Callable[[Serve], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rest, "REST_MAX_BYTES", 1000)
    port = endpoint(_answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"[" + b"1," * 1000 + b"1]"))
    endpoints = rest.Endpoints()
    with pytest.raises(rest.EndpointRefused, match="over the limit of 1000 bytes"):
        endpoints.fetch(f"http://127.0.0.1:{port}/x")
    with pytest.raises(EndpointError, match="not asked again"):
        endpoints.fetch(f"http://127.0.0.1:{port}/x")


@pytest.mark.parametrize("serve", [_trickle(b"HTTP/1.1 200 OK\r\n\r\n["), _silent], ids=["trickle", "silent"])
def test_the_readings_end_cuts_a_request_in_flight(endpoint: Callable[[Serve], int], serve: Serve) -> None:
    # GIVEN a request with 30 s to go, in flight in a worker (an endpoint trickling, or saying nothing)
    port = endpoint(serve)
    endpoints = rest.Endpoints(timeout=30.0)
    failures: list[Exception] = []

    def read() -> None:
        try:
            endpoints.fetch(f"http://127.0.0.1:{port}/api/v1/applications")
        except EndpointError as exc:
            failures.append(exc)

    worker = threading.Thread(target=read)
    began = time.monotonic()
    worker.start()
    # WHEN the readings are to end in 0.3 s, THEN the request ends then, named, and its endpoint is refused
    endpoints.end_in(0.3)
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - began < 1.5
    assert [type(exc) for exc in failures] == [rest.EndpointRefused]
    assert "no complete answer by the end of the readings" in str(failures[0])
    endpoints.end_in(5.0)  # a last reading's own time: this endpoint is still refused
    with pytest.raises(EndpointError, match="not asked again"):
        endpoints.fetch(f"http://127.0.0.1:{port}/x")
