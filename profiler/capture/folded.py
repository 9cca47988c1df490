"""Brendan Gregg's folded stack format: ``root;frame;...;leaf count``, one stack per line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..errors import CaptureFormatError
from ..files.textinput import open_text

FRAME_SEPARATOR = ";"
# A sample count fits the int64 columns of the analysis; a larger one is a corrupt file, not a count.
MAX_COUNT = 2**63 - 1
_MAX_COUNT_DIGITS = len(str(MAX_COUNT)) + 1  # leading zeros aside, nothing longer can be a count
# Suffix of kernel frames in a folded stack (user frames have none).
KERNEL_SUFFIX = "_[k]"


def parse_line(line: str) -> tuple[str, int] | None:
    """Split one folded line into (stack, count); None for blank lines. Frames may contain spaces."""
    line = line.rstrip("\r\n")
    if not line.strip():
        return None
    stack, sep, count = line.rpartition(" ")
    if not sep or not stack or not is_count(count):
        raise ValueError(f"not a folded stack line (expected 'frame;frame count'): {line[:80]!r}")
    return stack, int(count)


def is_count(text: str) -> bool:
    """ASCII digits only (str.isdigit also takes '²', which int() refuses), at most MAX_COUNT. The length is
    checked before int(): Python refuses to convert more than 4,300 digits (ValueError), and MAX_COUNT has 19."""
    return text.isascii() and text.isdigit() and len(text) <= _MAX_COUNT_DIGITS and int(text) <= MAX_COUNT


def parse_source_line(line: str, number: int, source: str) -> tuple[str, int] | None:
    """``parse_line`` for line ``number`` of ``source``: a malformed line is a CaptureFormatError
    ``source:line: ...``."""
    try:
        return parse_line(line)
    except ValueError as exc:
        raise CaptureFormatError(f"{source}:{number}: {exc}; fix or drop the line") from None


def iter_folded(lines: Iterable[str], source: str = "<input>") -> Iterator[tuple[str, int]]:
    for number, line in enumerate(lines, start=1):
        parsed = parse_source_line(line, number, source)
        if parsed is not None:
            yield parsed


def read_folded(path: Path) -> Counter[str]:
    """All stacks of a folded file, merged (a stack appearing twice has its counts added)."""
    counts: Counter[str] = Counter()
    with open_text(path, lenient=True) as handle:
        for stack, count in iter_folded(handle, str(path)):
            counts[stack] += count
    return counts


def format_folded(counts: Mapping[str, int]) -> str:
    """Folded text, most samples first, ties by stack text, so output is deterministic."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return "".join(f"{stack} {count}\n" for stack, count in ordered if count > 0)


def sanitize_frame(frame: str) -> str:
    """Frames must not contain the separators of the format: ';' splits frames, newlines split stacks."""
    return frame.replace(FRAME_SEPARATOR, ":").replace("\n", " ").replace("\r", " ")
