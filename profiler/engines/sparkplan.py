"""Spark's own view of the work the sampled threads did: stage → job → SQL execution (micro-batch) and
the operators of each whole-stage-codegen stage, read from the driver's REST API during the window.

A Spark task thread's full name (profiler/scope/threadnames.py) says its stage and TID; this module turns a
stage id into the job, query and micro-batch it ran for, and ``GeneratedIteratorForCodegenStage<N>``
into the physical operators Spark fused into it (``*(N) Project``, ``*(N) BroadcastHashJoin``, …).
Pure parsing on top, ``SparkPlanCollector`` (I/O: the REST API) below; the capture keeps the result as
``spark.json`` (docs/capture-format.md). When no driver's REST API answers, the capture says why and
everything else works as before.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..capture.format import ProcessInfo
from .discovery import discover_spark, engine_of
from .rest import FINISH_SECONDS, EndpointError, Endpoints, Fetch, Probe, speaks_http
from .sparkbatches import parse_batch_description

POLL_SECONDS = 15.0  # the UI keeps the last spark.ui.retainedStages (1000) stages: read them before eviction
# SQL plans with details are large (a micro-batch's: ~20 KB) and repeat batch after batch: each reading
# fetches the newest few not read yet, so a driver with 1000 retained executions is not asked for all.
DETAILS_PER_POLL = 5

# Executor.TaskRunner: "<pool thread name> for task <partition>.<attempt> in stage <stage>.<attempt> (TID <id>)"
_TASK_THREAD = re.compile(r" for task (\d+)\.(\d+) in stage (\d+)\.(\d+) \(TID (\d+)\)$")
_CODEGEN_CLASS = re.compile(r"GeneratedIteratorForCodegenStage(\d+)(?!\d)")
_PLAN_OPERATOR = re.compile(r"\*\((\d+)\) (\w+)")
_CODEGEN_NODE = re.compile(r"^WholeStageCodegen \((\d+)\)$")


@dataclass(frozen=True)
class SparkTask:
    """The Spark task a thread ran, from its name."""

    stage: int
    stage_attempt: int
    partition: int
    tid: int

    @property
    def stage_label(self) -> str:
        """Spark's own spelling, "12.0" (stage 12, attempt 0)."""
        return f"{self.stage}.{self.stage_attempt}"


def parse_task_thread(name: str) -> SparkTask | None:
    """The task of an executor thread named by Spark's TaskRunner; None for any other name."""
    match = _TASK_THREAD.search(name)
    if match is None:
        return None
    partition, _attempt, stage, stage_attempt, tid = (int(group) for group in match.groups())
    return SparkTask(stage, stage_attempt, partition, tid)


def codegen_stage_of(frame: str) -> int | None:
    """N of a ``GeneratedIteratorForCodegenStage<N>`` frame; None for other frames."""
    match = _CODEGEN_CLASS.search(frame)
    return int(match.group(1)) if match else None


def codegen_operators(execution: Mapping[str, Any]) -> dict[int, list[str]]:
    """Codegen stage N → its operators, inputs first as the REST API lists the plan graph, from one SQL
    execution's REST details: the graph's nodes (``wholeStageCodegenId``), else the ``*(N) Operator``
    lines of ``planDescription``."""
    found: dict[int, list[str]] = {}
    for node in execution.get("nodes") or ():
        if not isinstance(node, Mapping):
            continue
        stage, name = node.get("wholeStageCodegenId"), str(node.get("nodeName") or "")
        if isinstance(stage, int) and name and not _CODEGEN_NODE.match(name):
            operators = found.setdefault(stage, [])
            if name not in operators:
                operators.append(name)
    if found:
        return found
    for stage_text, name in _PLAN_OPERATOR.findall(str(execution.get("planDescription") or "")):
        operators = found.setdefault(int(stage_text), [])
        if name not in operators:
            operators.append(name)
    return found


def plan_operators(execution: Mapping[str, Any]) -> list[str]:
    """Every physical operator of one SQL execution's plan graph, inputs first (the REST API's order),
    each name once."""
    names: list[str] = []
    for node in execution.get("nodes") or ():
        name = str(node.get("nodeName") or "") if isinstance(node, Mapping) else ""
        if name and not _CODEGEN_NODE.match(name) and name not in names:
            names.append(name)
    return names


def _ints(values: Any) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)] if isinstance(values, list) else []


@dataclass
class SparkPlan:
    """What one driver said: stages → job, jobs → execution, executions with batch and codegen operators."""

    source: str
    app_id: str
    stages: dict[int, dict[str, Any]]
    jobs: dict[int, dict[str, Any]]
    executions: dict[int, dict[str, Any]]

    def read_listing(self, stages: Any, jobs: Any, executions: Any) -> list[int]:
        """Merge one reading of /stages, /jobs and /sql; the execution ids whose details are still to read."""
        for stage in stages if isinstance(stages, list) else ():
            if isinstance(stage, Mapping) and isinstance(stage.get("stageId"), int):
                key = stage["stageId"]
                self.stages.setdefault(key, {"stage": key, "name": str(stage.get("name") or ""), "job": None})
        for job in jobs if isinstance(jobs, list) else ():
            if isinstance(job, Mapping) and isinstance(job.get("jobId"), int):
                job_id = job["jobId"]
                self.jobs.setdefault(job_id, {"job": job_id, "execution": None})
                self.jobs[job_id].update(
                    description=str(job.get("description") or job.get("name") or ""), group=job.get("jobGroup")
                )
                for stage_id in _ints(job.get("stageIds")):
                    self.stages.setdefault(stage_id, {"stage": stage_id, "name": "", "job": None})["job"] = job_id
        todo = []
        for execution in executions if isinstance(executions, list) else ():
            if not (isinstance(execution, Mapping) and isinstance(execution.get("id"), int)):
                continue
            execution_id = execution["id"]
            for key in ("successJobIds", "runningJobIds", "failedJobIds"):
                for job_id in _ints(execution.get(key)):
                    self.jobs.setdefault(job_id, {"job": job_id, "description": "", "group": None})
                    self.jobs[job_id]["execution"] = execution_id
            if execution_id not in self.executions:
                description = str(execution.get("description") or "")
                batch = parse_batch_description(description)
                self.executions[execution_id] = {
                    "execution": execution_id,
                    "description": description.splitlines()[0] if description else "",
                    "query_id": batch.query_id if batch else None,
                    "batch": batch.batch if batch else None,
                    "codegen": None,
                }
            if self.executions[execution_id]["codegen"] is None:
                todo.append(execution_id)
        return todo

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "app_id": self.app_id,
            "stages": [self.stages[k] for k in sorted(self.stages)],
            "jobs": [self.jobs[k] for k in sorted(self.jobs)],
            "executions": [
                {**e, "codegen": {str(n): ops for n, ops in sorted((e["codegen"] or {}).items())}}
                for _k, e in sorted(self.executions.items())
            ],
        }


class SparkPlanCollector:
    """Reads the stages, jobs and SQL plans of the Spark drivers on this host during the window.

    ``start(processes)``/``add_process`` find drivers (the event counter's discovery) in a background
    thread that polls every POLL_SECONDS; ``finish()`` takes a last reading and returns spark.json's
    payload: the plans, and ``notes`` saying why there are none.
    """

    def __init__(self, fetch: Fetch | None = None, poll_seconds: float = POLL_SECONDS) -> None:
        # the drivers' endpoints are the profiled processes' own: refused after a first deadline or oversized
        # answer, every reading over FINISH_SECONDS after finish() (rest.Endpoints)
        self._endpoints = Endpoints() if fetch is None else None
        self.fetch: Fetch = self._endpoints.fetch if self._endpoints is not None else fetch  # type: ignore[assignment]
        self._probe: Probe = self._endpoints.speaks_http if self._endpoints is not None else speaks_http
        self.poll_seconds = poll_seconds
        self._drivers: dict[int, ProcessInfo] = {}
        self._found: set[int] = set()  # drivers whose REST API answered
        self._plans: dict[str, SparkPlan] = {}
        self._notes: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, processes: Sequence[ProcessInfo]) -> None:
        for process in processes:
            self.add_process(process)
        self._thread = threading.Thread(target=self._loop, name="spark-plans", daemon=True)
        self._thread.start()

    def add_process(self, process: ProcessInfo) -> None:
        if engine_of(process) == "spark":
            with self._lock:
                self._drivers.setdefault(process.pid, process)

    def _loop(self) -> None:
        while True:
            self._poll()
            if self._stop.wait(self.poll_seconds):
                return

    def _poll(self) -> None:
        with self._lock:
            pending = [p for pid, p in self._drivers.items() if pid not in self._found]
        for plan in list(self._plans.values()):  # first: finish()'s last reading goes to drivers that answered
            try:
                self._read(plan)
            except EndpointError as exc:
                with self._lock:
                    self._notes.append(str(exc)[:200])
        for process in pending:  # why one did not answer is the event counter's line (the same endpoints)
            try:
                found = discover_spark(process, self.fetch, self._probe)
            except EndpointError:
                found = None
            if found is not None:
                base, app_id = found
                with self._lock:
                    self._found.add(process.pid)
                    self._plans.setdefault(base, SparkPlan(base, app_id, {}, {}, {}))

    def _read(self, plan: SparkPlan) -> None:
        base = f"{plan.source}/api/v1/applications/{plan.app_id}"
        listing = "details=false&planDescription=false&offset=0&length=1000000"
        todo = plan.read_listing(
            self.fetch(f"{base}/stages"), self.fetch(f"{base}/jobs"), self.fetch(f"{base}/sql?{listing}")
        )
        for execution_id in sorted(todo, reverse=True)[:DETAILS_PER_POLL]:
            details = self.fetch(f"{base}/sql/{execution_id}?details=true&planDescription=true")
            if isinstance(details, Mapping):
                plan.executions[execution_id]["codegen"] = codegen_operators(details)
                plan.executions[execution_id]["operators"] = plan_operators(details)

    def finish(self) -> dict[str, Any] | None:
        """The last reading; spark.json's payload (None when no Spark driver was in the scope)."""
        self._stop.set()
        if self._endpoints is not None:
            self._endpoints.end_in(FINISH_SECONDS)  # a request still in flight is cut there (a trickle)
        if self._thread is not None:
            self._thread.join(timeout=120)
        if not self._drivers:
            return None
        started = time.monotonic()
        if self._endpoints is not None:
            self._endpoints.end_in(FINISH_SECONDS)  # the last reading's own time
        self._poll()
        with self._lock:
            plans = [plan.to_json() for plan in self._plans.values()]
            notes = list(dict.fromkeys(self._notes))
            if not plans:
                drivers = ", ".join(str(pid) for pid in sorted(self._drivers)) or "none in the scope"
                notes.insert(0, f"no Spark driver REST API answered (drivers: {drivers}); is spark.ui.enabled off?")
        return {
            "format_version": 1,
            "plans": plans,
            "notes": notes,
            "read_seconds": round(time.monotonic() - started, 3),
        }
