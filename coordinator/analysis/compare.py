"""Comparison of two analysed runs, task by task: cycle and share deltas with a two-proportion test,
and the stacks of each analysis for the differential flamegraph (`coordinator compare`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from coordinator.analysis.rows import ALL, ANALYSIS_FILE, TASKS_DIR, UNMATCHED_FILE, TaskTotals
from profiler.capture import format as capture
from profiler.errors import CaptureFormatError
from profiler.matching.stats import two_proportion_z

COMPARE_COLUMNS: tuple[str, ...] = (
    "task",
    "cycles_a",
    "cycles_b",
    "cycles_delta",
    "cycles_relative_delta",
    "share_a",
    "share_b",
    "share_delta",
    "samples_a",
    "samples_b",
    "z",
    "p_value",
    "significant",
)
SIGNIFICANCE_LEVEL = 0.05


def compare_runs(
    a: Mapping[str, TaskTotals], b: Mapping[str, TaskTotals], level: float = SIGNIFICANCE_LEVEL
) -> list[dict[str, Any]]:
    """Per task (A's order, then tasks only B has, ``*`` last): cycles and share in both runs, deltas
    (B − A), and the pooled two-proportion z-test of the shares; ``significant`` when p < ``level``."""
    tasks = [t for t in a if t != ALL] + [t for t in b if t not in a and t != ALL]
    if ALL in a or ALL in b:
        tasks.append(ALL)
    empty = TaskTotals(0, 0, None, None)
    rows = []
    for task in tasks:
        ta, tb = a.get(task, empty), b.get(task, empty)
        n_a = ta.all_samples or next((t.all_samples for t in a.values()), 0)
        n_b = tb.all_samples or next((t.all_samples for t in b.values()), 0)
        row: dict[str, Any] = dict.fromkeys(COMPARE_COLUMNS)
        row.update(task=task, samples_a=ta.samples, samples_b=tb.samples)
        row["cycles_a"], row["cycles_b"] = ta.cycles, tb.cycles
        if ta.cycles is not None and tb.cycles is not None:
            row["cycles_delta"] = tb.cycles - ta.cycles
            row["cycles_relative_delta"] = (tb.cycles - ta.cycles) / ta.cycles if ta.cycles else None
        share_a = ta.samples / n_a if n_a else None
        share_b = tb.samples / n_b if n_b else None
        row["share_a"], row["share_b"] = share_a, share_b
        if share_a is not None and share_b is not None:
            row["share_delta"] = share_b - share_a
        if task != ALL and n_a and n_b:
            z, p = two_proportion_z(tb.samples, n_b, ta.samples, n_a)
            row["z"], row["p_value"] = z, p
            row["significant"] = p < level
        rows.append(row)
    return rows


def format_compare_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    return capture.format_result_csv(rows, COMPARE_COLUMNS)


def format_compare_table(rows: Sequence[Mapping[str, Any]], name_a: str, name_b: str) -> str:
    """A plain-text table for the terminal (the CSV has full precision)."""
    header = (
        "task",
        f"cycles {name_a}",
        f"cycles {name_b}",
        "Δ cycles",
        "Δ %",
        f"share {name_a}",
        f"share {name_b}",
        "p",
        "",
    )
    lines = [header]
    for row in rows:
        rel = row.get("cycles_relative_delta")
        lines.append(
            (
                str(row["task"]),
                _human(row.get("cycles_a")),
                _human(row.get("cycles_b")),
                _human(row.get("cycles_delta")),
                "" if rel is None else f"{rel * 100:+.1f}%",
                _pct(row.get("share_a")),
                _pct(row.get("share_b")),
                "" if row.get("p_value") is None else f"{row['p_value']:.3g}",
                "*" if row.get("significant") else "",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines) + "\n"


def _pct(value: Any) -> str:
    return "" if value is None else f"{value * 100:.2f}%"


def _human(value: Any) -> str:
    if value is None:
        return ""
    magnitude = abs(value)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}" if not float(value).is_integer() else str(int(value))


def analysis_stacks(analysis_dir: Path) -> dict[str, int]:
    """Every workload stack an analysis counted, the input of compare's differential flamegraph: the
    stacks of its inputs (analysis.json) over its sub-window, read from the captures. An analysis made
    before format 4 kept them in tasks/*.folded and unmatched.folded (each stack in one of them)."""
    from coordinator.rundir import own_subdir

    if own_subdir(analysis_dir, TASKS_DIR) is None:
        return _captured_stacks(analysis_dir)
    from profiler.capture.folded import read_folded

    paths = sorted((analysis_dir / TASKS_DIR).glob("*.folded")) + [analysis_dir / UNMATCHED_FILE]
    merged: dict[str, int] = {}
    for path in paths:
        if not path.is_file():
            continue
        try:
            for stack, count in read_folded(path).items():
                merged[stack] = merged.get(stack, 0) + count
        except OSError as exc:
            raise CaptureFormatError(
                f"{path}: cannot read ({exc.strerror or exc}); re-run `coordinator analyze`"
            ) from None
    return merged


def _captured_stacks(analysis_dir: Path) -> dict[str, int]:
    """The stacks of the runs an analysis read (analysis.json ``inputs``), restricted to its ``window``."""
    from coordinator.analysis.inputs import read_inputs, read_pid_stacks
    from coordinator.analysis.timeline import SubWindow
    from profiler.capture.jsonfile import expect_json, read_json_file

    path = analysis_dir / ANALYSIS_FILE
    record = expect_json(
        read_json_file(path, "run `coordinator analyze` first", "re-run `coordinator analyze`"), dict, path, "the file"
    )
    inputs = expect_json(record.get("inputs", []), list, path, "inputs")
    directories = [entry.get("directory") for entry in inputs if isinstance(entry, dict)]
    if len(directories) != len(inputs) or not all(isinstance(directory, str) for directory in directories):
        raise CaptureFormatError(f"{path}: an input without its directory; re-run `coordinator analyze`")
    window = record.get("window")
    if window is not None:
        from coordinator.analysis.load import check_window_record

        advice = "re-run `coordinator analyze`"
        check_window_record(expect_json(window, dict, path, "window", advice), path, advice)
    sub_window = SubWindow(window.get("from"), window.get("to")) if isinstance(window, dict) else None
    merged: dict[str, int] = {}
    for run in read_inputs([Path(str(directory)) for directory in directories], None, sub_window):
        for pid in run.pids:
            if pid.stacks is None:
                continue
            for stack, count in read_pid_stacks(pid.stacks, pid.intervals).items():
                if count > 0:
                    merged[stack] = merged.get(stack, 0) + count
    return merged
