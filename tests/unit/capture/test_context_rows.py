"""The rows of contexts.json and offcpu_contexts.json pass one check (format._context_row): a damaged row is
one error line naming the file and the row, never an IndexError or a count out of bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.folded import MAX_COUNT
from profiler.capture.read import _context_row, read_contexts
from profiler.errors import CaptureFormatError


def _capture_with_contexts(tmp_path: Path, rows: list[object]) -> Path:
    capture.pid_dir(tmp_path, 7).mkdir(parents=True)
    capture.stacks_path(tmp_path, 7).write_text("main;work 5\nmain;idle 2\n", encoding="utf-8")
    capture.contexts_path(tmp_path, 7).write_text(json.dumps({"contexts": ["stage 1", 3], "rows": rows}))
    return tmp_path


def test_context_rows_are_read(tmp_path: Path) -> None:
    counts = read_contexts(_capture_with_contexts(tmp_path, [[0, 1, 4], [0, 2, 2], [0, 1, 1]]), 7)
    assert counts == {("stage 1", "main;work"): 5, ("stage 1", "main;idle"): 2}


@pytest.mark.parametrize(
    "row",
    [[0, 3, 1], [0, 0, 1], [2, 1, 1], [1, 1, 1], [0, 1, -1], [0, 1, MAX_COUNT + 1], [0, 1, True], [0, 1.0, 1],
     [0, 1], [0, 1, 1, 1], "0,1,1", []],
)  # fmt: skip
def test_a_damaged_context_row_is_named(tmp_path: Path, row: object) -> None:
    directory = _capture_with_contexts(tmp_path, [[0, 1, 1], row])
    with pytest.raises(CaptureFormatError, match=r"contexts.json: row 2 is not \[context index, stack line"):
        read_contexts(directory, 7)


def test_the_row_check_bounds_each_value_by_its_line() -> None:
    blocked = (100, 50)  # offcpu_contexts.json: blocked_ns up to the timeline line's, then switches
    highs = lambda line: (blocked[line - 1], MAX_COUNT)  # noqa: E731
    assert _context_row([0, 2, 50, 3], ["ctx"], 2, highs) == ("ctx", 2, (50, 3))
    assert _context_row([0, 2, 51, 3], ["ctx"], 2, highs) is None
    assert _context_row([0, 1, 100], ["ctx"], 2, highs) is None
