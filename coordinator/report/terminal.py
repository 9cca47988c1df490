"""The task tables of summary.csv in a terminal (rich), for ``coordinator summary`` and
``analyze --print``: the report's cluster, host and PID tables without a browser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from coordinator.analysis.rows import cell_number, check_numbers, existing_summary, read_summary
from coordinator.report.formats import format_share, format_si
from profiler.capture.format import ALL_TASKS
from profiler.errors import ConfigError

COLUMNS: tuple[str, ...] = ("task", "samples", "share ± 95 % CI", "cycles", "CPU s", "cycles/event", "multi-task")


@dataclass(frozen=True)
class TaskTable:
    """One table: the task rows (then the `*` total) of one (run, host, pid) level."""

    title: str
    lines: tuple[tuple[str, ...], ...]  # cells in COLUMNS order
    notes: tuple[str, ...] = ()


# The numbers the tables show (and `events`, used in the notes).
NUMBER_COLUMNS = (
    "samples", "share", "share_ci95", "cycles", "cpu_seconds", "cycles_per_event", "multi_task_samples", "events",
)  # fmt: skip


def _cells(row: Mapping[str, str]) -> tuple[str, ...]:
    def number(column: str) -> float | None:
        return cell_number(row.get(column), lenient=True)

    cycles = format_si(number("cycles"))
    if row.get("cycles_estimated") == "1" and cycles != "—":
        cycles += " (est.)"
    samples = number("samples")
    return (
        "total" if row.get("task") == ALL_TASKS else row.get("task", ""),
        "—" if samples is None else f"{int(samples):,}",
        format_share(number("share"), number("share_ci95")),
        cycles,
        format_si(number("cpu_seconds")),
        format_si(number("cycles_per_event")),
        format_si(number("multi_task_samples")),
    )


def _level(row: Mapping[str, str]) -> str:
    if row.get("host") == ALL_TASKS:
        return "cluster"
    return "host" if row.get("pid") == ALL_TASKS else "pid"


def task_tables(
    rows: Iterable[Mapping[str, str]],
    levels: Sequence[str] = ("cluster",),
    hosts: Sequence[str] = (),
) -> list[TaskTable]:
    """Tables of summary.csv rows in file order: per run its cluster table, then (``levels``) host
    and PID tables, only of ``hosts`` when given. A failed host is one line saying so."""
    groups: dict[tuple[str, str, str], list[Mapping[str, str]]] = {}
    for row in rows:
        level = _level(row)
        if level not in levels or (level != "cluster" and hosts and row.get("host") not in hosts):
            continue
        groups.setdefault((row.get("run", ""), row.get("host", ""), row.get("pid", "")), []).append(row)
    tables = []
    for (run, host, pid), group in groups.items():
        first = group[0]
        if host == ALL_TASKS:
            title = f"run {run}: all hosts"
        elif pid == ALL_TASKS:
            title = f"run {run}: host {host}"
        else:
            title = f"run {run}: host {host} PID {pid} ({first.get('role', '')} {first.get('engine', '')})".rstrip()
        notes = []
        if first.get("host_state") not in (None, "", "ok"):
            notes.append(f"host state: {first.get('host_state')}")
        events = cell_number(first.get("events"), lenient=True)
        if events is not None and host == ALL_TASKS:
            notes.append(f"events in the window: {events:,.0f}")
        if first.get("role") in ("managing", "broker"):
            notes.append(f"{first.get('role')} process: not sampled")
        tables.append(TaskTable(title, tuple(_cells(row) for row in group), tuple(notes)))
    return tables


# The columns that give way in a narrow terminal, first to go first: the task name, samples and share stay.
YIELDING_COLUMNS: tuple[str, ...] = ("multi-task", "cycles/event", "CPU s", "cycles")
_GAP = 2  # rich's padding between two columns (box=None, pad_edge=False)


def fitting_columns(tables: Sequence[TaskTable], width: int) -> tuple[int, ...]:
    """Indices into COLUMNS of the columns shown in ``width`` characters: all when they fit, else the
    YIELDING_COLUMNS dropped one by one until every task name fits whole (a name longer than the
    terminal alone is still folded)."""
    from rich.cells import cell_len

    widths = [cell_len(name) for name in COLUMNS]
    for table in tables:
        for cells in table.lines:
            widths = [max(w, cell_len(cell)) for w, cell in zip(widths, cells)]
    shown = list(range(len(COLUMNS)))
    for column in YIELDING_COLUMNS:
        if sum(widths[i] for i in shown) + _GAP * (len(shown) - 1) <= width:
            break
        shown.remove(COLUMNS.index(column))
    return tuple(shown)


def print_tables(tables: Sequence[TaskTable], stream: IO[str] | None = None, width: int | None = None) -> None:
    """The tables with rich: aligned columns on a terminal, plain text in a pipe (80 columns unless
    COLUMNS says otherwise). Task names keep their width: in a narrow terminal the columns of
    YIELDING_COLUMNS are left out, and a note names them. Task names and labels come from files:
    printed as text, never as rich markup."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream, highlight=False, width=width, soft_wrap=False)
    shown = fitting_columns(tables, console.width)
    left_out = [column for index, column in enumerate(COLUMNS) if index not in shown]
    for table_data in tables:
        table: Any = Table(title=Text(table_data.title), title_justify="left", box=None, pad_edge=False)
        for index in shown:
            if index == 0:  # a name is folded, never cut, when even alone it is wider than the terminal
                table.add_column(COLUMNS[index], overflow="fold")
            else:
                table.add_column(COLUMNS[index], justify="right", no_wrap=True)
        for cells in table_data.lines:
            style = "bold" if cells[0] == "total" else ""
            table.add_row(*(Text(cells[index]) for index in shown), style=style)
        console.print(table)
        for note in table_data.notes:
            console.print(Text(f"  {note}"))
        console.print()
    if left_out and tables:
        console.print(Text(f"{console.width} columns: left out {', '.join(left_out)} (COLUMNS=120 shows them)"))


def print_summary(
    run_dir: Path,
    hosts: bool = False,
    pids: bool = False,
    only_hosts: Sequence[str] = (),
    stream: IO[str] | None = None,
) -> None:
    """Print the task tables of ``run_dir``'s summary.csv (`coordinator summary`, `analyze --print`)."""
    summary = existing_summary(Path(run_dir))
    if summary is None:
        raise ConfigError(f"{run_dir}: no summary.csv; run `coordinator analyze {run_dir}` first")
    rows = read_summary(summary, stages=True)
    check_numbers(summary, rows, NUMBER_COLUMNS)  # a damaged cell is named, never printed as "—"
    rows = [row for row in rows if not row.get("stage")]
    known = sorted({row.get("host", "") for row in rows} - {"", ALL_TASKS})
    for host in only_hosts:
        if host not in known:
            raise ConfigError(f"host {host}: not in {summary}; choose from: {', '.join(known)}")
    levels = ("cluster",) + (("host",) if hosts else ()) + (("pid",) if pids else ())
    print(f"{summary}:", file=stream)
    print_tables(task_tables(rows, levels, only_hosts), stream)
