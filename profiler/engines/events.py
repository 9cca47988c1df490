"""Events the engine processed during the window: ``--events N``, or read from the engine itself
(Spark's SQL REST API for Structured Streaming micro-batches, sparkbatches.py; Flink's REST metrics,
flinkmetrics.py), the engines' REST APIs found by discovery.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..capture.format import EventCount, FlinkSubtask, FlinkTaskManager, ProcessInfo, VertexWindow
from . import flinkmetrics
from .discovery import discover_flink, discover_spark, engine_of
from .flinkmetrics import FlinkJobManager
from .rest import FINISH_SECONDS, EndpointError, Endpoints, Fetch, Probe, speaks_http
from .sparkbatches import SparkDriver, rows_in_window

SOURCE_MANUAL = "--events"
SOURCE_NONE = "none"

# After the window, wait this much beyond one update interval for a refresh of the JobManager's
# metric cache that brackets the window's end (else the end is extrapolated).
FLINK_END_MARGIN_SECONDS = 2.0
FLINK_TIMEOUT_SECONDS = 5.0


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
