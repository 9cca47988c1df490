"""Spark Structured Streaming's micro-batches read from a driver's SQL REST API: the parsing (pure) and one
driver's polling during the window (SparkDriver), each finished execution read once."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .rest import EndpointError, Fetch

# Each request has its own total deadline (rest.py); this bounds how many a hostile driver can cost.
SPARK_POLL_BUDGET_SECONDS = 60.0  # one poll of a driver; executions left unread are read at the next

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
