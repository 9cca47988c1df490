"""Flink job vertices and subtasks of a run: each sample's subtask from its task thread's full name
(contexts.json: "<chain> (i/n)#attempt"), the TaskManager that ran it (flink.json's placement), and the
operators of a chain its samples belong to (leaf first, the matcher's rule, with the patterns that
coordinator/analysis/flinkdraft.py derives from the job graph), as summary.csv's optional vertex rows
(``coordinator analyze --by vertex``). Pure: counts and payloads in, rows out; ``read_pid_vertices``
is the one reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.analysis.flinkdraft import (
    MAILBOX_WAIT,
    OPERATOR_UNKNOWN,
    TASK_INPUT,
    TASK_MAILBOX,
    escape_pattern,
    frames_by_vertex,
    operator_patterns,
    operator_position,
    operator_task_name,
    operators_of,
)
from coordinator.analysis.inputs import RunInput, cost_fields, sampled_pids
from coordinator.analysis.offcpucut import ContextOffCpu, add_offcpu, read_context_offcpu, task_causes
from coordinator.analysis.rows import ALL, SUMMARY_COLUMNS, sum_known
from profiler.capture.folded import FRAME_SEPARATOR
from profiler.capture.format import OFFCPU_COLUMNS, FlinkSubtask
from profiler.capture.read import read_pid_table
from profiler.engines.flinkmetrics import TaskThread, parse_task_thread
from profiler.matching.aggregate import offcpu_columns
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher
from profiler.matching.stats import share_ci95

# summary.csv columns that only vertex rows fill (after the fixed columns, before run labels)
VERTEX_COLUMNS: tuple[str, ...] = ("vertex", "subtask", "attempt", "taskmanager", "operator")
# Flink's helper threads carry a task's name after their own ("OutputFlusher for <chain> (1/2)#0"):
# they are not the task's thread, and their samples are not the subtask's.
HELPER_PREFIXES = ("OutputFlusher for ", "Time Trigger for ")


def task_thread_of(name: str, chains: Collection[str]) -> TaskThread | None:
    """The subtask a thread name says it runs: a chain of the run (any chain when none is known),
    never a helper thread."""
    parsed = parse_task_thread(name)
    if parsed is None or name.startswith(HELPER_PREFIXES):
        return None
    return parsed if not chains or parsed.chain in chains else None


def subtask_stacks(
    contexts: Mapping[tuple[str, str], int], stacks: Mapping[str, int], chains: Collection[str]
) -> dict[TaskThread, Counter[str]]:
    """Subtask → its stacks (root frame: the chain) → samples, from one PID's contexts; a capture
    that kept the full thread name as the root frame (format 3 before the chain became the kind)
    gives its subtasks from the root frames."""
    found: dict[TaskThread, Counter[str]] = {}
    for (context, stack), count in contexts.items():
        thread = task_thread_of(context, chains)
        if thread is not None:
            found.setdefault(thread, Counter())[stack] += count
    for stack, count in stacks.items():
        root, _, rest = stack.partition(FRAME_SEPARATOR)
        thread = task_thread_of(root, chains)
        if thread is not None:
            found.setdefault(thread, Counter())[
                FRAME_SEPARATOR.join((thread.chain, rest)) if rest else thread.chain
            ] += count
    return found


class ChainOperators:
    """Which operator of a chain a stack of the chain's task thread belongs to. Per chain, a profile of
    its operators (flinkdraft's patterns from the frames under the chain's threads): the first frame
    from the leaf that names one (profiler/matching/matcher.py). Where that frame lies rootward of the
    innermost operator the stack entered (Flink's ``processElement``/``processWatermark``/``emitNext``
    of its operator classes, counted from the root: flinkdraft.operator_position), or no frame names
    one, the entered operator decides: the JIT may inline a user function into Flink's operator code,
    and the frames between two operators (the chaining output, the next operator's own code) are the
    inner one's. A stack that entered no operator but is reading the task's input goes to the chain's
    head, one taking mail (waiting for input or a timer) to MAILBOX_WAIT; the rest (the mailbox loop's
    own checks, stacks cut short, stubs with no caller) is OPERATOR_UNKNOWN."""

    def __init__(self, stacks: Mapping[str, int], chains: Sequence[str]) -> None:
        frames = frames_by_vertex(stacks, chains)
        self._matchers: dict[str, tuple[Matcher, dict[str, str]]] = {}
        self._chains = {chain: tuple(operators_of(chain)) for chain in chains}
        for chain in chains:
            lines, names = [], {}
            for operator, patterns in operator_patterns(chain, frames[chain]):
                task = operator_task_name(operator)
                if patterns and task not in names:
                    names[task] = operator
                    lines.append(f"{task}: {', '.join(escape_pattern(p) for p in patterns)}")
            if lines:
                profile = parse_profile("\n".join(lines) + "\n", f"<operators of {chain}>")
                self._matchers[chain] = (Matcher(profile), names)
        self._decided: dict[tuple[str, str], str] = {}

    def operators(self, chain: str) -> tuple[str, ...]:
        """The operators of ``chain``, in chain order, each name once ("Map -> Map" has one row)."""
        return tuple(dict.fromkeys(self._positions(chain)))

    def _positions(self, chain: str) -> tuple[str, ...]:
        return self._chains.get(chain) or tuple(operators_of(chain))

    def operator_of(self, chain: str, stack: str) -> str:
        key = (chain, stack)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(chain, stack.split(FRAME_SEPARATOR))
            self._decided[key] = decided
        return decided

    def _decide(self, chain: str, frames: Sequence[str]) -> str:
        named, decider = OPERATOR_UNKNOWN, None
        found = self._matchers.get(chain)
        if found is not None:
            task, decider = found[0].decide(frames)
            named = found[1].get(task, OPERATOR_UNKNOWN)
        chain_operators = self._positions(chain)
        depth, entry = operator_position(frames)
        if entry is not None and chain_operators and (decider is None or decider <= entry):
            return chain_operators[min(depth, len(chain_operators)) - 1]
        if named != OPERATOR_UNKNOWN or not chain_operators:
            return named
        if any(TASK_INPUT in f for f in frames):
            return chain_operators[0]
        return MAILBOX_WAIT if any(f.startswith(TASK_MAILBOX) for f in frames) else OPERATOR_UNKNOWN


@dataclass(frozen=True)
class PidVertices:
    """One TaskManager process's subtasks as sampled, and what it takes to turn samples into cycles."""

    host: str
    pid: int
    samples: int  # all samples of the PID
    cycles: float | None
    cpu_seconds: float | None
    cycles_estimated: bool | None
    subtasks: Mapping[TaskThread, Counter[str]]  # subtask → stack → samples
    # subtask → task → cause → blocked ns of its task thread (--off-cpu); None: not measured
    offcpu: Mapping[TaskThread, Mapping[str, Counter[str]]] | None = None


def subtask_offcpu(blocked: ContextOffCpu, chains: Collection[str]) -> dict[TaskThread, dict[str, Counter[str]]]:
    """Subtask → task → cause → blocked nanoseconds, from the blocked time per thread context."""
    out: dict[TaskThread, dict[str, Counter[str]]] = {}
    for context, tasks in blocked.items():
        thread = task_thread_of(context, chains)
        if thread is not None:
            add_offcpu(out.setdefault(thread, {}), tasks)
    return out


def read_pid_vertices(run: RunInput, chains: Collection[str], matcher: Matcher | None = None) -> list[PidVertices]:
    """Every workload PID of the run with samples (or, with ``matcher``, blocked time) of Flink task threads,
    over its intervals (the sub-window's when the inputs were restricted) (I/O: reads the captures)."""
    out = []
    for capture_dir, pid in sampled_pids(run):
        table = read_pid_table(capture_dir, pid.process.pid)
        if table is None:
            continue
        if pid.intervals is not None:
            table = table.within(*pid.intervals)
        stacks = table.folded()
        subtasks = subtask_stacks(table.context_counts(), stacks, chains)
        blocked = read_context_offcpu(capture_dir, pid, matcher) if matcher is not None else None
        offcpu = subtask_offcpu(blocked, chains) if blocked is not None else None
        for thread in offcpu or ():
            subtasks.setdefault(thread, Counter())  # blocked all along: a subtask without samples
        if subtasks:
            out.append(
                PidVertices(
                    host=pid.host,
                    pid=pid.process.pid,
                    samples=sum(stacks.values()),
                    subtasks=subtasks,
                    offcpu=offcpu,
                    **cost_fields(pid.counters),
                )
            )
    return out


def placement_of(subtasks: Iterable[FlinkSubtask]) -> dict[tuple[str, int, int], str]:
    """(chain, subtask from 1, attempt) → TaskManager id, from flink.json's subtasks."""
    return {(s.name, s.subtask, s.attempt): s.taskmanager for s in subtasks}


def _row(run: str, host: str, pid: Any, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS + VERTEX_COLUMNS)
    row.update(run=run, host=host, pid=pid, role="workload", engine="flink", task=ALL, operator="")
    row.update(values)
    return row


def _fill(row: dict[str, Any], samples: int, total: int, pid: PidVertices | None, ci: bool) -> dict[str, Any]:
    row["samples"] = samples
    row["share"] = samples / total if total else None
    row["share_ci95"] = share_ci95(samples, total) if total and ci else 0.0
    if pid is not None:
        fraction = samples / pid.samples if pid.samples else 0.0
        row["cycles"] = None if pid.cycles is None else pid.cycles * fraction
        row["cpu_seconds"] = None if pid.cpu_seconds is None else pid.cpu_seconds * fraction
        row["cycles_estimated"] = pid.cycles_estimated
    return row


def _subtask_rows(
    run: str,
    pid: PidVertices,
    thread: TaskThread,
    stacks: Counter[str],
    values: Mapping[str, Any],
    task_of: Callable[[str], str],
    operators: ChainOperators,
) -> list[dict[str, Any]]:
    """A subtask's ``*`` row (share of its PID's samples), then per profile task and per operator of the
    chain (share of the subtask's samples)."""
    total = sum(stacks.values())
    blocked = pid.offcpu.get(thread, {}) if pid.offcpu is not None else None
    rows = [_fill(_row(run, pid.host, pid.pid, **values), total, pid.samples, pid, ci=True)]
    rows[0].update(offcpu_columns(task_causes(blocked, None), rows[0].get("cpu_seconds")))
    tasks: Counter[str] = Counter()
    by_operator: Counter[str] = Counter()
    for stack, count in stacks.items():
        tasks[task_of(stack)] += count
        by_operator[operators.operator_of(thread.chain, stack)] += count
    for task in blocked or ():
        tasks.setdefault(task, 0)  # blocked, never sampled on a CPU
    for task, count in sorted(tasks.items(), key=lambda item: (-item[1], item[0])):
        rows.append(_fill(_row(run, pid.host, pid.pid, **values, task=task), count, total, pid, ci=True))
        rows[-1].update(offcpu_columns(task_causes(blocked, task), rows[-1].get("cpu_seconds")))
    for operator in (*operators.operators(thread.chain), MAILBOX_WAIT, OPERATOR_UNKNOWN):
        count = by_operator.get(operator, 0)
        rows.append(_fill(_row(run, pid.host, pid.pid, **values, operator=operator), count, total, pid, ci=True))
    return rows


def vertex_rows(
    run: str,
    pids: Sequence[PidVertices],
    placement: Mapping[tuple[str, int, int], str],
    task_of: Callable[[str], str],
    operators: ChainOperators,
) -> list[dict[str, Any]]:
    """Vertex rows of one run: per job vertex its cluster rows (host and pid ``*``, subtask ``*``: the
    vertex's samples and cycles summed over subtasks, then per operator of the chain), then per subtask
    (the PID that ran it) its rows (``_subtask_rows``). docs/summary-format.md."""
    by_vertex: dict[str, list[tuple[PidVertices, TaskThread]]] = {}
    for pid in pids:
        for thread in pid.subtasks:
            by_vertex.setdefault(thread.chain, []).append((pid, thread))
    all_samples = sum(pid.samples for pid in pids)
    rows: list[dict[str, Any]] = []
    for chain in sorted(by_vertex):
        members = sorted(by_vertex[chain], key=lambda m: (m[1].subtask, m[1].attempt, m[0].host, m[0].pid))
        subtask_rows: list[dict[str, Any]] = []
        for pid, thread in members:
            values = {
                "vertex": chain,
                "subtask": f"{thread.subtask}/{thread.parallelism}",
                "attempt": thread.attempt,
                "taskmanager": placement.get((chain, thread.subtask, thread.attempt)),
            }
            subtask_rows += _subtask_rows(run, pid, thread, pid.subtasks[thread], values, task_of, operators)
        rows += _vertex_totals(run, chain, subtask_rows, all_samples)
        rows += subtask_rows
    return rows


def _vertex_totals(
    run: str, chain: str, subtask_rows: Sequence[Mapping[str, Any]], all_samples: int
) -> list[dict[str, Any]]:
    """The vertex's cluster rows from its subtasks' rows: the ``*`` row (share of every sampled
    TaskManager's samples), then one row per operator (share of the vertex's samples)."""
    totals = [r for r in subtask_rows if r["task"] == ALL and not r["operator"]]
    samples = sum(int(r["samples"]) for r in totals)
    out = []
    for operator in ["", *dict.fromkeys(str(r["operator"]) for r in subtask_rows if r["operator"])]:
        members = [r for r in subtask_rows if r["task"] == ALL and r["operator"] == operator]
        count = sum(int(r["samples"]) for r in members)
        row = _fill(
            _row(run, ALL, ALL, vertex=chain, subtask=ALL, operator=operator),
            count,
            all_samples if not operator else samples,
            None,
            ci=True,
        )
        row["cycles"] = sum_known(r.get("cycles") for r in members)
        row["cpu_seconds"] = sum_known(r.get("cpu_seconds") for r in members)
        row["cycles_estimated"] = any(bool(r.get("cycles_estimated")) for r in members)
        if not operator:  # blocked time is per subtask and task, not per operator of the chain
            row.update({column: sum_known(r.get(column) for r in members) for column in OFFCPU_COLUMNS})
        out.append(row)
    return out


@dataclass(frozen=True)
class VertexLine:
    """One job vertex in the report: its samples, and per operator of the chain its share."""

    vertex: str
    samples: int
    cycles: float | None
    operators: tuple[tuple[str, float], ...]  # (operator, share of the vertex's samples), chain order
    unknown_share: float  # "chain, operator unknown"


@dataclass(frozen=True)
class SubtaskLine:
    """One subtask in the report: where it ran and what it cost."""

    vertex: str
    subtask: str
    attempt: str
    taskmanager: str
    host: str
    pid: str
    samples: int
    share: float  # of its process's samples
    cycles: float | None
    top_tasks: tuple[tuple[str, float], ...]


def _number(value: Any) -> float | None:
    return float(value) if value not in (None, "") else None


def vertex_lines(
    rows: Iterable[Mapping[str, str]], top: int = 3
) -> tuple[tuple[VertexLine, ...], tuple[SubtaskLine, ...]]:
    """The report's vertex and subtask tables from summary.csv's vertex rows."""
    rows = [r for r in rows if r.get("vertex")]
    vertices = []
    for row in rows:
        if row.get("host") == ALL and row.get("subtask") == ALL and not row.get("operator"):
            operators = [
                r for r in rows if r.get("host") == ALL and r.get("vertex") == row["vertex"] and r.get("operator")
            ]
            known = tuple(
                (str(r["operator"]), _number(r.get("share")) or 0.0)
                for r in operators
                if r["operator"] != OPERATOR_UNKNOWN
            )
            unknown = next(
                (_number(r.get("share")) or 0.0 for r in operators if r["operator"] == OPERATOR_UNKNOWN), 0.0
            )
            vertices.append(
                VertexLine(
                    str(row["vertex"]),
                    int(_number(row.get("samples")) or 0),
                    _number(row.get("cycles")),
                    known,
                    unknown,
                )
            )
    subtasks = []
    for row in rows:
        if row.get("host") == ALL or row.get("task") != ALL or row.get("operator"):
            continue
        mine = [
            r
            for r in rows
            if r.get("host") == row["host"]
            and r.get("pid") == row["pid"]
            and r.get("vertex") == row["vertex"]
            and r.get("subtask") == row["subtask"]
            and r.get("attempt") == row["attempt"]
            and r.get("task") != ALL
        ]
        shares = sorted(((str(r["task"]), _number(r.get("share")) or 0.0) for r in mine), key=lambda i: -i[1])
        subtasks.append(
            SubtaskLine(
                str(row["vertex"]),
                str(row["subtask"]),
                str(row.get("attempt") or ""),
                str(row.get("taskmanager") or ""),
                str(row["host"]),
                str(row["pid"]),
                int(_number(row.get("samples")) or 0),
                _number(row.get("share")) or 0.0,
                _number(row.get("cycles")),
                tuple(item for item in shares[:top] if item[1] > 0),
            )
        )
    return tuple(vertices), tuple(subtasks)
