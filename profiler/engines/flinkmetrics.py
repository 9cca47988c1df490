"""Flink's own metrics over the profiling window, from a JobManager's REST API: the records each job
vertex read and emitted (the events of a job are its sources' records) and the time its subtasks
were busy, back-pressured or idle, estimated at the window's exact ends.

The JobManager answers metric requests from a cache (MetricFetcherImpl): a request that finds the
cache older than ``metrics.fetcher.update-interval`` (10 s by default) starts one asynchronous fetch
from every TaskManager and is itself answered from the old cache. So the values only change at
refreshes, and a single reading can be any age. This module polls often enough to see each refresh
within a fraction of a second (and to be the request that triggers the next one), keeps the
refreshes with the moments they happened, and interpolates every counter between them.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..capture.format import FlinkSubtask, FlinkTaskManager, VertexWindow

Fetch = Callable[[str], Any]
SeriesKey = tuple[str, str, str]  # (job id, vertex id, metric id)

DEFAULT_UPDATE_INTERVAL = 10.0  # metrics.fetcher.update-interval when /jobmanager/config does not say
BASE_POLL_SECONDS = 1.0  # between refreshes: catches refreshes other clients trigger, within a second
FAST_POLL_SECONDS = 0.05  # right after a refresh is due: brackets it within ~50 ms
FAST_SPAN_SECONDS = 1.5  # how long fast polling goes on when the expected refresh does not come
# The TaskManagers' answers to one fetch reach the cache one by one (1 s apart on a loaded machine):
# a refresh is complete once this long passed without another change.
SETTLE_SECONDS = 1.5
SETTLE_POLL_SECONDS = 0.5
STAMP_SLACK = 0.005  # the JobManager stamps whole milliseconds; a fetch our own request starts is after it
SEARCH_POLL_SECONDS = 0.25  # while it is not known when the next refresh can come
NARROW_SECONDS = 0.15  # a refresh bracketed within ± this tells when the next one is due
# From the fetch's start (the JobManager's lastUpdateTime) to the TaskManagers' reading of their
# counters: RPCs to the ResourceManager and the TaskManager. Measured 65-112 ms against the test job's
# own count on a 2-core machine at load 28 (a constant offset cancels between the window's ends).
TRIGGER_TO_CAPTURE = 0.08
TRIGGER_SPREAD = 0.05
DISCOVER_SECONDS = 5.0  # jobs and metric names are looked up again at most this often
UNKNOWN_RATE_SPREAD = 0.1  # relative rate variation assumed when a counter has a single segment

RECORDS_IN = "numRecordsIn"
RECORDS_OUT = "numRecordsOut"
# Cumulative milliseconds per subtask (Flink >= 1.17); their derivatives are the *TimeMsPerSecond gauges.
TIME_METRICS = {
    "busy": "accumulateBusyTimeMs",
    "backpressured": "accumulateBackPressuredTimeMs",
    "idle": "accumulateIdleTimeMs",
}
VERTEX_METRICS = (RECORDS_IN, RECORDS_OUT, *TIME_METRICS.values())


class FlinkRestError(Exception):
    """The JobManager's REST API did not answer as expected (internal; becomes a reason or warning)."""


# ---------------------------------------------------------------- pure parsing


def running_jobs(overview: Any) -> list[str]:
    """Job ids of RUNNING jobs in /jobs/overview."""
    jobs = overview.get("jobs", []) if isinstance(overview, Mapping) else []
    return [
        str(job["jid"]) for job in jobs if isinstance(job, Mapping) and job.get("state") == "RUNNING" and "jid" in job
    ]


def source_vertices(plan: Any) -> list[str]:
    """Vertex ids without inputs in /jobs/<jid>/plan: the sources of the job."""
    nodes = plan.get("plan", plan).get("nodes", []) if isinstance(plan, Mapping) else []
    return [str(node["id"]) for node in nodes if isinstance(node, Mapping) and "id" in node and not node.get("inputs")]


def source_operator_metrics(listing: Any) -> list[str]:
    """The source operators' own output counters ("Source__<name>.numRecordsOut") in a vertex's
    metric listing (/vertices/<vid>/subtasks/metrics). They count what the source emitted; the task's
    numRecordsOut counts what leaves the chain, which chained filters make smaller."""
    entries = listing if isinstance(listing, list) else []
    ids = [str(entry.get("id", "")) for entry in entries if isinstance(entry, Mapping)]
    return sorted(name for name in ids if name.startswith("Source") and name.endswith("." + RECORDS_OUT))


def metric_sums(aggregated: Any) -> dict[str, float]:
    """{metric id: sum over subtasks} of a ``?get=...&agg=sum`` answer; NaN and non-numbers left out
    (Flink reports busy time as NaN until it can measure it)."""
    sums: dict[str, float] = {}
    for entry in aggregated if isinstance(aggregated, list) else []:
        if not isinstance(entry, Mapping) or "id" not in entry:
            continue
        value = entry.get("sum")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            sums[str(entry["id"])] = float(value)
    return sums


def update_interval_of(config: Any) -> float | None:
    """metrics.fetcher.update-interval in seconds from /jobmanager/config ([{"key", "value"}]);
    values are milliseconds ("10000") or durations ("10 s", "10000 ms")."""
    for entry in config if isinstance(config, list) else []:
        if isinstance(entry, Mapping) and entry.get("key") == "metrics.fetcher.update-interval":
            return parse_duration_ms(str(entry.get("value", ""))) / 1000.0 if entry.get("value") else None
    return None


_UNITS_MS = {"ms": 1.0, "milli": 1.0, "millis": 1.0, "s": 1000.0, "sec": 1000.0, "second": 1000.0,
             "seconds": 1000.0, "min": 60_000.0, "m": 60_000.0, "minute": 60_000.0, "minutes": 60_000.0}


def parse_duration_ms(text: str) -> float:
    """Flink's duration syntax in milliseconds: a bare number is milliseconds."""
    text = text.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz ").strip()
    unit = text[len(number):].strip() or "ms"
    try:
        return float(number) * _UNITS_MS[unit]
    except (ValueError, KeyError):
        raise FlinkRestError(f"metrics.fetcher.update-interval: cannot read {text!r}") from None


# ---------------------------------------------------------------- task threads

COMM_LENGTH = 15  # the kernel keeps this much of a thread's name (comm), the root frame of our stacks
_TASK_THREAD = re.compile(r"^(?P<chain>.+) \((?P<index>\d+)/(?P<parallelism>\d+)\)#(?P<attempt>\d+)$")


@dataclass(frozen=True)
class TaskThread:
    """A Flink task thread's name, "<chain> (<subtask>/<parallelism>)#<attempt>", subtask from 1."""

    chain: str
    subtask: int
    parallelism: int
    attempt: int


def parse_task_thread(name: str) -> TaskThread | None:
    found = _TASK_THREAD.match(name)
    if found is None:
        return None
    return TaskThread(found["chain"], int(found["index"]), int(found["parallelism"]), int(found["attempt"]))


def vertex_of_thread(thread: str, vertex_names: Sequence[str]) -> str | None:
    """The job vertex (its chain name) a task thread runs: from the chain itself (the stacks' root frame
    when the full name was known, profiler/scope/threadnames.py) or a full thread name, the chain; from the
    kernel's 15-character prefix, the one vertex whose thread names start with it (None when it fits
    several, e.g. two vertices named alike, or none)."""
    if thread in vertex_names:
        return thread
    parsed = parse_task_thread(thread)
    if parsed is not None and parsed.chain in vertex_names:
        return parsed.chain
    if len(thread) != COMM_LENGTH:
        return None
    fitting = {name for name in vertex_names if f"{name} (".startswith(thread)}
    return fitting.pop() if len(fitting) == 1 else None


@dataclass(frozen=True)
class VertexCpu:
    """A vertex's task threads as we sampled them, beside Flink's own view of the same window."""

    window: VertexWindow
    samples: int  # of its task threads, on every host
    on_cpu_ms_per_s: float  # sampled on-CPU time per subtask: samples / Hz / seconds / parallelism


def vertex_cpu(
    thread_samples: Mapping[str, int], vertices: Sequence[VertexWindow], frequency: float, seconds: float
) -> list[VertexCpu]:
    """Per vertex, the on-CPU time of its task threads from the samples per thread name (the root frame
    of the folded stacks, all workload processes): comparable with Flink's busyTimeMsPerSecond, which
    also counts time a busy task waits (locks, I/O, GC). Vertices of the same name (several jobs) are
    one, since their threads cannot be told apart."""
    names = sorted({v.name for v in vertices})
    per_vertex = dict.fromkeys(names, 0)
    for thread, count in thread_samples.items():
        name = vertex_of_thread(thread, names)
        if name is not None:
            per_vertex[name] += count
    found: list[VertexCpu] = []
    for vertex in vertices:
        if any(f.window.name == vertex.name for f in found):
            continue
        samples = per_vertex[vertex.name]
        per_second = samples / frequency / seconds / max(vertex.parallelism, 1) * 1000 if frequency and seconds else 0.0
        found.append(VertexCpu(vertex, samples, per_second))
    return found


# ---------------------------------------------------------------- where subtasks run

_RPC_ADDRESS = re.compile(r"@(?P<host>\[[^\]]+\]|[^:/]+):(?P<port>\d+)/")


def vertex_subtasks(jid: str, details: Any) -> list[FlinkSubtask]:
    """The subtasks of /jobs/<jid>/vertices/<vid> with their TaskManager (REST counts subtasks from 0,
    thread names from 1: stored as the thread name says)."""
    if not isinstance(details, Mapping):
        return []
    found = []
    for entry in details.get("subtasks", []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("subtask"), int):
            continue
        attempt = entry.get("attempt")
        found.append(FlinkSubtask(
            jid, str(details.get("id", "")), str(details.get("name", "")), entry["subtask"] + 1,
            attempt if isinstance(attempt, int) else 0, str(entry.get("taskmanager-id", "")),
            str(entry.get("endpoint", "")),
        ))
    return found


def taskmanagers_of(listing: Any) -> list[FlinkTaskManager]:
    """/taskmanagers: each TaskManager's id, data port and RPC address (no PID: that is per host)."""
    entries = listing.get("taskmanagers", []) if isinstance(listing, Mapping) else []
    found = []
    for entry in entries:
        if not isinstance(entry, Mapping) or "id" not in entry:
            continue
        address = _RPC_ADDRESS.search(str(entry.get("path", "")))
        data_port = entry.get("dataPort")
        found.append(FlinkTaskManager(
            str(entry["id"]), data_port if isinstance(data_port, int) and data_port > 0 else None,
            int(address["port"]) if address else None, address["host"].strip("[]") if address else "",
        ))
    return found


def taskmanager_pids(
    taskmanagers: Sequence[FlinkTaskManager], listening: Mapping[int, Collection[int]]
) -> list[FlinkTaskManager]:
    """Each TaskManager with the PID (of ``listening``: PID → its LISTEN ports on this host) that listens on
    its data port and, when known, its RPC port: two ports of one process, so a TaskManager of another
    host with the same data port is not taken for ours."""
    found = []
    for manager in taskmanagers:
        wanted = {port for port in (manager.data_port, manager.rpc_port) if port is not None}
        owners = [pid for pid, ports in listening.items() if wanted and wanted <= set(ports)]
        found.append(replace(manager, pid=owners[0] if len(owners) == 1 else None))
    return found


# ---------------------------------------------------------------- refreshes and interpolation


@dataclass(frozen=True)
class Refresh:
    """One refresh of the JobManager's metric cache: its values reached the cache after ``lower`` (the
    last reading that still showed the previous values was sent then) and before ``upper`` (the first
    reading that showed these ``values`` was sent then). ``trigger`` is when the JobManager started the
    fetch that brought them (its lastUpdateTime), when known: the TaskManagers report their counters
    right then, while the cache may take seconds more to show them on a loaded machine."""

    lower: float
    upper: float
    values: Mapping[SeriesKey, float]
    trigger: float | None = None
    done: float = 0.0  # when the reading that showed ``values`` had its last answer

    @property
    def at(self) -> float:
        return self.trigger + TRIGGER_TO_CAPTURE if self.trigger is not None else (self.lower + self.upper) / 2

    @property
    def spread(self) -> float:
        return TRIGGER_SPREAD if self.trigger is not None else (self.upper - self.lower) / 2


@dataclass(frozen=True)
class Point:
    at: float  # when the value was captured (estimate)
    spread: float  # ± seconds on ``at``
    value: float


@dataclass(frozen=True)
class Estimate:
    """A counter's change over the window: ``value`` ± ``uncertainty`` (about one standard error:
    timing of the refreshes, and how much the rate varied between them)."""

    value: float
    uncertainty: float
    extrapolated: float  # seconds of the window's ends that lay beyond the first/last refresh


def _rates(points: Sequence[Point]) -> list[float]:
    return [(b.value - a.value) / (b.at - a.at) for a, b in zip(points, points[1:])]


def _value_at(points: Sequence[Point], rates: Sequence[float], when: float) -> tuple[float, float, float]:
    """(value, uncertainty, seconds extrapolated) of a cumulative counter at ``when``: linear between
    refreshes; beyond the first or last one at the mean rate over all of them."""
    first, last = points[0], points[-1]
    mean = (last.value - first.value) / (last.at - first.at)
    if len(rates) > 1:
        spread = math.sqrt(sum((r - mean) ** 2 for r in rates) / (len(rates) - 1))
    else:
        spread = abs(mean) * UNKNOWN_RATE_SPREAD
    if when <= first.at or when >= last.at:
        anchor = first if when <= first.at else last
        distance = abs(when - anchor.at)
        uncertainty = math.hypot(abs(mean) * anchor.spread, spread * distance)
        return anchor.value + mean * (when - anchor.at), uncertainty, distance
    index = next(i for i in range(len(rates)) if points[i].at <= when <= points[i + 1].at)
    left, right, rate = points[index], points[index + 1], rates[index]
    length = right.at - left.at
    weight = (when - left.at) / length
    timing = abs(rate) * math.hypot((1 - weight) * left.spread, weight * right.spread)
    # The counter bends between refreshes as much as the rate changes from one segment to the next.
    neighbours = [rates[i] for i in (index - 1, index + 1) if 0 <= i < len(rates)]
    change = max((abs(rate - r) for r in neighbours), default=abs(rate) * UNKNOWN_RATE_SPREAD)
    bend = change / 2 * (when - left.at) * (right.at - when) / length
    return left.value + rate * (when - left.at), math.hypot(timing, bend), 0.0


def counter_change(points: Sequence[Point], start: float, end: float) -> Estimate | None:
    """How much a cumulative counter grew over [start, end], from its values at refreshes; None with
    fewer than two refreshes at different times."""
    points = sorted(points, key=lambda p: p.at)
    if len(points) < 2 or points[-1].at <= points[0].at:
        return None
    points = [p for i, p in enumerate(points) if i == 0 or p.at > points[i - 1].at]
    rates = _rates(points)
    begin, u_begin, x_begin = _value_at(points, rates, start)
    finish, u_finish, x_finish = _value_at(points, rates, end)
    # A counter starts at 0 (a job that started inside the window is extrapolated no further back).
    begin, finish = max(begin, 0.0), max(finish, 0.0)
    return Estimate(finish - begin, math.hypot(u_begin, u_finish), x_begin + x_finish)


# ---------------------------------------------------------------- one JobManager


@dataclass
class Vertex:
    job: str
    vertex: str
    name: str
    parallelism: int
    source: bool
    metrics: tuple[str, ...]  # the ids read at every poll


@dataclass
class FlinkJobManager:
    """Polls one JobManager's REST API through the window and keeps every refresh of its metric cache.

    ``poll()`` takes one reading (one metric request per job vertex); ``next_poll_at()`` says when the
    next one is due: every ``BASE_POLL_SECONDS``, and every ``FAST_POLL_SECONDS`` from the moment the
    next refresh may be triggered until it shows. ``run(stop)`` does that in a thread.
    """

    base_url: str
    fetch: Fetch
    clock: Callable[[], float] = time.time
    update_interval: float = DEFAULT_UPDATE_INTERVAL
    interval_source: str = "default"
    vertices: dict[tuple[str, str], Vertex] = field(default_factory=dict)
    job_names: dict[str, str] = field(default_factory=dict)
    seen: list[Refresh] = field(default_factory=list)  # every reading that showed a change, as it came
    triggers: list[float] = field(default_factory=list)  # distinct lastUpdateTime values seen
    first_seen: dict[str, float] = field(default_factory=dict)  # job id → first reading that listed it
    last_running: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)  # the last few
    failures: int = 0
    readings: int = 0
    _last_values: dict[SeriesKey, float] = field(default_factory=dict)
    _last_send: float | None = None
    _first_send: float = 0.0
    _baseline: Refresh | None = None
    _asked: set[tuple[str, str]] = field(default_factory=set)  # vertices the last reading asked about
    _trigger_vertex: tuple[str, str] | None = None  # the vertex whose back-pressure answer has a timestamp
    _last_discover: float = -math.inf
    _changed: threading.Condition = field(default_factory=lambda: threading.Condition(threading.RLock()))

    @property
    def label(self) -> str:
        return f"flink-rest:{self.base_url}"

    def _get(self, path: str) -> Any:
        return self.fetch(f"{self.base_url}{path}")

    def configure(self) -> None:
        """Read metrics.fetcher.update-interval; the default stays when the JobManager does not say."""
        try:
            found = update_interval_of(self._get("/jobmanager/config"))
        except Exception as exc:  # noqa: BLE001 - any failure here only keeps the default
            self.note_error(f"/jobmanager/config: {exc}")
            return
        if found and found > 0:
            self.update_interval, self.interval_source = found, "jobmanager config"

    def discover(self) -> None:
        """Running jobs and their vertices; a vertex's metric ids are fixed when it is first seen (a
        source's operator counters are looked up again until they appear)."""
        self._last_discover = self.clock()
        running = running_jobs(self._get("/jobs/overview"))
        self.last_running = set(running)
        for jid in running:
            self.first_seen.setdefault(jid, self._last_discover)
            if not any(key[0] == jid for key in self.vertices):
                self._add_job(jid)
            for vertex in [v for v in self.vertices.values() if v.job == jid and v.source]:
                if not any(m.startswith("Source") for m in vertex.metrics):
                    self._list_source_metrics(vertex)

    def _add_job(self, jid: str) -> None:
        details = self._get(f"/jobs/{jid}")
        sources = set(source_vertices(self._get(f"/jobs/{jid}/plan")))
        if not isinstance(details, Mapping):
            raise FlinkRestError(f"/jobs/{jid}: not a JSON object")
        self.job_names[jid] = str(details.get("name", ""))
        for entry in details.get("vertices", []):
            if not isinstance(entry, Mapping) or "id" not in entry:
                continue
            vid = str(entry["id"])
            parallelism = entry.get("parallelism")
            self.vertices[(jid, vid)] = Vertex(
                jid, vid, str(entry.get("name", vid)), parallelism if isinstance(parallelism, int) else 1,
                vid in sources, VERTEX_METRICS,
            )

    def _list_source_metrics(self, vertex: Vertex) -> None:
        listing = self._get(f"/jobs/{vertex.job}/vertices/{vertex.vertex}/subtasks/metrics")
        vertex.metrics = VERTEX_METRICS + tuple(source_operator_metrics(listing))

    def read(self) -> tuple[float, dict[SeriesKey, float], float]:
        """One reading of every vertex's counters: (send time of its first request, values, the time
        its last answer came)."""
        if self.clock() - self._last_discover >= DISCOVER_SECONDS:
            self.discover()
        sent = self.clock()
        values: dict[SeriesKey, float] = {}
        asked = [(jid, vid) for jid, vid in self.vertices if jid in self.last_running]
        for jid, vid in asked:
            vertex = self.vertices[(jid, vid)]
            path = f"/jobs/{jid}/vertices/{vid}/subtasks/metrics?get={','.join(vertex.metrics)}&agg=sum"
            for metric, value in metric_sums(self._get(path)).items():
                values[(jid, vid, metric)] = value
        done = self.clock()
        self._read_trigger(asked)
        return sent, values, done

    def _read_trigger(self, vertices: Sequence[tuple[str, str]]) -> None:
        """The JobManager's lastUpdateTime (when its latest metric fetch started), which the
        back-pressure endpoint reports as ``end-timestamp``; read after the values, so it is never
        older than the fetch that brought them. A vertex without task metrics in the cache yet answers
        without one ("deprecated"): the next vertex is asked."""
        for jid, vid in sorted(vertices, key=lambda key: key != self._trigger_vertex):
            try:
                answer = self._get(f"/jobs/{jid}/vertices/{vid}/backpressure")
            except Exception:  # noqa: BLE001 - without it refreshes are timed by the readings alone
                return
            stamp = answer.get("end-timestamp") if isinstance(answer, Mapping) else None
            if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and stamp > 0:
                self._trigger_vertex = (jid, vid)
                when = stamp / 1000.0
                if not self.triggers or when > self.triggers[-1]:
                    self.triggers.append(when)
                return

    def poll(self) -> None:
        """One reading; a reading that differs from the previous one shows a refresh."""
        sent, values, done = self.read()
        asked = {key for key in self.vertices if key[0] in self.last_running}  # what read() asked about
        self.readings += 1
        previous, self._last_values = self._last_values, values
        last_send, self._last_send = self._last_send, sent
        if last_send is None:
            self._first_send = sent
            self._baseline = Refresh(sent, sent, values, done=done)
        # A value that changed, or one that a vertex asked for last time did not have yet (the cache
        # of a JobManager nobody asked before fills at its first refresh).
        changed = any(
            previous.get(key, value) != value or (key not in previous and key[:2] in self._asked)
            for key, value in values.items()
        )
        self._asked = asked
        if last_send is None or not changed:
            return
        with self._changed:
            self.seen.append(Refresh(last_send, sent, values, done=done))
            self._changed.notify_all()

    @property
    def refreshes(self) -> list[Refresh]:
        """The cache's refreshes, timed by the fetches' starts when the JobManager tells them, else by
        the readings around them."""
        with self._changed:
            return self._stamped() if self.triggers else self._bracketed()

    def _settled(self, change: Refresh) -> bool:
        return self.clock() - change.upper >= SETTLE_SECONDS

    def _stamped(self) -> list[Refresh]:
        """One refresh per fetch start: the fetch's values are those of the last reading answered
        before the next fetch started (the next cannot start before this one reached the cache, and
        all its TaskManagers answered by then). It needs a change answered after its start, or, for a
        fetch from before the first reading, to have been complete by then. A reading whose requests
        straddle a fetch's start may show part of its values: it is evidence for that fetch only."""
        refreshes = []
        everything = ([self._baseline] if self._baseline else []) + self.seen
        for index, trigger in enumerate(self.triggers):
            following = self.triggers[index + 1] if index + 1 < len(self.triggers) else math.inf
            after = [c for c in self.seen if trigger < c.done and c.done < following - STAMP_SLACK]
            if after and (following < math.inf or self._settled(after[-1])):
                refreshes.append(Refresh(after[0].lower, after[-1].upper, after[-1].values, trigger))
                continue
            before = [c for c in everything if c.done < following - STAMP_SLACK]
            if not after and before and trigger + SETTLE_SECONDS <= self._first_send:
                refreshes.append(Refresh(trigger, self._first_send, before[-1].values, trigger))
        return refreshes

    def _bracketed(self) -> list[Refresh]:
        """Without fetch starts: each change bracketed by the readings around it. The TaskManagers'
        answers to one fetch reach the cache one by one: changes closer than half the update interval
        are one refresh, complete at the last of them."""
        refreshes: list[Refresh] = []
        for change in self.seen:
            if refreshes and change.upper - refreshes[-1].upper < self.update_interval / 2:
                refreshes[-1] = Refresh(refreshes[-1].lower, change.upper, change.values)
            else:
                refreshes.append(change)
        if refreshes and not self._settled(self.seen[-1]):
            refreshes.pop()
        return refreshes

    def next_poll_at(self) -> float:
        now = self.clock()
        if self._last_send is None:
            return now
        # The first reading may have triggered a fetch; the next can start one update interval after
        # the last. Until that moment is known (no fetch start told, no refresh bracketed narrowly:
        # the cache's age is unknown or another client triggers them) a quicker pace keeps it narrow.
        bracketed = [] if self.triggers else self._bracketed()
        if self.triggers:
            due, known = self.triggers[-1] + self.update_interval, True
            if not any(c.upper > self.triggers[-1] + STAMP_SLACK for c in self.seen[-3:]):
                due = self.triggers[-1]  # a fetch is under way: its values come any moment
        elif bracketed:
            due, known = bracketed[-1].lower + self.update_interval, bracketed[-1].spread <= NARROW_SECONDS
        else:
            due, known = self._first_send, False
        base = self._last_send + (BASE_POLL_SECONDS if known else SEARCH_POLL_SECONDS)
        if due - FAST_POLL_SECONDS <= self._last_send < due + FAST_SPAN_SECONDS:
            return self._last_send + FAST_POLL_SECONDS
        if self.seen and not self._settled(self.seen[-1]):
            return min(base, self._last_send + SETTLE_POLL_SECONDS)
        if self._last_send >= due:  # overdue (someone else triggers them): base pace
            return base
        return min(base, due + 0.01)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll()
                delay = self.next_poll_at() - self.clock()
            except Exception as exc:  # noqa: BLE001 - the JobManager may go away; keep what was read
                self.note_error(str(exc))
                delay = BASE_POLL_SECONDS
            if stop.wait(max(0.0, delay)):
                return

    def note_error(self, message: str) -> None:
        self.failures += 1
        self.errors = [*self.errors[-4:], message]

    def wait_for_refresh_after(self, when: float, timeout: float) -> bool:
        """Block until a refresh that happened after ``when`` was seen complete (no change for
        SETTLE_SECONDS since), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._settled_after(when):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, FAST_POLL_SECONDS))
        return True

    def _settled_after(self, when: float) -> bool:
        refreshes = self._stamped() if self.triggers else self._bracketed()
        return bool(refreshes) and refreshes[-1].at - TRIGGER_TO_CAPTURE >= when

    # -------------------------------------------------------------- the window

    def placement(self) -> tuple[list[FlinkSubtask], list[FlinkTaskManager]]:
        """Where each subtask of the running jobs runs now, and the cluster's TaskManagers (REST; raises)."""
        subtasks = [
            subtask
            for (jid, vid) in sorted(self.vertices)
            if jid in self.last_running
            for subtask in vertex_subtasks(jid, self._get(f"/jobs/{jid}/vertices/{vid}"))
        ]
        return subtasks, taskmanagers_of(self._get("/taskmanagers"))

    def points(self, key: SeriesKey) -> list[Point]:
        return [Point(r.at, r.spread, r.values[key]) for r in self.refreshes if key in r.values]

    def change(self, key: SeriesKey, start: float, end: float) -> Estimate | None:
        return counter_change(self.points(key), start, end)

    def source_count(self, jid: str, start: float, end: float) -> tuple[Estimate, list[str]] | None:
        """Records the job's source operators emitted in [start, end] and the metrics used; None when a
        source vertex has fewer than two refreshes."""
        counted = [self.source_records(v, start, end) for v in self.vertices.values() if v.job == jid and v.source]
        if not counted or any(c is None for c in counted):
            return None
        found = [c for c in counted if c is not None]
        # The same refreshes bound every vertex's counter: their errors add up, not in quadrature.
        total = Estimate(sum(e.value for e, _ in found), sum(e.uncertainty for e, _ in found),
                         max(e.extrapolated for e, _ in found))
        return total, [metric for _, used in found for metric in used]

    def vertex_windows(self, start: float, end: float) -> list[VertexWindow]:
        return [self.vertex_window(vertex, start, end) for _, vertex in sorted(self.vertices.items())]

    def vertex_window(self, vertex: Vertex, start: float, end: float) -> VertexWindow:
        """The vertex's records and its busy/back-pressured/idle milliseconds per second (the mean of
        its subtasks) over [start, end]; None where fewer than two refreshes carried the metric."""
        def change(metric: str) -> Estimate | None:
            return self.change((vertex.job, vertex.vertex, metric), start, end)

        def per_second(metric: str) -> float | None:
            estimate = change(metric)
            return estimate.value / max(end - start, 1e-9) / vertex.parallelism if estimate else None

        records_in, records_out = change(RECORDS_IN), change(RECORDS_OUT)
        counted = self.source_records(vertex, start, end) if vertex.source else None
        source = counted[0] if counted else None
        return VertexWindow(
            vertex.job, self.job_names.get(vertex.job, ""), vertex.vertex, vertex.name, vertex.parallelism,
            vertex.source,
            records_in.value if records_in else None, records_in.uncertainty if records_in else None,
            records_out.value if records_out else None, records_out.uncertainty if records_out else None,
            source.value if source else None, source.uncertainty if source else None,
            per_second(TIME_METRICS["busy"]), per_second(TIME_METRICS["backpressured"]),
            per_second(TIME_METRICS["idle"]),
        )

    def source_records(self, vertex: Vertex, start: float, end: float) -> tuple[Estimate, list[str]] | None:
        """What a source vertex's source operators emitted (their own numRecordsOut), else what left
        its task (numRecordsOut: the chain's output, smaller when chained operators filter)."""
        operator = [m for m in vertex.metrics if m.startswith("Source")]
        estimates = [self.change((vertex.job, vertex.vertex, m), start, end) for m in operator]
        found = [e for e in estimates if e is not None]
        if operator and len(found) == len(operator):
            return Estimate(sum(e.value for e in found), sum(e.uncertainty for e in found),
                            max(e.extrapolated for e in found)), operator
        task = self.change((vertex.job, vertex.vertex, RECORDS_OUT), start, end)
        return (task, [RECORDS_OUT]) if task is not None else None
