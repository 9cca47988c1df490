"""Spark stages of a run: each sample's stage from its task thread's full name (contexts.json), joined
with the driver's REST view (spark.json: stage → job → SQL execution, micro-batch, codegen operators),
as summary.csv's optional stage rows (``coordinator analyze --by stage``) and as the names of
``GeneratedIteratorForCodegenStage<N>`` frames. Pure: payloads and counts in, rows and names out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.analysis.decide import TaskDecider
from coordinator.analysis.inputs import RunInput, cost_fields, sampled_pids
from coordinator.analysis.offcpucut import ContextOffCpu, add_offcpu, read_context_offcpu, task_causes
from coordinator.analysis.rows import ALL, SUMMARY_COLUMNS, sum_known
from profiler.capture.read import read_pid_table, read_spark_plans
from profiler.engines.sparkplan import codegen_stage_of, parse_task_thread
from profiler.matching.aggregate import offcpu_columns
from profiler.matching.stats import share_ci95

# summary.csv columns that only stage rows fill (after the fixed columns, before run labels)
STAGE_COLUMNS: tuple[str, ...] = ("stage", "job", "query", "batch")


@dataclass(frozen=True)
class StageInfo:
    """What the driver said about one stage (all None when its REST API was not reachable)."""

    job: int | None = None
    execution: int | None = None
    query: str | None = None  # the execution's description's first line (the query's name)
    batch: int | None = None  # micro-batch number (Structured Streaming)


@dataclass(frozen=True)
class SparkIndex:
    """Every driver's stages and codegen stages of one run (the union of its hosts' spark.json)."""

    stages: Mapping[int, StageInfo] = field(default_factory=dict)
    codegen: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # N -> operators, most seen plan
    codegen_by_execution: Mapping[int, Mapping[int, tuple[str, ...]]] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    plan_operators: frozenset[str] = frozenset()  # every operator of every plan read (codegen or not)

    @property
    def reachable(self) -> bool:
        return bool(self.sources)

    def stage(self, stage_id: int) -> StageInfo:
        return self.stages.get(stage_id, StageInfo())

    def operators(self, codegen_stage: int, stage_id: int | None = None) -> tuple[str, ...]:
        """Operators of codegen stage N: of the plan that ran ``stage_id`` when known, else the usual plan."""
        if stage_id is not None:
            execution = self.stage(stage_id).execution
            by_n = self.codegen_by_execution.get(execution) if execution is not None else None
            if by_n and codegen_stage in by_n:
                return by_n[codegen_stage]
        return self.codegen.get(codegen_stage, ())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def spark_index(payloads: Iterable[Mapping[str, Any]]) -> SparkIndex:
    """Join the spark.json payloads of a run's hosts; entries of an unexpected shape are skipped."""
    stages: dict[int, StageInfo] = {}
    by_execution: dict[int, dict[int, tuple[str, ...]]] = {}
    executions: dict[int, Mapping[str, Any]] = {}
    jobs: dict[int, Mapping[str, Any]] = {}
    sources: list[str] = []
    notes: list[str] = []
    stage_jobs: dict[int, int | None] = {}
    seen_operators: set[str] = set()
    for payload in payloads:
        notes += [str(note) for note in payload.get("notes") or () if isinstance(note, str)]
        for plan in payload.get("plans") or ():
            if not isinstance(plan, Mapping):
                continue
            sources.append(str(plan.get("source") or ""))
            for job in plan.get("jobs") or ():
                if isinstance(job, Mapping) and _int(job.get("job")) is not None:
                    jobs[job["job"]] = job
            for execution in plan.get("executions") or ():
                if isinstance(execution, Mapping) and _int(execution.get("execution")) is not None:
                    executions[execution["execution"]] = execution
                    operators = execution.get("operators")
                    if isinstance(operators, list):
                        seen_operators.update(str(op) for op in operators)
                    codegen = execution.get("codegen")
                    if isinstance(codegen, Mapping):
                        by_execution[execution["execution"]] = {
                            int(n): tuple(str(op) for op in ops)
                            for n, ops in codegen.items()
                            if str(n).isdigit() and isinstance(ops, list)
                        }
            for stage in plan.get("stages") or ():
                if isinstance(stage, Mapping) and _int(stage.get("stage")) is not None:
                    stage_jobs[stage["stage"]] = _int(stage.get("job"))
    for stage_id, job_id in stage_jobs.items():
        job = jobs.get(job_id, {}) if job_id is not None else {}
        execution_id = _int(job.get("execution"))
        execution = executions.get(execution_id, {}) if execution_id is not None else {}
        stages[stage_id] = StageInfo(
            job=job_id,
            execution=execution_id,
            query=str(execution.get("description") or "") or None,
            batch=_int(execution.get("batch")),
        )
    usual: dict[int, Counter[tuple[str, ...]]] = {}
    for by_n in by_execution.values():
        for n, operators in by_n.items():
            usual.setdefault(n, Counter())[operators] += 1
    codegen = {n: variants.most_common(1)[0][0] for n, variants in usual.items()}
    seen_operators |= {op for by_n in by_execution.values() for ops in by_n.values() for op in ops}
    return SparkIndex(
        stages, codegen, by_execution, tuple(sources), tuple(dict.fromkeys(notes)), frozenset(seen_operators)
    )


def read_spark_index(run: RunInput) -> SparkIndex:
    """The run's SparkIndex from every host capture's spark.json (captures before format 3 have none)."""
    payloads = []
    for host in run.hosts:
        if host.capture_dir is not None:
            payload = read_spark_plans(host.capture_dir)
            if payload is not None:
                payloads.append(payload)
    return spark_index(payloads)


def stage_task_counts(context_tasks: Mapping[str, Mapping[str, int]]) -> dict[str, Counter[str]]:
    """Spark stage ("12.0") → task of the profile → samples, from context (full thread name) → task →
    samples: the samples whose thread ran a Spark task."""
    out: dict[str, Counter[str]] = {}
    for context, tasks in context_tasks.items():
        task = parse_task_thread(context)
        if task is not None:
            out.setdefault(task.stage_label, Counter()).update(tasks)
    return out


@dataclass(frozen=True)
class PidStages:
    """One PID's stage counts and what it takes to turn samples into cycles."""

    samples: int  # all samples of the PID
    cycles: float | None
    cpu_seconds: float | None
    cycles_estimated: bool | None
    stages: Mapping[str, Counter[str]]
    # stage -> task -> cause -> blocked ns of the PID's task threads (--off-cpu); None: not measured
    offcpu: Mapping[str, Mapping[str, Counter[str]]] | None = None


def stage_offcpu(blocked: ContextOffCpu) -> dict[str, dict[str, Counter[str]]]:
    """Spark stage ("12.0") -> task -> cause -> blocked nanoseconds, from the blocked time per thread
    context: the time of the threads that ran a Spark task."""
    out: dict[str, dict[str, Counter[str]]] = {}
    for context, tasks in blocked.items():
        task = parse_task_thread(context)
        if task is not None:
            add_offcpu(out.setdefault(task.stage_label, {}), tasks)
    return out


def read_pid_stages(run: RunInput, decider: TaskDecider) -> list[PidStages]:
    """Every workload PID of the run with thread contexts, over its intervals (the sub-window's when the
    inputs were restricted) (I/O: reads the captures; a stack table's stacks decided from frame ids)."""
    out = []
    for capture_dir, pid in sampled_pids(run):
        table = read_pid_table(capture_dir, pid.process.pid)
        if table is not None and pid.intervals is not None:
            table = table.within(*pid.intervals)
        contexts = decider.context_tasks(table) if table is not None else {}
        blocked = read_context_offcpu(capture_dir, pid, decider.matcher)
        offcpu = stage_offcpu(blocked) if blocked is not None else None
        if not contexts and not offcpu:
            continue
        out.append(
            PidStages(
                samples=table.samples if table is not None else 0,
                stages=stage_task_counts(contexts),
                offcpu=offcpu,
                **cost_fields(pid.counters),
            )
        )
    return out


def _stage_sort_key(label: str) -> tuple[int, int]:
    stage, _, attempt = label.partition(".")
    return (int(stage) if stage.isdigit() else -1, int(attempt) if attempt.isdigit() else 0)


def stage_rows(
    run: str, task_names: Sequence[str], pids: Sequence[PidStages], index: SparkIndex
) -> list[dict[str, Any]]:
    """Cluster rows (host ``*``, pid ``*``) per Spark stage and task, then the stage's ``*`` row.

    share = the task's samples in the stage / the stage's samples; cycles and CPU seconds are each
    PID's (samples of the task in the stage / all samples of the PID) × the PID's totals, summed.
    """
    labels = sorted({label for pid in pids for label in (*pid.stages, *(pid.offcpu or ()))}, key=_stage_sort_key)
    measured = any(pid.offcpu is not None for pid in pids)
    rows: list[dict[str, Any]] = []
    for label in labels:
        info = index.stage(_stage_sort_key(label)[0])
        stage_total = sum(sum(pid.stages.get(label, Counter()).values()) for pid in pids)
        for task in (*task_names, ALL):
            row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS + STAGE_COLUMNS)
            row.update(run=run, host=ALL, pid=ALL, role="workload", engine="spark", task=task)
            row.update(stage=label, job=info.job, query=info.query, batch=info.batch)
            cycles: list[float | None] = []
            cpu: list[float | None] = []
            samples = 0
            for pid in pids:
                counts = pid.stages.get(label, Counter())
                mine = sum(counts.values()) if task == ALL else counts.get(task, 0)
                samples += mine
                fraction = mine / pid.samples if pid.samples else 0.0
                cycles.append(None if pid.cycles is None else pid.cycles * fraction)
                cpu.append(None if pid.cpu_seconds is None else pid.cpu_seconds * fraction)
            row["samples"] = samples
            row["share"] = samples / stage_total if stage_total else None
            row["share_ci95"] = share_ci95(samples, stage_total) if stage_total and task != ALL else 0.0
            row["cycles"] = sum_known(cycles)
            row["cpu_seconds"] = sum_known(cpu)
            row["cycles_estimated"] = any(bool(pid.cycles_estimated) for pid in pids)
            if measured:
                blocked = _stage_blocked(pids, label, None if task == ALL else task)
                row.update(offcpu_columns(blocked, row["cpu_seconds"]))
            rows.append(row)
    return rows


def _stage_blocked(pids: Sequence[PidStages], label: str, task: str | None) -> Counter[str]:
    """Blocked nanoseconds per cause of ``task`` (None: all tasks) in stage ``label``, over the PIDs."""
    causes: Counter[str] = Counter()
    for pid in pids:
        causes.update(task_causes((pid.offcpu or {}).get(label, {}), task) or Counter())
    return causes


def codegen_note(codegen_stage: int, operators: Sequence[str]) -> str:
    return f"[codegen stage {codegen_stage}: {', '.join(operators)}]"


def annotate_codegen_frames(names: Sequence[str], index: SparkIndex) -> list[str]:
    """Frame names with ``GeneratedIteratorForCodegenStage<N>`` frames followed by the operators Spark
    fused into stage N (the plan most executions ran); other names unchanged."""
    out = []
    for name in names:
        n = codegen_stage_of(name)
        operators = index.codegen.get(n, ()) if n is not None else ()
        out.append(f"{name} {codegen_note(n, operators)}" if n is not None and operators else name)
    return out


@dataclass(frozen=True)
class StageLine:
    """One Spark stage in the report: Spark's ids, the samples of its tasks and their top profile tasks."""

    stage: str
    job: str
    query: str
    batch: str
    samples: int
    cycles: float | None
    top_tasks: tuple[tuple[str, float], ...]  # (task, share of the stage's samples), largest first


def stage_lines(rows: Iterable[Mapping[str, str]], top: int = 3) -> tuple[StageLine, ...]:
    """The report's stage table from summary.csv's stage rows (cluster rows only)."""
    by_stage: dict[str, list[Mapping[str, str]]] = {}
    for row in rows:
        if row.get("host") == ALL and row.get("pid") == ALL and row.get("stage"):
            by_stage.setdefault(str(row["stage"]), []).append(row)
    lines = []
    for label in sorted(by_stage, key=_stage_sort_key):
        members = by_stage[label]
        total = next((r for r in members if r.get("task") == ALL), None)
        if total is None:
            continue
        shares = sorted(
            ((str(r["task"]), float(r.get("share") or 0)) for r in members if r.get("task") != ALL),
            key=lambda item: -item[1],
        )
        cycles = total.get("cycles")
        lines.append(
            StageLine(
                stage=label,
                job=str(total.get("job") or ""),
                query=str(total.get("query") or ""),
                batch=str(total.get("batch") or ""),
                samples=int(float(total.get("samples") or 0)),
                cycles=float(cycles) if cycles not in (None, "") else None,
                top_tasks=tuple((task, share) for task, share in shares[:top] if share > 0),
            )
        )
    return tuple(lines)
