"""The coordinator's reader of stack tables (stacks.tpc): the arrays read from the file's bytes by numpy and
checked with numpy, the stacks left prefix-coded.

The host agent's reader (profiler/capture/stacktable.py, standard library only) builds a tuple per stack and
checks the rows in Python; this one makes the same checks in the same order with the same messages (a file
either reader refuses, the other refuses with the same error) and gives the same stacks and rows, leaving
the stacks prefix-coded so that a reader can work on each stack's own frames only (decide.TaskDecider).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profiler.capture.checks import row_interval_error, row_order_error
from profiler.capture.folded import KERNEL_SUFFIX, MAX_COUNT
from profiler.capture.stacktable import (
    FRAME_ID_ERROR,
    KERNEL,
    LEFTOVER_ERROR,
    ROW_CONTEXT_ERROR,
    ROW_COUNT_ERROR,
    ROW_STACK_ERROR,
    TableHeader,
    array_spans,
    bad_table,
    capture_interval_limit,
    decode_header,
    prefix_error,
    read_table_bytes,
)

_DTYPES: dict[str, np.dtype] = {"I": np.dtype("<u4"), "Q": np.dtype("<u8")}  # type: ignore[type-arg]


@dataclass(frozen=True)
class TableArrays:
    """A checked stack table with its stacks still prefix-coded: stack i is the first ``prefixes[i]`` frames
    of stack i-1 followed by its ``suffix_lengths[i]`` frames of ``suffixes`` (int64 arrays); rows as
    int64 arrays but ``counts`` (uint64)."""

    header: TableHeader
    prefixes: np.ndarray
    suffix_lengths: np.ndarray
    suffixes: np.ndarray
    intervals: np.ndarray
    stack_ids: np.ndarray
    context_ids: np.ndarray
    counts: np.ndarray

    @property
    def stack_count(self) -> int:
        return len(self.prefixes)

    def frame_texts(self) -> list[str]:
        """Each frame as it appears in folded text (StackTable.frame_texts)."""
        header = self.header
        return [name + KERNEL_SUFFIX if kind == KERNEL else name for name, kind in zip(header.names, header.kinds)]

    def prefix_coded(self) -> Iterator[tuple[int, list[int]]]:
        """(frames shared with the stack before, its own frames) per stack, in stack-id order."""
        suffixes = self.suffixes.tolist()
        at = 0
        for prefix, length in zip(self.prefixes.tolist(), self.suffix_lengths.tolist()):
            yield prefix, suffixes[at : at + length]
            at += length

    def stacks(self) -> list[tuple[int, ...]]:
        """Every stack as a tuple of frame ids, root first (StackTable.stacks)."""
        out: list[tuple[int, ...]] = []
        previous: tuple[int, ...] = ()
        for prefix, suffix in self.prefix_coded():
            previous = previous[:prefix] + tuple(suffix)
            out.append(previous)
        return out


def read_table_arrays(path: Path) -> TableArrays:
    """The arrays of a stacks.tpc; errors as stacktable.read_table's (rows inside its capture's window)."""
    return decode_table_arrays(read_table_bytes(path), str(path), capture_interval_limit(path))


def decode_table_arrays(raw: bytes | bytearray, source: str, interval_limit: int | None = None) -> TableArrays:
    """stacktable.decode_table's checks, in its order, on numpy views of ``raw``."""
    header, at = decode_header(raw, source)
    views = [
        np.frombuffer(raw, dtype=_DTYPES[code], count=length, offset=start).astype(np.int64 if code == "I" else "<u8")
        for code, start, length in array_spans(raw, at, header, source)
    ]
    prefixes, suffix_lengths, suffixes, intervals, stack_ids, context_ids, counts = views
    if len(suffixes) and int(suffixes.max()) >= len(header.names):
        raise bad_table(source, FRAME_ID_ERROR)
    _check_prefixes(prefixes, suffix_lengths, len(suffixes), source)
    if len(stack_ids) and int(stack_ids.max()) >= len(prefixes):
        raise bad_table(source, ROW_STACK_ERROR)
    if len(context_ids) and int(context_ids.max()) > len(header.contexts):
        raise bad_table(source, ROW_CONTEXT_ERROR)
    if len(counts) and int(counts.max()) > MAX_COUNT:
        raise bad_table(source, ROW_COUNT_ERROR)
    _check_rows(intervals, stack_ids, context_ids, interval_limit, source)
    return TableArrays(header, prefixes, suffix_lengths, suffixes, intervals, stack_ids, context_ids, counts)


def _check_prefixes(prefixes: np.ndarray, suffix_lengths: np.ndarray, frames: int, source: str) -> None:
    """Each stack shares at most the frames the stack before it has, and the suffixes are used exactly."""
    if not len(prefixes):
        if frames:
            raise bad_table(source, LEFTOVER_ERROR)
        return
    lengths = prefixes + suffix_lengths
    previous = np.concatenate([[0], lengths[:-1]])
    wrong = (prefixes > previous) | (np.cumsum(suffix_lengths) > frames)
    if wrong.any():
        raise bad_table(source, prefix_error(int(np.argmax(wrong))))
    if int(suffix_lengths.sum()) != frames:
        raise bad_table(source, LEFTOVER_ERROR)


def _check_rows(
    intervals: np.ndarray, stack_ids: np.ndarray, context_ids: np.ndarray, limit: int | None, source: str
) -> None:
    """checks.row_problem with numpy: intervals inside the window, rows strictly in (interval, stack,
    context) order (a row listed twice counts its samples twice)."""
    if limit is not None and len(intervals) and int(intervals.max()) >= limit:
        raise bad_table(source, row_interval_error(int(intervals.max()), limit))
    if len(intervals) < 2:
        return
    steps = [np.diff(column) for column in (intervals, stack_ids, context_ids)]
    increasing = (steps[0] > 0) | ((steps[0] == 0) & ((steps[1] > 0) | ((steps[1] == 0) & (steps[2] > 0))))
    if not increasing.all():
        row = int(np.argmin(increasing))
        raise bad_table(source, row_order_error(row + 1, not any(int(step[row]) for step in steps)))
