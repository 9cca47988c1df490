"""Pre-aggregation (Algorithm 1, lines 22-24): task shares per PID turned into result rows.

Pure: match results and counters in, ``<host>_result.csv`` rows out (keys of capture.RESULT_COLUMNS,
semantics in docs/capture-format.md). The host agent and the analysis (on Spark or in process) both call it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..capture.format import ALL_TASKS, RESULT_COLUMNS, NetStats, PidCounters, ProcessInfo
from ..capture.offcpu import CAUSES
from .matcher import MatchResult
from .stats import share_ci95

INSTRUCTIONS_EVENT = "instructions"


def _row(host: str, process: ProcessInfo, task: str) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(RESULT_COLUMNS)
    row.update(host=host, pid=process.pid, role=process.role, engine=process.engine, task=task)
    return row


def _scaled(total: float | None, share: float | None) -> float | None:
    return None if total is None or share is None else share * total


def offcpu_columns(by_cause: Mapping[str, int] | None, cpu_seconds: object = None) -> dict[str, object]:
    """The off-CPU columns of one row from blocked nanoseconds per cause (None: no --off-cpu), and its wall
    seconds: ``cpu_seconds`` (the row's on-CPU seconds; None: not measured, and no wall seconds) + off-CPU."""
    if by_cause is None:
        return {}
    offcpu = sum(by_cause.values()) / 1e9
    columns: dict[str, object] = {"offcpu_seconds": offcpu}
    columns.update({f"offcpu_{cause}_seconds": by_cause.get(cause, 0) / 1e9 for cause in CAUSES})
    columns["wall_seconds"] = cpu_seconds + offcpu if isinstance(cpu_seconds, int | float) else None
    return columns


def aggregate_pid(
    host: str,
    process: ProcessInfo,
    result: MatchResult | None,
    counters: PidCounters | None,
    net: NetStats | None,
    offcpu: Mapping[str, Counter[str]] | None = None,
) -> list[dict[str, object]]:
    """Rows of one PID: one per task in ``result`` order (profile order, ``unmatched`` last), then
    the ``*`` row with the PID's totals. Without a result (managing PIDs) only the ``*`` row.

    share = task samples / PID samples; cycles and cpu_seconds = share × the PID's value (paper,
    section 3.3). None means "not measured": no counters, unsupported event, no samples, no --net.
    ``offcpu`` (blocked nanoseconds per task and cause, --off-cpu) is a measured time, not a share.
    """
    cycles = counters.cycles if counters is not None else None
    cycles_estimated = counters.cycles_estimated if counters is not None and cycles is not None else None
    cpu_seconds = counters.cpu_seconds if counters is not None else None
    rows: list[dict[str, object]] = []
    total = result.total_samples if result is not None else None
    if result is not None:
        for task, samples in result.task_samples.items():
            share = samples / total if total else None
            row = _row(host, process, task)
            row.update(
                samples=samples,
                share=share,
                share_ci95=share_ci95(samples, total) if total else None,
                cycles=_scaled(cycles, share),
                cycles_estimated=cycles_estimated,
                cpu_seconds=_scaled(cpu_seconds, share),
            )
            if offcpu is not None:
                row.update(offcpu_columns(offcpu.get(task, Counter()), row["cpu_seconds"]))
            rows.append(row)
    instructions = counters.get(INSTRUCTIONS_EVENT) if counters is not None else None
    # IPC needs measured cycles: instructions over task-clock × nominal Hz is not a pipeline figure.
    ipc = (
        instructions / cycles
        if instructions is not None and cycles and cycles > 0 and not cycles_estimated
        else None
    )
    totals = _row(host, process, ALL_TASKS)
    totals.update(
        samples=total,
        share=1.0 if total else None,
        share_ci95=0.0 if total else None,
        cycles=cycles,
        cycles_estimated=cycles_estimated,
        cpu_seconds=cpu_seconds,
        instructions=instructions,
        ipc=ipc,
    )
    if net is not None:
        totals.update(
            bytes_sent=net.bytes_sent,
            bytes_received=net.bytes_received,
            bytes_sent_external=net.bytes_sent_external,
            bytes_received_external=net.bytes_received_external,
        )
    if offcpu is not None:
        totals.update(offcpu_columns(sum(offcpu.values(), Counter()), cpu_seconds))
    rows.append(totals)
    return rows


def aggregate_host(
    host: str,
    processes: Sequence[ProcessInfo],
    matched: Mapping[int, MatchResult],
    counters: Mapping[int, PidCounters],
    net: Mapping[int, NetStats],
    offcpu: Mapping[int, Mapping[str, Counter[str]]] | None = None,
) -> list[dict[str, object]]:
    """Rows of every PID of a host, ordered by PID. Managing PIDs get only their ``*`` row even when
    ``matched`` holds a result for them; ``offcpu``: blocked nanoseconds per PID, task and cause (--off-cpu)."""
    rows: list[dict[str, object]] = []
    for process in sorted(processes, key=lambda p: p.pid):
        result = matched.get(process.pid) if process.sampled else None
        blocked = offcpu.get(process.pid) if offcpu is not None and process.sampled else None
        rows.extend(
            aggregate_pid(host, process, result, counters.get(process.pid), net.get(process.pid), blocked)
        )
    return rows
