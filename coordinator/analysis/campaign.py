"""Campaign rows: the cluster rows (host ``*``, pid ``*``) of a multi-run summary.csv turned into one
row per run and task with cycles per event and its 95 % interval, and the figure data of the campaign
page (`coordinator campaign`, docs/campaigns.md). Pure: summary rows in, rows and JSON out.

Nothing is summed here again: samples, shares, cycles and events are the summary's (the analysis
pipeline's) cells; this module divides them by the run's events and attaches the run labels.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.analysis.rows import ALL, SUMMARY_COLUMNS, cell_number
from profiler.capture import format as capture
from profiler.errors import CaptureFormatError, ConfigError

CAMPAIGN_FILE = "campaign.csv"
# Fixed columns of campaign.csv, in order; the run labels follow (the summary's label columns).
CAMPAIGN_COLUMNS: tuple[str, ...] = (
    "run",
    "engine",
    "task",
    "events",
    *capture.TASK_MEASURES,
    "cycles_per_event",
    "cycles_per_event_ci95",
    "ipc",
    "stalled_cycles_frontend_per_event",
    "stalled_cycles_backend_per_event",
)
_NUMBER_WITH_SUFFIX = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([kKmMgG]?)\s*$")
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


@dataclass(frozen=True)
class CampaignRow:
    """One run and task of a campaign; ``labels`` are the run's labels by key."""

    run: str
    task: str
    labels: Mapping[str, str]
    values: Mapping[str, Any]  # the CAMPAIGN_COLUMNS cells


def summary_label_columns(header: Sequence[str]) -> list[str]:
    """The run-label columns of a summary.csv header: everything after the fixed columns."""
    return [column for column in header if column not in SUMMARY_COLUMNS]


def label_key_column(key: str, label_columns: Sequence[str]) -> str:
    """The summary column of label ``key`` (``label_<key>`` when the key shadows a fixed column)."""
    for candidate in (key, f"label_{key}"):
        if candidate in label_columns and not (candidate == key and key in SUMMARY_COLUMNS):
            return candidate
    known = ", ".join(sorted(c.removeprefix("label_") for c in label_columns)) or "none"
    raise ConfigError(f"no run has the label {key!r} (labels: {known}); record it with --label {key}=VALUE")


def label_value_number(text: str) -> float | None:
    """A label value as a number for the x axis: ``20000``, ``2.5``, ``50k``, ``1M``; None otherwise."""
    match = _NUMBER_WITH_SUFFIX.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _SUFFIX[match.group(2).lower()]


def campaign_rows(summary: Sequence[Mapping[str, str]], label_columns: Sequence[str]) -> list[CampaignRow]:
    """Per run (summary order: runs sorted by id) and task (profile order, ``unmatched``, ``*``): the
    cluster row's figures, cycles per event and its 95 % interval (docs/campaigns.md)."""
    cluster = [r for r in summary if r.get("host") == ALL and r.get("pid") == ALL]
    if summary and not cluster:
        raise CaptureFormatError("the summary has no cluster rows (host *, pid *); re-run `coordinator analyze`")
    totals = {r["run"]: r for r in cluster if r.get("task") == ALL}
    out = []
    for row in cluster:
        total = totals.get(row["run"])
        labels = {_label_key(column): row.get(column) or "" for column in label_columns}
        out.append(CampaignRow(row["run"], row["task"], labels, _values(row, total)))
    return out


def _label_key(column: str) -> str:
    """``label_engine`` -> ``engine``: the key the user wrote (rows.label_columns renamed it)."""
    return column.removeprefix("label_")


def _values(row: Mapping[str, str], total: Mapping[str, str] | None) -> dict[str, Any]:
    number = cell_number
    events = number(row.get("events"))
    share_ci95 = number(row.get("share_ci95"))
    total_cycles = number(total.get("cycles")) if total is not None else None
    values: dict[str, Any] = {
        "run": row["run"],
        "engine": row.get("engine") or None,
        "task": row["task"],
        "events": _integral(events),
        "samples": _integral(number(row.get("samples"))),
        "share": number(row.get("share")),
        "share_ci95": share_ci95,
        "cycles": number(row.get("cycles")),
        "cycles_estimated": row.get("cycles_estimated") or None,
        "cpu_seconds": number(row.get("cpu_seconds")),
        "cycles_per_event": number(row.get("cycles_per_event")),
        "cycles_per_event_ci95": None,
        "ipc": number(row.get("ipc")),
    }
    if events and share_ci95 is not None and total_cycles is not None:
        # A task's cycles are its share of the run's samples times the run's cycles (paper, 3.3): the
        # share's sampling interval, scaled the same way, is the interval of its cycles per event.
        values["cycles_per_event_ci95"] = share_ci95 * total_cycles / events
    for column in ("stalled_cycles_frontend", "stalled_cycles_backend"):
        stalls = number(row.get(column))
        values[f"{column}_per_event"] = stalls / events if stalls is not None and events else None
    return values


def _integral(value: float | None) -> int | None:
    return None if value is None else int(value)


def format_campaign(rows: Sequence[CampaignRow], label_columns: Sequence[str]) -> str:
    """campaign.csv text: CAMPAIGN_COLUMNS, then the summary's label columns; same input, same bytes."""
    flat = [{**r.values, **{column: r.labels.get(_label_key(column)) for column in label_columns}} for r in rows]
    return capture.format_result_csv(flat, CAMPAIGN_COLUMNS + tuple(label_columns))


def default_series(label_columns: Sequence[str]) -> str:
    """What separates the lines when --series is not given: the ``spe`` label (the demo and the
    paper's runs carry it), else the summary's ``engine`` column."""
    return "spe" if "spe" in {_label_key(c) for c in label_columns} else "engine"


def _series_of(row: CampaignRow, series: str) -> str:
    if series == "engine" and "engine" not in row.labels:
        return str(row.values.get("engine") or "")
    return row.labels.get(series, "")


def figure_data(rows: Sequence[CampaignRow], by: str, series: str) -> dict[str, Any]:
    """The campaign page's payload: x values (``by`` label) in order, tasks in profile order, one point
    per run and task with its series, cycles per event and interval, and per run its IPC."""
    xs = sorted({r.labels.get(by, "") for r in rows}, key=_x_order(rows, by))
    numeric = all(label_value_number(x) is not None for x in xs) and bool(xs)
    tasks: list[str] = []
    for row in rows:
        if row.task != ALL and row.task not in tasks:
            tasks.append(row.task)
    points = []
    for row in rows:
        x = row.labels.get(by, "")
        points.append(
            {
                "run": row.run,
                "task": row.task,
                "series": _series_of(row, series),
                "x": x,
                "xValue": label_value_number(x) if numeric else None,
                "cpe": row.values["cycles_per_event"],
                "ci": row.values["cycles_per_event_ci95"],
                "share": row.values["share"],
                "ipc": row.values["ipc"] if row.task == ALL else None,
                "estimated": row.values["cycles_estimated"] == "1",
            }
        )
    return {
        "by": by,
        "series": series,
        "numeric": numeric,
        "xs": xs,
        "seriesValues": sorted({p["series"] for p in points}),
        "tasks": tasks,
        "points": points,
        "totalTask": ALL,
    }


def _x_order(rows: Sequence[CampaignRow], by: str) -> Any:
    """Sort key of x values: numerically when every value is a number, else by text."""
    values = {r.labels.get(by, "") for r in rows}
    if values and all(label_value_number(v) is not None for v in values):
        return lambda v: (label_value_number(v), v)
    return lambda v: (0.0, v)


@dataclass(frozen=True)
class LevelCell:
    """Cycles per event of one task at one (series, x) level: the mean over its runs (repeats)."""

    cycles_per_event: float
    ci95: float | None  # the mean of the runs' half-widths (not narrowed by repeats: samples are correlated)
    runs: int


def level_table(
    rows: Sequence[CampaignRow], by: str, series: str
) -> tuple[list[tuple[str, str]], list[tuple[str, list[LevelCell | None]]]]:
    """The page's table: columns are the (series, x) levels, lines the tasks (``*`` last) with their
    cycles per event at each level."""
    order = _x_order(rows, by)
    levels = sorted(
        {(_series_of(r, series), r.labels.get(by, "")) for r in rows}, key=lambda level: (level[0], order(level[1]))
    )
    grouped: dict[tuple[str, str, str], list[CampaignRow]] = {}
    tasks: list[str] = []
    for row in rows:
        if row.task not in tasks:
            tasks.append(row.task)
        if row.values["cycles_per_event"] is not None:
            grouped.setdefault((_series_of(row, series), row.labels.get(by, ""), row.task), []).append(row)
    tasks = [t for t in tasks if t != ALL] + ([ALL] if ALL in tasks else [])
    lines = []
    for task in tasks:
        cells: list[LevelCell | None] = []
        for level in levels:
            members = grouped.get((*level, task), [])
            if not members:
                cells.append(None)
                continue
            cis = [m.values["cycles_per_event_ci95"] for m in members if m.values["cycles_per_event_ci95"] is not None]
            cells.append(
                LevelCell(
                    statistics.fmean(m.values["cycles_per_event"] for m in members),
                    statistics.fmean(cis) if cis else None,
                    len(members),
                )
            )
        lines.append((task, cells))
    return levels, lines
