"""Typed records of the report's view (task lines, process lines, health lines, host sections).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.analysis.stages import StageLine
from coordinator.analysis.vertices import SubtaskLine, VertexLine
from coordinator.report.offcpuview import OffCpuTable


@dataclass(frozen=True)
class TaskLine:
    task: str
    color: str
    samples: float | None
    share: float | None
    share_ci95: float | None
    cycles: float | None
    cycles_estimated: bool
    cpu_seconds: float | None
    events: float | None = None
    cycles_per_event: float | None = None


@dataclass(frozen=True)
class ProcessLine:
    host: str
    pid: int
    user: str  # whose process: the report holds its stacks and thread names (docs/security.md)
    role: str
    engine: str
    kind: str
    cmdline: str
    samples: float | None
    cycles: float | None
    cycles_estimated: bool
    cpu_seconds: float | None
    instructions: float | None
    ipc: float | None
    preserve_frame_pointer: bool | None
    jvm_version: str | None
    exited: bool
    lost: int
    truncated: int
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class HealthLine:
    level: str  # "ok", "warn", "bad", "info"
    topic: str
    text: str


@dataclass(frozen=True)
class HostSection:
    name: str
    state: str
    reason: str
    hostname: str
    kernel: str
    window: str
    cycles_source: str
    warnings: tuple[str, ...]
    tasks: tuple[TaskLine, ...]


@dataclass(frozen=True)
class FlinkVertexLine:
    """One Flink job vertex: Flink's own times beside the sampled on-CPU time (ms per second per subtask)."""

    name: str
    job: str
    parallelism: int
    source: bool
    records_in: float | None  # sources: records their source operators emitted
    records_in_uncertainty: float | None
    busy_ms_per_s: float | None
    backpressured_ms_per_s: float | None
    idle_ms_per_s: float | None
    on_cpu_ms_per_s: float
    busy_off_cpu_ms_per_s: float | None  # busy minus on CPU: waiting on locks, I/O, GC while busy
    samples: int
    # the task threads' blocked time per cause (ms/s per subtask, CAUSES order, only causes > 0) when the
    # run had --off-cpu: () when no blocked thread could be tied to the vertex (not measured); None: no --off-cpu
    off_cpu_by_cause: tuple[tuple[str, float], ...] | None = None
    # the same per profile task (most blocked first; the off-CPU rule, docs/offcpu.md), each its causes in
    # ms/s per subtask; None: no --off-cpu or no profile's decisions given
    off_cpu_by_task: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] | None = None


@dataclass(frozen=True)
class ReportView:
    """What the templates show: tables as records, the JavaScript payload as one JSON object."""

    title: str
    run_id: str
    bare_capture: bool
    meta: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    health: tuple[HealthLine, ...]
    cluster_tasks: tuple[TaskLine, ...]
    cluster_tasks_note: str
    events_note: str  # events processed in the window and where the number came from, or ""
    show_cycles_per_event: bool
    hosts: tuple[HostSection, ...]
    processes: tuple[ProcessLine, ...]
    candidates: tuple[tuple[str, int, float], ...]
    unmatched_samples: int
    profile_text: str | None
    profile_source: str | None
    payload: dict[str, Any]
    task_names: tuple[str, ...]
    stages: tuple[StageLine, ...] = ()  # Spark stages (analyze --by stage)
    codegen: tuple[tuple[int, str], ...] = ()  # whole-stage-codegen stage N and its operators
    flink_vertices: tuple[FlinkVertexLine, ...] = ()
    flink_note: str = ""
    vertex_lines: tuple[VertexLine, ...] = ()  # Flink vertices and their operators (analyze --by vertex)
    subtask_lines: tuple[SubtaskLine, ...] = ()
    flink_run: bool = False  # a Flink run: the vertex section says how to get its rows when there are none
    offcpu: OffCpuTable = OffCpuTable((), (), "")  # blocked time per task and cause (runs with --off-cpu)
    latency_note: str = ""  # YSB's latency per window (coordinator demo with Redis), or ""
    latency_detail: str = ""  # how that latency was measured


