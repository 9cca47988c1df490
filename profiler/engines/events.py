"""Events the engine processed during the window: ``--events N``, or read from the engine itself
(Spark's SQL REST API for Structured Streaming micro-batches, Flink's REST metrics through
``flinkmetrics``)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..capture.format import EventCount, FlinkSubtask, FlinkTaskManager, ProcessInfo, VertexWindow
from . import flinkmetrics
from .flinkmetrics import FlinkJobManager
from .rest import EndpointError, Endpoints, speaks_http

SOURCE_MANUAL = "--events"
SOURCE_NONE = "none"

# Kinds (known_spes.txt) whose process serves the engine's REST API.
SPARK_UI_KINDS = frozenset(
    {"driver", "local-driver", "connect-server", "local-connect-server", "thrift-server", "application-master"}
)
FLINK_REST_KINDS = frozenset({"jobmanager"})
SPARK_DRIVER_CLASSES = ("org.apache.spark.deploy.SparkSubmit", "org.apache.spark.deploy.yarn.ApplicationMaster")
FLINK_JOBMANAGER_MARKERS = ("ClusterEntrypoint", "ClusterEntryPoint", "org.apache.flink.runtime.minicluster")

SPARK_DEFAULT_UI_PORTS = range(4040, 4140)
FLINK_DEFAULT_REST_PORT = 8081
# After the window, wait this much beyond one update interval for a refresh of the JobManager's
# metric cache that brackets the window's end (else the end is extrapolated).
FLINK_END_MARGIN_SECONDS = 2.0
FLINK_TIMEOUT_SECONDS = 5.0
# Each request has its own total deadline (rest.py); these bound how many a hostile process can cost.
SPARK_POLL_BUDGET_SECONDS = 60.0  # one poll of a driver; executions left unread are read at the next
MAX_PORTS_PROBED = 32  # listening ports of one process tried as its REST API
# After the window, the last readings of one reader (the event counter, the plan collector) end within this,
# requests in flight included: an endpoint that trickles its answer costs the run this, once. 5 s cut a
# loaded Spark driver's honest answer (the suite's spark-cp demo at the end of a full run: no plan read).
FINISH_SECONDS = 15.0

Fetch = Callable[[str], Any]
Probe = Callable[[str, int], bool]  # whether host:port speaks HTTP (rest.speaks_http)


# ---------------------------------------------------------------- Spark: pure parsing

_BATCH_ID = re.compile(r"^id = (\S+)\s*$", re.MULTILINE)
_BATCH_RUN = re.compile(r"^runId = (\S+)\s*$", re.MULTILINE)
_BATCH_NUMBER = re.compile(r"^batch = (\d+)\s*$", re.MULTILINE)
_NUMBER = re.compile(r"-?[\d,]+")

OUTPUT_ROWS = "number of output rows"


@dataclass(frozen=True)
class BatchKey:
    """One micro-batch of one run of a streaming query (Spark's job description of the batch)."""

    query_id: str
    run_id: str
    batch: int


def parse_batch_description(description: str) -> BatchKey | None:
    """The micro-batch a SQL execution belongs to, from the description Spark's MicroBatchExecution
    sets: "<name>\\nid = <uuid>\\nrunId = <uuid>\\nbatch = <n>"; None for anything else."""
    query, run, batch = (_BATCH_ID.search(description), _BATCH_RUN.search(description),
                         _BATCH_NUMBER.search(description))
    if not (query and run and batch):
        return None
    return BatchKey(query.group(1), run.group(1), int(batch.group(1)))


def parse_metric_number(value: str) -> int | None:
    """A SQL metric's display value as a number: "1,234" → 1234; for "total (min, med, max)\\n12 (…)"
    the total on the second line."""
    lines = value.strip().splitlines()
    if not lines:
        return None
    text = lines[1] if lines[0].startswith("total") and len(lines) > 1 else lines[0]
    match = _NUMBER.match(text.strip())
    if not match:
        return None
    digits = match.group(0).replace(",", "")
    return int(digits) if digits.lstrip("-").isdigit() else None


def execution_input_rows(execution: Mapping[str, Any]) -> tuple[int, str] | None:
    """Input rows of one SQL execution and how they were found, or None when it read no source.

    The streaming sources of a micro-batch are its MicroBatchScan nodes (data source V2, which all
    built-in streaming sources but the file source use); without one, the leaves of the plan graph
    (nodes no edge points to) with an output row count are taken.
    """
    nodes = [node for node in execution.get("nodes", []) if isinstance(node, Mapping)]

    def rows_of(node: Mapping[str, Any]) -> int | None:
        for metric in node.get("metrics", []):
            if metric.get("name") == OUTPUT_ROWS:
                return parse_metric_number(str(metric.get("value", "")))
        return None

    scans = [node for node in nodes if str(node.get("nodeName", "")).startswith("MicroBatchScan")]
    how = "MicroBatchScan"
    if not scans:
        parents = {edge.get("toId") for edge in execution.get("edges", [])}
        scans = [
            node for node in nodes
            if node.get("nodeId") not in parents and not str(node.get("nodeName", "")).startswith("WholeStageCodegen")
        ]
        how = "leaf"
    counts = [rows for rows in map(rows_of, scans) if rows is not None]
    if not counts:
        return None
    return sum(counts), how


@dataclass(frozen=True)
class ExecutionState:
    execution_id: int
    done: bool  # COMPLETED or FAILED
    batch: BatchKey | None
    root_id: int | None = None  # the execution this one is nested in (Spark >= 3.4), itself when top-level
    finished_at: float | None = None  # unix time: submissionTime + duration, when done


def parse_spark_time(text: str) -> float | None:
    """Spark's REST timestamps, e.g. "2026-11-22T01:49:20.096GMT", as unix time."""
    try:
        return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except (ValueError, AttributeError):
        return None


def parse_execution_list(payload: Any) -> dict[int, ExecutionState]:
    """The SQL execution list of /api/v1/applications/<app>/sql."""
    if not isinstance(payload, list):
        raise EndpointError("SQL execution list is not a JSON list")
    states: dict[int, ExecutionState] = {}
    for entry in payload:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("id"), int):
            continue
        done = str(entry.get("status", "")) in ("COMPLETED", "FAILED")
        root = entry.get("rootExecutionId")
        submitted = parse_spark_time(str(entry.get("submissionTime", "")))
        duration = entry.get("duration")
        finished_at = None
        if done and submitted is not None and isinstance(duration, (int, float)):
            finished_at = submitted + duration / 1000.0
        states[entry["id"]] = ExecutionState(
            entry["id"], done, parse_batch_description(str(entry.get("description", ""))),
            root if isinstance(root, int) else None, finished_at,
        )
    return states


def executions_to_read(states: Mapping[int, ExecutionState], since: float) -> list[int]:
    """Micro-batch executions that finished at or after ``since`` and can carry source metrics.

    A root execution with nested executions only wraps them (its plan nodes have no metric
    values), so only the leaves of the nesting are read.
    """
    parents = {state.root_id for state in states.values() if state.root_id not in (None, state.execution_id)}
    return sorted(
        i for i, state in states.items()
        if state.batch is not None and state.finished_at is not None and state.finished_at >= since
        and i not in parents
    )


@dataclass(frozen=True)
class BatchRows:
    batch: BatchKey
    rows: int
    finished_at: float


def rows_in_window(rows_by_execution: Mapping[int, BatchRows], start: float, end: float) -> dict[BatchKey, int]:
    """Input rows per micro-batch that finished inside [start, end]: the largest count among the
    batch's executions, because nested executions may re-read the same source data (foreachBatch)."""
    batches: dict[BatchKey, int] = {}
    for entry in rows_by_execution.values():
        if start <= entry.finished_at <= end:
            batches[entry.batch] = max(entry.rows, batches.get(entry.batch, 0))
    return batches


# ---------------------------------------------------------------- Spark: one driver


@dataclass
class SparkDriver:
    """The micro-batch input rows one Spark driver reports through its UI's REST API.

    Each micro-batch is placed in the window by its own finish time (submission + duration, the
    driver's clock: the driver runs on this host), so a slow first answer of the REST API does not
    shift the window. The SQL store keeps only the last ``spark.sql.ui.retainedExecutions``
    executions (1000 by default), so the driver is polled during the window and each finished
    execution is read once.
    """

    base_url: str
    app_id: str
    fetch: Fetch
    window_start: float
    rows: dict[int, BatchRows] = field(default_factory=dict)  # read executions
    attempts: dict[int, int] = field(default_factory=dict)  # reads that found no metric yet
    seen: set[int] = field(default_factory=set)  # every execution id observed
    first_relevant: int | None = None  # lowest id that finished inside the window, at the first reading
    streaming_seen: bool = False
    max_attempts: int = 3
    sources: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"spark-rest:{self.base_url}"

    def _list(self) -> dict[int, ExecutionState]:
        # details=false keeps the list light; length above any retainedExecutions setting.
        query = "details=false&planDescription=false&offset=0&length=1000000"
        return parse_execution_list(self.fetch(f"{self.base_url}/api/v1/applications/{self.app_id}/sql?{query}"))

    def poll(self, budget: float = SPARK_POLL_BUDGET_SECONDS) -> None:
        """Read every micro-batch execution that finished since the window start and was not read yet,
        for at most ``budget`` seconds (the rest at the next poll)."""
        deadline = time.monotonic() + budget
        states = self._list()
        if not self.seen and states:
            # Executions before the oldest one still listed may already have been evicted.
            self.first_relevant = min(states)
        self.seen.update(states)
        if any(state.batch is not None for state in states.values()):
            self.streaming_seen = True
        for execution_id in executions_to_read(states, self.window_start):
            if execution_id in self.rows:
                continue
            if time.monotonic() > deadline:
                self.errors.append(f"a poll stopped after {budget:g} s with executions left unread")
                break
            state = states[execution_id]
            assert state.batch is not None and state.finished_at is not None
            url = f"{self.base_url}/api/v1/applications/{self.app_id}/sql/{execution_id}"
            found = execution_input_rows(self.fetch(f"{url}?details=true&planDescription=false"))
            if found is None and self.attempts.get(execution_id, 0) < self.max_attempts:
                # Metric values are aggregated just after the execution ends; read it again later.
                self.attempts[execution_id] = self.attempts.get(execution_id, 0) + 1
                continue
            self.rows[execution_id] = BatchRows(state.batch, found[0] if found else 0, state.finished_at)
            if found:
                self.sources.add(found[1])

    def missed(self) -> int:
        """Executions evicted from the driver's store between two readings, before they were read."""
        if not self.seen or self.first_relevant is None:
            return 0
        return sum(1 for i in range(self.first_relevant, max(self.seen) + 1) if i not in self.seen)


# ---------------------------------------------------------------- discovery


def _listening_endpoints(pid: int) -> list[tuple[str, int]]:
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    found: list[tuple[str, int]] = []
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        host = conn.laddr.ip
        if host in ("0.0.0.0", "::", "::ffff:0.0.0.0"):
            host = "127.0.0.1"
        elif host.startswith("::ffff:"):
            host = host[len("::ffff:"):]
        found.append((host, conn.laddr.port))
    return sorted(set(found))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _cmdline_setting(cmdline: str, key: str) -> str | None:
    match = re.search(re.escape(key) + r"=(\S+)", cmdline)
    return match.group(1) if match else None


def engine_of(process: ProcessInfo) -> str | None:
    """"spark" or "flink" when the process serves the engine's REST API, else None."""
    if process.engine == "spark" and process.kind in SPARK_UI_KINDS:
        return "spark"
    if process.engine == "flink" and process.kind in FLINK_REST_KINDS:
        return "flink"
    if any(marker in process.cmdline for marker in SPARK_DRIVER_CLASSES):
        return "spark"
    if "org.apache.flink" in process.cmdline and any(m in process.cmdline for m in FLINK_JOBMANAGER_MARKERS):
        return "flink"
    return None


def _ordered_ports(endpoints: list[tuple[str, int]], preferred: Sequence[int]) -> list[tuple[str, int]]:
    rank = {port: index for index, port in enumerate(preferred)}
    return sorted(endpoints, key=lambda e: (rank.get(e[1], len(rank)), e[1]))


def _first_answer(
    process: ProcessInfo, preferred: Sequence[int], path: str, fetch: Fetch, accept: Callable[[Any], str | None],
    probe: Probe = speaks_http, errors: list[str] | None = None,
) -> tuple[str, str] | None:
    """(base URL, what ``accept`` read) of the first listening port of ``process`` (``preferred`` ones
    first) that speaks HTTP and answers ``path`` with something ``accept`` takes; why the ports that speak
    HTTP did not answer goes to ``errors``."""
    for host, port in _ordered_ports(_listening_endpoints(process.pid), preferred)[:MAX_PORTS_PROBED]:
        if not probe(host, port):
            continue
        base = _url(host, port)
        try:
            found = accept(fetch(f"{base}{path}"))
        except EndpointError as exc:
            if errors is not None:
                errors.append(str(exc))
            continue
        if found is not None:
            return base, found
    return None


def discover_spark(
    process: ProcessInfo, fetch: Fetch, probe: Probe = speaks_http, errors: list[str] | None = None
) -> tuple[str, str] | None:
    """(UI base URL, application id) of a Spark driver: its listening ports, UI ports first (``errors``:
    _first_answer's)."""
    preferred: list[int] = []
    configured = _cmdline_setting(process.cmdline, "spark.ui.port")
    if configured and configured.isdigit():
        preferred.append(int(configured))
    preferred += list(SPARK_DEFAULT_UI_PORTS)

    def application_id(apps: Any) -> str | None:
        if isinstance(apps, list) and apps and isinstance(apps[0], Mapping) and "id" in apps[0]:
            return str(apps[0]["id"])
        return None

    return _first_answer(process, preferred, "/api/v1/applications", fetch, application_id, probe, errors)


def discover_flink(
    process: ProcessInfo, fetch: Fetch, probe: Probe = speaks_http, errors: list[str] | None = None
) -> str | None:
    """Base URL of a Flink JobManager's REST API (answers /config with a flink-version)."""
    preferred = [FLINK_DEFAULT_REST_PORT]
    configured = _cmdline_setting(process.cmdline, "rest.port")
    if configured and configured.isdigit():
        preferred.insert(0, int(configured))

    def version(config: Any) -> str | None:
        return str(config["flink-version"]) if isinstance(config, Mapping) and "flink-version" in config else None

    found = _first_answer(process, preferred, "/config", fetch, version, probe, errors)
    return found[0] if found is not None else None


# ---------------------------------------------------------------- the counter


class EventCounter:
    """Events processed during the window, from ``--events N`` or from the engines' REST APIs.

    ``start(processes)`` marks the window start; each Flink JobManager found gets a first reading
    at once and its own polling thread (``flinkmetrics``); Spark drivers are found and read in a
    background thread (their REST API can take many seconds to answer first), and polled every
    ``poll_seconds`` so no micro-batch is evicted from the driver's store unread. ``add_process``
    covers drivers/JobManagers that appear mid-window; ``finish(end_time)`` waits (at most one
    metric update interval) for a Flink refresh after the end, and returns the count for the window.
    ``vertex_windows()`` then gives Flink's per-vertex view and ``warnings`` what is missing.
    """

    def __init__(
        self, manual_count: int | None = None, *, fetch: Fetch | None = None, poll_seconds: float = 5.0,
        flink_end_margin: float = FLINK_END_MARGIN_SECONDS,
    ) -> None:
        if manual_count is not None and manual_count < 0:
            raise ValueError("manual_count must be >= 0")
        self.manual_count = manual_count
        # the engines' endpoints are the profiled processes' own: a hostile one is refused after its first
        # deadline or oversized answer, and the readings end FINISH_SECONDS after finish() (rest.Endpoints)
        self._endpoints = Endpoints() if fetch is None else None
        self.fetch: Fetch = self._endpoints.fetch if self._endpoints is not None else fetch  # type: ignore[assignment]
        # Polls must not hang on a JobManager that stopped answering: the window's end waits for them.
        self._flink_fetch: Fetch = fetch or self._flink_endpoint
        self._probe: Probe = self._endpoints.speaks_http if self._endpoints is not None else speaks_http
        self._unanswered: dict[int, str] = {}  # pid -> why its REST API gave no answer we took (the last reason)
        self.poll_seconds = poll_seconds
        self.flink_end_margin = flink_end_margin
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._spark: dict[str, SparkDriver] = {}
        self._flink: dict[str, FlinkJobManager] = {}
        self._flink_threads: list[threading.Thread] = []
        self._pending: dict[int, ProcessInfo] = {}  # engine processes whose endpoint is not found yet
        self._considered: list[str] = []
        self._notes: list[str] = []
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._last_spark_poll = 0.0

    def _flink_endpoint(self, url: str) -> Any:
        assert self._endpoints is not None
        return self._endpoints.fetch(url, FLINK_TIMEOUT_SECONDS)

    def start(self, processes: Sequence[ProcessInfo], window_start: float | None = None) -> None:
        self.window_start = time.time() if window_start is None else window_start
        if self.manual_count is not None:
            return
        for process in processes:
            self._add(process)
        self._poller = threading.Thread(target=self._poll_loop, name="event-counter", daemon=True)
        self._poller.start()

    def add_process(self, process: ProcessInfo) -> None:
        if self.manual_count is not None or self.window_start is None:
            return
        self._add(process)

    def _add(self, process: ProcessInfo) -> None:
        engine = engine_of(process)
        if engine is None:
            return
        with self._lock:
            self._considered.append(f"{engine} pid {process.pid}")
        # Flink's first reading should come at once (it may trigger the refresh that marks the
        # window's start). Spark batches carry their own finish times: found later in the background.
        if engine == "flink" and self._attach(process, engine):
            return
        with self._lock:
            self._pending[process.pid] = process

    def _attach(self, process: ProcessInfo, engine: str) -> bool:
        assert self.window_start is not None
        try:
            if engine == "spark":
                return self._attach_spark(process)
            return self._attach_flink(process)
        except EndpointError as exc:
            with self._lock:
                self._notes.append(str(exc))
            return False

    def _attach_spark(self, process: ProcessInfo) -> bool:
        assert self.window_start is not None
        errors: list[str] = []
        found = discover_spark(process, self.fetch, self._probe, errors)
        if found is None:
            self._note_unanswered(process.pid, errors)
            return False
        base, app_id = found
        with self._lock:
            if base in self._spark:
                return True
        driver = SparkDriver(base, app_id, self.fetch, self.window_start)
        driver.poll()
        with self._lock:
            self._spark[base] = driver
        return True

    def _attach_flink(self, process: ProcessInfo) -> bool:
        errors: list[str] = []
        base_url = discover_flink(process, self.fetch, self._probe, errors)
        if base_url is None:
            self._note_unanswered(process.pid, errors)
            return False
        with self._lock:
            if base_url in self._flink:
                return True
        manager = FlinkJobManager(base_url, self._flink_fetch)
        manager.configure()
        try:
            manager.poll()
        except Exception as exc:  # noqa: BLE001 - the poller retries; what it reads later still counts
            manager.note_error(str(exc))
        thread = threading.Thread(target=manager.run, args=(self._stop,), name="flink-metrics", daemon=True)
        with self._lock:
            self._flink[base_url] = manager
            self._flink_threads.append(thread)
        thread.start()
        return True

    def _note_unanswered(self, pid: int, errors: list[str]) -> None:
        if errors:
            with self._lock:
                self._unanswered[pid] = errors[-1][:300]

    def _poll_loop(self) -> None:
        self._poll_once()
        while not self._stop.wait(self.poll_seconds):
            self._poll_once()

    def _poll_once(self) -> None:
        self._last_spark_poll = time.monotonic()
        with self._lock:
            pending = list(self._pending.values())
            drivers = list(self._spark.values())
        for driver in drivers:  # first: the last reading's time (finish()) goes to the drivers that answered
            try:
                driver.poll()
            except EndpointError as exc:
                # The driver may have exited; what was read so far still counts.
                driver.errors.append(str(exc))
        for process in pending:
            engine = engine_of(process)
            if engine is not None and self._attach(process, engine):
                with self._lock:
                    self._pending.pop(process.pid, None)

    def _wait_for_flink(self, end_time: float) -> None:
        """Until every JobManager showed a metric refresh after the window's end, at most one update
        interval and a margin after the end (a refresh at most that late, since we keep asking)."""
        with self._lock:
            managers = list(self._flink.values())
        for manager in managers:
            deadline = end_time + manager.update_interval + flinkmetrics.SETTLE_SECONDS + self.flink_end_margin
            manager.wait_for_refresh_after(end_time, max(0.0, deadline - time.time()))

    def finish(self, end_time: float) -> EventCount:
        window_start = self.window_start if self.window_start is not None else end_time
        self.window_end = end_time
        if self.manual_count is not None:
            return EventCount(self.manual_count, SOURCE_MANUAL, "given on the command line", window_start, end_time,
                              method="given", uncertainty=0.0)
        self._wait_for_flink(end_time)
        self._stop.set()
        if self._endpoints is not None:
            self._endpoints.end_in(FINISH_SECONDS)  # a request still in flight is cut there (a trickle)
        for thread in [self._poller, *self._flink_threads]:
            if thread is not None:
                thread.join(timeout=120)
        if self._endpoints is not None:
            self._endpoints.end_in(FINISH_SECONDS)  # the last reading's own time
        self._poll_once()
        results = [(d.label, self._spark_result(d, window_start, end_time)) for d in self._spark.values()]
        results += [(m.label, self._flink_result(m, window_start, end_time)) for m in self._flink.values()]
        found = [(label, result) for label, result in results if result is not None]
        self.warnings.extend(self._missing())
        if found:
            return EventCount(
                sum(r.count for _, r in found), ",".join(label for label, _ in found),
                "; ".join(r.detail for _, r in found), window_start, end_time,
                method="; ".join(dict.fromkeys(r.method for _, r in found)),
                uncertainty=sum(r.uncertainty for _, r in found),
            )
        return EventCount(None, SOURCE_NONE, self._reason(), window_start, end_time, method="none")

    def vertex_windows(self) -> list[VertexWindow]:
        """Flink's own view of every job vertex over the window (empty without a Flink JobManager)."""
        if self.window_start is None or self.window_end is None:
            return []
        return [
            window for manager in self._flink.values()
            for window in manager.vertex_windows(self.window_start, self.window_end)
        ]

    def flink_placement(self) -> tuple[list[FlinkSubtask], list[FlinkTaskManager]]:
        """Where each Flink subtask ran and the TaskManagers (no PIDs yet: the runner knows its processes);
        a JobManager that does not answer adds a warning and nothing else."""
        subtasks: list[FlinkSubtask] = []
        taskmanagers: list[FlinkTaskManager] = []
        for manager in self._flink.values():
            try:
                found, managers = manager.placement()
            except Exception as exc:  # noqa: BLE001 - the samples still give vertex and subtask by thread name
                self.warnings.append(
                    f"{manager.label}: subtasks not mapped to TaskManager ids ({exc}); vertex and subtask "
                    "still come from the task threads' names"
                )
                continue
            subtasks += found
            taskmanagers += managers
        return subtasks, taskmanagers

    def _spark_result(self, driver: SparkDriver, start: float, end: float) -> _Counted | None:
        if not driver.streaming_seen:
            self._notes.append(f"{driver.label}: application {driver.app_id} ran no Structured Streaming micro-batch")
            return None
        batches = rows_in_window(driver.rows, start, end)
        queries = sorted({key.query_id for key in batches})
        how = "MicroBatchScan source nodes" if driver.sources <= {"MicroBatchScan"} else "plan leaf nodes"
        detail = (
            f"application {driver.app_id}: input rows of the {len(batches)} micro-batches of {len(queries)} "
            f"queries that finished inside the window (by the driver's submission time + duration), each "
            f"the 'number of output rows' of its {how} (SQL REST API /api/v1/applications/<app>/sql/<id>); "
            "resolution: one micro-batch at each end of the window"
        )
        missed = driver.missed()
        if missed:
            detail += (
                f"; LOWER BOUND: {missed} SQL executions were evicted before they were read "
                "(raise spark.sql.ui.retainedExecutions)"
            )
        if driver.errors:
            detail += f"; last error: {driver.errors[-1]}"
        total = sum(batches.values())
        # A batch counts when it finishes inside the window: about one batch at either end is the error.
        per_batch = total / len(batches) if batches else 0.0
        return _Counted(total, detail, "micro-batches finished in the window", per_batch)

    def _flink_result(self, manager: FlinkJobManager, start: float, end: float) -> _Counted | None:
        counted: dict[str, tuple[float, float, float, list[str]]] = {}
        uncounted: list[str] = []
        # A job that ended in the window has no metrics at the end (the counter would be extrapolated).
        for jid in sorted(manager.last_running):
            found = manager.source_count(jid, start, end)
            if found is None:
                uncounted.append(jid)
                continue
            estimate, metrics = found
            counted[jid] = (max(0.0, estimate.value), estimate.uncertainty, estimate.extrapolated, metrics)
        if not counted:
            self._notes.append(self._flink_nothing(manager, start, end))
            return None
        total = sum(c[0] for c in counted.values())
        uncertainty = sum(c[1] for c in counted.values())
        return _Counted(round(total), self._flink_detail(manager, start, end, counted, uncounted),
                        "interpolated between metric-cache refreshes", uncertainty)

    @staticmethod
    def _flink_nothing(manager: FlinkJobManager, start: float, end: float) -> str:
        if manager.errors and not manager.readings:
            return f"{manager.label}: REST API not readable ({manager.errors[-1]})"
        if not manager.first_seen:
            return f"{manager.label}: no running job"
        return (
            f"{manager.label}: the JobManager's metric cache refreshed {len(manager.refreshes)} times in and "
            f"around the {end - start:.0f} s window, two are needed (metrics.fetcher.update-interval "
            f"{manager.update_interval:.0f} s); profile for longer"
        )

    @staticmethod
    def _flink_detail(
        manager: FlinkJobManager, start: float, end: float,
        counted: Mapping[str, tuple[float, float, float, list[str]]], uncounted: Sequence[str],
    ) -> str:
        refreshes = ", ".join(f"{r.at - start:+.2f}±{r.spread:.2f} s" for r in manager.refreshes[:12])
        detail = (
            f"records emitted by the source operators of {len(counted)} running jobs, summed over subtasks; "
            f"the JobManager's metric cache (refreshed at most every {manager.update_interval:.0f} s, "
            f"{manager.interval_source}) was polled {manager.readings} times and refreshed at {refreshes} "
            "from the window's start; each counter interpolated linearly between refreshes at the window's ends"
        )
        for jid, (value, uncertainty, extrapolated, metrics) in sorted(counted.items()):
            detail += f" (job {jid[:8]}: {value:.0f} ± {uncertainty:.0f}, {', '.join(metrics)}"
            if extrapolated > 0.5:
                detail += f", {extrapolated:.1f} s extrapolated at the mean rate beyond the refreshes"
            detail += ")"
        if uncounted:
            detail += f"; not counted (fewer than two refreshes): {', '.join(uncounted)}"
        ended = sorted(set(manager.first_seen) - manager.last_running)
        if ended:
            detail += f"; jobs that ended in the window are not counted (their metrics are gone): {', '.join(ended)}"
        if manager.errors:
            detail += f"; last error: {manager.errors[-1]}"
        return detail

    def _missing(self) -> list[str]:
        """Health lines: an engine whose REST API answered nothing (no events, no Flink view)."""
        lines = []
        for process in self._pending.values():
            engine = engine_of(process)
            missing = "no event count" + (" and no Flink vertex metrics" if engine == "flink" else "")
            lines.append(
                f"events: the {engine} REST API of pid {process.pid} did not answer (UI/REST disabled or not "
                f"reachable from this host): {missing}; give the count with --events N"
                + (f" (last: {self._unanswered[process.pid]})" if process.pid in self._unanswered else "")
            )
        for manager in self._flink.values():
            if not manager.refreshes:
                reason = manager.errors[-1] if manager.errors else "no metric refresh seen"
                lines.append(f"events: {manager.label} gave no metrics for the window ({reason})")
            elif manager.errors:
                lines.append(f"events: {manager.label} failed {manager.failures} times while polling "
                             f"(last: {manager.errors[-1]}); the count uses the refreshes read")
        return lines

    def _reason(self) -> str:
        if not self._considered:
            return "no Spark driver or Flink JobManager in the scope; give the count with --events N"
        parts = [f"looked at {', '.join(self._considered)}"]
        if self._pending:
            parts.append(
                "no REST endpoint answered for pid " + ", ".join(str(pid) for pid in sorted(self._pending))
                + " (UI disabled, or not reachable from this host)"
            )
        parts += self._notes[-3:]
        return "; ".join(parts) + "; give the count with --events N"


@dataclass(frozen=True)
class _Counted:
    count: int
    detail: str
    method: str
    uncertainty: float
