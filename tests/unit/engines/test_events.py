"""Event counting from engine metrics, on JSON recorded from Spark 4.3 and a simulated Flink JobManager."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import profiler.engines.events as events_module
import profiler.engines.flinkmetrics as flinkmetrics
from profiler.capture.format import ProcessInfo
from profiler.engines.discovery import discover_spark, engine_of
from profiler.engines.events import SOURCE_MANUAL, SOURCE_NONE, EventCounter
from profiler.engines.rest import EndpointError, http_json, speaks_http
from profiler.engines.sparkbatches import (
    BatchKey,
    BatchRows,
    SparkDriver,
    execution_input_rows,
    executions_to_read,
    parse_batch_description,
    parse_execution_list,
    parse_metric_number,
    parse_spark_time,
    rows_in_window,
)
from tests.fixtures.flink_rest import BASE as FLINK_BASE
from tests.fixtures.flink_rest import SOURCE_OPERATOR, FakeJobManager

QUERY = "a40bbe98-00f3-4316-914e-45cfdb72be14"
RUN = "c4eba0a3-4781-414e-be78-f68acc81df86"


def _description(batch: int, name: str = "") -> str:
    return f"{name}\nid = {QUERY}\nrunId = {RUN}\nbatch = {batch}"


# Recorded from Spark 4.3 (local mode, rate source → groupBy count): a micro-batch runs as a root
# execution without metric values and a nested one that carries them.
_EDGES = [{"fromId": 2, "toId": 0}, {"fromId": 3, "toId": 2}, {"fromId": 5, "toId": 3}, {"fromId": 6, "toId": 5},
          {"fromId": 8, "toId": 6}, {"fromId": 9, "toId": 8}, {"fromId": 11, "toId": 9}, {"fromId": 12, "toId": 11},
          {"fromId": 13, "toId": 12}]


def _nodes(scan_rows: str | None) -> list[dict[str, Any]]:
    def rows(value: str) -> list[dict[str, str]]:
        return [] if scan_rows is None else [{"name": "number of output rows", "value": value}]

    duration = [] if scan_rows is None else [
        {"name": "duration", "value": "total (min, med, max (stageId: taskId))\n419 ms (182 ms, 237 ms, 237 ms)"}
    ]
    return [
        {"nodeId": 13, "nodeName": "MicroBatchScan", "metrics": rows(scan_rows or "")},
        {"nodeId": 12, "nodeName": "Project", "metrics": []},
        {"nodeId": 11, "nodeName": "HashAggregate", "metrics": rows("14")},
        {"nodeId": 10, "nodeName": "WholeStageCodegen (1)", "metrics": duration},
        {"nodeId": 9, "nodeName": "Exchange", "metrics": []},
        {"nodeId": 8, "nodeName": "HashAggregate", "metrics": rows("7")},
        {"nodeId": 6, "nodeName": "StateStoreRestore", "metrics": rows("14")},
        {"nodeId": 5, "nodeName": "HashAggregate", "metrics": rows("7")},
        {"nodeId": 3, "nodeName": "StateStoreSave", "metrics": rows("7") + rows("0")},
        {"nodeId": 2, "nodeName": "HashAggregate", "metrics": rows("7")},
        {"nodeId": 0, "nodeName": "WriteToDataSourceV2", "metrics": rows("7")},
    ]


def _list_entry(execution_id: int, root: int, batch: int, submitted: str, duration: int,
                status: str = "COMPLETED") -> dict[str, Any]:
    return {"id": execution_id, "status": status, "description": _description(batch), "submissionTime": submitted,
            "duration": duration, "rootExecutionId": root, "nodes": [], "edges": []}


def _details(execution_id: int, root: int, batch: int, scan_rows: str | None) -> dict[str, Any]:
    return {"id": execution_id, "status": "COMPLETED", "description": _description(batch), "rootExecutionId": root,
            "nodes": _nodes(scan_rows), "edges": _EDGES}


T0 = parse_spark_time("2026-11-22T01:59:20.000GMT")
assert T0 is not None


# ---------------------------------------------------------------- Spark parsing


def test_batch_description_with_and_without_query_name() -> None:
    assert parse_batch_description(_description(3, "probeq")) == BatchKey(QUERY, RUN, 3)
    assert parse_batch_description(_description(0)) == BatchKey(QUERY, RUN, 0)
    assert parse_batch_description(f"\nid = {QUERY}\nrunId = {RUN}\nbatch = init") is None
    assert parse_batch_description("count at <stdin>:1") is None
    assert parse_batch_description("") is None


def test_metric_numbers() -> None:
    assert parse_metric_number("800") == 800
    assert parse_metric_number("1,234,567") == 1234567
    assert parse_metric_number("total (min, med, max (stageId: taskId))\n419 ms (182 ms, 237 ms)") == 419
    assert parse_metric_number("") is None
    assert parse_metric_number("n/a") is None


def test_spark_time() -> None:
    assert parse_spark_time("1970-01-01T00:00:01.500GMT") == 1.5
    assert parse_spark_time("garbage") is None


def test_input_rows_are_the_source_scan_rows_not_other_operators() -> None:
    assert execution_input_rows(_details(7, 6, 3, "400")) == (400, "MicroBatchScan")
    assert execution_input_rows(_details(6, 6, 3, None)) is None  # the wrapping root execution


def test_input_rows_fall_back_to_plan_leaves_without_micro_batch_scan() -> None:
    execution = {
        "nodes": [
            {"nodeId": 0, "nodeName": "Union", "metrics": []},
            {"nodeId": 1, "nodeName": "Scan json", "metrics": [{"name": "number of output rows", "value": "1,000"}]},
            {"nodeId": 2, "nodeName": "Scan json", "metrics": [{"name": "number of output rows", "value": "24"}]},
            {"nodeId": 3, "nodeName": "WholeStageCodegen (1)", "metrics": [{"name": "number of output rows",
                                                                            "value": "99"}]},
        ],
        "edges": [{"fromId": 1, "toId": 0}, {"fromId": 2, "toId": 0}],
    }
    assert execution_input_rows(execution) == (1024, "leaf")


def test_two_streaming_sources_in_one_execution_add_up() -> None:
    execution = {"nodes": [
        {"nodeId": 1, "nodeName": "MicroBatchScan", "metrics": [{"name": "number of output rows", "value": "5"}]},
        {"nodeId": 2, "nodeName": "MicroBatchScan", "metrics": [{"name": "number of output rows", "value": "6"}]},
    ], "edges": []}
    assert execution_input_rows(execution) == (11, "MicroBatchScan")


def test_only_finished_nested_executions_inside_the_window_are_read() -> None:
    states = parse_execution_list([
        _list_entry(4, 4, 2, "2026-11-22T01:59:18.000GMT", 1000),  # finished before the window
        _list_entry(5, 4, 2, "2026-11-22T01:59:18.100GMT", 900),
        _list_entry(6, 6, 3, "2026-11-22T01:59:21.437GMT", 2377),  # root of batch 3
        _list_entry(7, 6, 3, "2026-11-22T01:59:21.467GMT", 2347),  # nested: carries the metrics
        _list_entry(8, 8, 4, "2026-11-22T01:59:24.000GMT", 100, status="RUNNING"),
        {"id": 9, "status": "COMPLETED", "description": "count at x.py:3", "submissionTime":
            "2026-11-22T01:59:24.000GMT", "duration": 5, "rootExecutionId": 9},
        "not an execution",
    ])
    assert states[7].finished_at == pytest.approx(T0 + 1.467 + 2.347)
    assert states[8].finished_at is None and not states[8].done
    assert executions_to_read(states, since=T0) == [7]
    with pytest.raises(EndpointError):
        parse_execution_list({"message": "not found"})


def test_rows_in_window_take_the_largest_execution_of_a_batch_and_respect_bounds() -> None:
    batch3, batch4 = BatchKey(QUERY, RUN, 3), BatchKey(QUERY, RUN, 4)
    rows = {
        7: BatchRows(batch3, 400, T0 + 4),
        10: BatchRows(batch3, 400, T0 + 4.5),  # foreachBatch re-reading the same batch
        12: BatchRows(batch4, 800, T0 + 6),
        14: BatchRows(BatchKey(QUERY, RUN, 5), 800, T0 + 9),
    }
    assert rows_in_window(rows, T0, T0 + 8) == {batch3: 400, batch4: 800}
    assert rows_in_window(rows, T0 + 5, T0 + 6) == {batch4: 800}


class FakeRest:
    """URL → JSON; a missing URL raises like a closed port."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes = routes
        self.calls: list[str] = []

    def __call__(self, url: str) -> Any:
        self.calls.append(url)
        if url not in self.routes:
            raise EndpointError(f"{url}: connection refused")
        value = self.routes[url]
        return value() if callable(value) else value


BASE = "http://127.0.0.1:4040"
APP = "local-1795312153714"
SQL = f"{BASE}/api/v1/applications/{APP}/sql"
LIST = f"{SQL}?details=false&planDescription=false&offset=0&length=1000000"


def _detail_url(execution_id: int) -> str:
    return f"{SQL}/{execution_id}?details=true&planDescription=false"


def test_spark_driver_rereads_executions_whose_metrics_are_not_aggregated_yet() -> None:
    listing = [_list_entry(6, 6, 3, "2026-11-22T01:59:21.437GMT", 2377),
               _list_entry(7, 6, 3, "2026-11-22T01:59:21.467GMT", 2347)]
    details = [_details(7, 6, 3, None)]
    rest = FakeRest({LIST: listing, _detail_url(7): lambda: details[0]})
    driver = SparkDriver(BASE, APP, rest, window_start=T0)
    driver.poll()
    assert driver.rows == {} and driver.attempts == {7: 1}
    details[0] = _details(7, 6, 3, "400")
    driver.poll()
    assert driver.rows[7].rows == 400 and driver.streaming_seen
    driver.poll()
    assert rest.calls.count(_detail_url(7)) == 2  # read once it had its metrics, never again
    assert driver.missed() == 0


def test_spark_driver_notices_evicted_executions() -> None:
    first = [_list_entry(i, i, i, "2026-11-22T01:59:21.000GMT", 10) for i in (10, 11)]
    later = [_list_entry(i, i, i, "2026-11-22T01:59:21.000GMT", 10) for i in (14, 15)]  # 12, 13 evicted
    pages = [first, later]
    routes: dict[str, Any] = {LIST: lambda: pages.pop(0)}
    for i in (10, 11, 14, 15):
        routes[_detail_url(i)] = _details(i, i, i, "5")
    driver = SparkDriver(BASE, APP, FakeRest(routes), window_start=T0)
    driver.poll()
    driver.poll()
    assert driver.missed() == 2
    assert sum(rows_in_window(driver.rows, T0, T0 + 10).values()) == 20


def _driver_process(now: float) -> ProcessInfo:
    return ProcessInfo(pid=4242, role="managing", engine="spark", kind="driver", user="spark",
                       cmdline="java org.apache.spark.deploy.SparkSubmit app.py", first_seen=now - 100, last_seen=now)


def test_event_counter_spark_window_with_a_fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a driver whose REST API lists batches before, inside and after the window
    import time as time_module

    now = time_module.time()

    def entry(i: int, offset_seconds: float) -> dict[str, Any]:
        at = time_module.strftime("%Y-%m-%dT%H:%M:%S", time_module.gmtime(int(now + offset_seconds)))
        return _list_entry(i, i, i, f"{at}.000GMT", 0)

    listing = [entry(1, -30), entry(2, 2), entry(3, 3), entry(4, 500)]
    routes: dict[str, Any] = {LIST: listing}
    for i, rows in ((1, "111"), (2, "200"), (3, "300"), (4, "444")):
        routes[_detail_url(i)] = _details(i, i, i, rows)
    monkeypatch.setattr(events_module, "discover_spark", lambda process, fetch, *rest: (BASE, APP))
    counter = EventCounter(fetch=FakeRest(routes), poll_seconds=0.05)
    # WHEN the window runs from now to now + 10 s
    counter.start([_driver_process(now)])
    result = counter.finish(int(now) + 10.0)
    # THEN only the two batches that finished inside it count
    assert result.count == 500, result
    assert result.source == f"spark-rest:{BASE}"
    assert "2 micro-batches" in result.detail and "one micro-batch" in result.detail


def test_event_counter_reports_why_when_the_driver_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "discover_spark", lambda process, fetch, *rest: None)
    counter = EventCounter(fetch=FakeRest({}), poll_seconds=0.05)
    counter.start([_driver_process(0.0)])
    result = counter.finish(1e10)
    assert result.count is None and result.source == SOURCE_NONE
    assert "no REST endpoint answered for pid 4242" in result.detail and "--events" in result.detail


def test_manual_count_wins_and_needs_no_engine() -> None:
    counter = EventCounter(manual_count=123456)
    counter.start([])
    result = counter.finish(2e9)
    assert (result.count, result.source) == (123456, SOURCE_MANUAL)
    assert result.window_start is not None and result.window_end == 2e9
    with pytest.raises(ValueError):
        EventCounter(manual_count=-1)


def test_engine_of_picks_rest_serving_processes_only() -> None:
    def process(engine: str, kind: str, cmdline: str) -> ProcessInfo:
        return ProcessInfo(1, "managing", engine, kind, "u", cmdline, 0.0, 0.0)

    assert engine_of(process("spark", "local-driver", "java org.apache.spark.deploy.SparkSubmit")) == "spark"
    assert engine_of(process("spark", "executor", "java o.a.s.executor.CoarseGrainedExecutorBackend")) is None
    assert engine_of(process("flink", "jobmanager", "java StandaloneSessionClusterEntrypoint")) == "flink"
    assert engine_of(process("flink", "taskmanager", "java TaskManagerRunner")) is None
    assert engine_of(process("manual", "manual", "java -cp x org.apache.spark.deploy.SparkSubmit q.py")) == "spark"
    assert engine_of(process("manual", "manual", "python3 server.py")) is None


# ---------------------------------------------------------------- Flink (a simulated JobManager, real time)

JOBMANAGER = ProcessInfo(7, "managing", "flink", "jobmanager", "flink",
                         "java org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint", 0.0, 0.0)


@pytest.fixture
def quick_flink(monkeypatch: pytest.MonkeyPatch) -> FakeJobManager:
    """A simulated JobManager on the real clock whose metric cache refreshes every 0.5 s, and the
    poller's pace scaled down to match (the real one: 10 s, 1 s, 50 ms, 1.5 s to settle)."""
    monkeypatch.setattr(flinkmetrics, "BASE_POLL_SECONDS", 0.1)
    monkeypatch.setattr(flinkmetrics, "SEARCH_POLL_SECONDS", 0.03)
    monkeypatch.setattr(flinkmetrics, "FAST_POLL_SECONDS", 0.01)
    monkeypatch.setattr(flinkmetrics, "FAST_SPAN_SECONDS", 0.2)
    monkeypatch.setattr(flinkmetrics, "NARROW_SECONDS", 0.03)
    monkeypatch.setattr(flinkmetrics, "SETTLE_SECONDS", 0.15)
    monkeypatch.setattr(flinkmetrics, "SETTLE_POLL_SECONDS", 0.05)
    monkeypatch.setattr(events_module, "discover_flink", lambda process, fetch, *rest: FLINK_BASE)
    return FakeJobManager(time.time, interval=0.5, capture_delay=0.005, visible_delay=(0.008, 0.009),
                          job_start=time.time() - 60)


def test_flink_counter_counts_the_window_with_method_uncertainty_and_vertex_view(quick_flink: FakeJobManager) -> None:
    # GIVEN a JobManager whose cache nobody refreshed; WHEN a 3 s window is counted
    counter = EventCounter(fetch=quick_flink, flink_end_margin=0.5)
    start = time.time()
    counter.start([JOBMANAGER], start)
    time.sleep(3.0)
    end = time.time()
    result = counter.finish(end)
    # THEN the count is the source's within 3 % (about 60,000), with the method and uncertainty
    truth = quick_flink.emitted(end) - quick_flink.emitted(start)
    assert result.count is not None and result.count == pytest.approx(truth, rel=0.03), (result, truth)
    assert result.source == f"flink-rest:{FLINK_BASE}"
    assert result.method == "interpolated between metric-cache refreshes"
    assert result.uncertainty is not None and 0 < result.uncertainty < 0.03 * truth
    assert SOURCE_OPERATOR in result.detail and "refreshed at" in result.detail
    # AND Flink's view of both vertices over the same window, and nothing to warn about
    vertices = {v.name: v for v in counter.vertex_windows()}
    window = vertices["WindowSum -> Discard: Writer"]
    assert window.records_in == pytest.approx(truth, rel=0.03)
    assert window.busy_ms_per_s == pytest.approx(250, rel=0.05)
    assert counter.warnings == []


def test_flink_counter_without_a_reachable_rest_api_completes_with_a_health_line(
    quick_flink: FakeJobManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a JobManager whose REST API does not answer at all
    monkeypatch.setattr(events_module, "discover_flink", lambda process, fetch, *rest: None)
    counter = EventCounter(fetch=quick_flink, flink_end_margin=0.1)
    counter.start([JOBMANAGER])
    result = counter.finish(time.time())
    # THEN no count, a reason, a health line, and no Flink view
    assert result.count is None and result.source == SOURCE_NONE and result.method == "none"
    assert "no REST endpoint answered for pid 7" in result.detail
    assert any("flink REST API of pid 7 did not answer" in line for line in counter.warnings), counter.warnings
    assert counter.vertex_windows() == []


def test_flink_counter_whose_jobmanager_stops_answering_mid_window(quick_flink: FakeJobManager) -> None:
    # GIVEN a JobManager that answers at the start and goes away a second into the window
    counter = EventCounter(fetch=quick_flink, flink_end_margin=0.1)
    counter.start([JOBMANAGER])
    time.sleep(1.0)
    quick_flink.reachable = False
    time.sleep(0.5)
    result = counter.finish(time.time())
    # THEN the run still gets a result (the refreshes read before, extrapolated) and a health line
    assert result.count is not None and result.count > 0
    assert "extrapolated" in result.detail
    assert any("failed" in line and "Connection refused" in line for line in counter.warnings), counter.warnings


# ---------------------------------------------------------------- HTTP and discovery against in-process servers


class _JsonHandler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, Any] = {}

    def do_HEAD(self) -> None:  # http.server naming
        self.send_response(302)
        self.end_headers()

    def do_GET(self) -> None:
        if self.path not in self.routes:
            self.send_error(404)
            return
        body = json.dumps(self.routes[self.path]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def json_server() -> Iterator[tuple[int, dict[str, Any]]]:
    routes: dict[str, Any] = {}
    handler = type("Handler", (_JsonHandler,), {"routes": routes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], routes
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_http_json_and_speaks_http(json_server: tuple[int, dict[str, Any]]) -> None:
    port, routes = json_server
    routes["/x"] = {"a": 1}
    assert http_json(f"http://127.0.0.1:{port}/x") == {"a": 1}
    assert speaks_http("127.0.0.1", port)
    with pytest.raises(EndpointError):
        http_json(f"http://127.0.0.1:{port}/missing")
    # a TCP listener that is not HTTP (an RPC port): answers garbage and closes
    with socket.socket() as rpc:
        rpc.bind(("127.0.0.1", 0))
        rpc.listen(1)

        def garbage() -> None:
            conn, _ = rpc.accept()
            conn.sendall(b"\x00\x00\x00\x10not http at all\n")
            conn.close()

        threading.Thread(target=garbage, daemon=True).start()
        assert not speaks_http("127.0.0.1", rpc.getsockname()[1])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    assert not speaks_http("127.0.0.1", free)
    with pytest.raises(EndpointError):
        http_json(f"http://127.0.0.1:{free}/x", timeout=2)


def test_discover_spark_finds_the_ui_among_this_process_listening_ports(
    json_server: tuple[int, dict[str, Any]]
) -> None:
    # GIVEN this process listens on an "RPC" port and on a port that serves the Spark REST API
    port, routes = json_server
    routes["/api/v1/applications"] = [{"id": "app-20261122-0001", "name": "ysb"}]
    with socket.socket() as rpc:
        rpc.bind(("127.0.0.1", 0))
        rpc.listen(4)

        def hang_up() -> None:
            while True:
                try:
                    conn, _ = rpc.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=hang_up, daemon=True).start()
        process = ProcessInfo(os.getpid(), "managing", "spark", "driver", "u",
                              "java org.apache.spark.deploy.SparkSubmit", 0.0, 0.0)
        # WHEN the driver's UI is looked for; THEN the HTTP port with the API is found
        assert discover_spark(process, http_json) == (f"http://127.0.0.1:{port}", "app-20261122-0001")
        routes.clear()
        assert discover_spark(process, http_json) is None
