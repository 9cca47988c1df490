"""`profiler match` on a stack table (stacks.tpc) against Python's bare read-and-split of the same stacks
as folded text (issue 29: within 3x, start-up included).

The stacks are bench_matcher.py's: distinct stacks spliced from the recorded real Spark capture and the
synthetic executor file in tests/data. They are written once as folded text and once as a stack table
(each distinct frame once, stacks as frame ids, gzip). Timed on one core (CPU seconds, best of --repeat):
  read+split       -- read every folded line, split off the count, split the frames
  match table      -- `profiler match` on the stacks.tpc: read the table, match each frame once, stacks by id
  match folded     -- `profiler match` on the folded file (the same command, the older input)
Results: docs/benchmarks/match-table.md (--no-write to skip).

usage: .venv/bin/python bench/bench_match_table.py [--stacks 100000] [--repeat 3] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_matcher import PROFILE, cpu_model, generate, read_and_split, timed  # noqa: E402

from profiler.capture.folded import read_folded  # noqa: E402
from profiler.capture.stacktable import read_table, table_from_folded, write_table  # noqa: E402
from profiler.cli import main as profiler_main  # noqa: E402
from profiler.files.atomic import atomic_write_chunks  # noqa: E402

RESULT_DOC = ROOT / "docs" / "benchmarks" / "match-table.md"


def match_command(path: Path) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return profiler_main(["match", "--profile", str(PROFILE), str(path)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bench_matcher")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    folded = args.data / f"stacks_{args.stacks}.folded"
    if not folded.exists():
        generate(folded, args.stacks)
    table_file = args.data / f"stacks_{args.stacks}.tpc"
    if not table_file.exists():
        write_table(table_file, table_from_folded(read_folded(folded)), atomic_write_chunks)
    table = read_table(table_file)
    stacks, frames = read_and_split(folded)
    floor, floor_all, floor_wall = timed(lambda: read_and_split(folded), args.repeat)
    by_table, table_all, table_wall = timed(lambda: match_command(table_file), args.repeat)
    by_text, text_all, text_wall = timed(lambda: match_command(folded), args.repeat)
    lines = [
        "# `profiler match` on a stack table",
        "",
        f"Command: `.venv/bin/python bench/bench_match_table.py --stacks {args.stacks}` (best of {args.repeat}; "
        "CPU seconds of one process, one core; start-up of the command (profile loading and compiling) included).",
        f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; shared with other "
        f"jobs while measuring ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC).",
        f"Input: {stacks:,} distinct stacks spliced from tests/data's real Spark capture (bench_matcher.py), "
        f"{frames:,} frames ({frames / stacks:.1f} per stack), {len(table.names):,} distinct frames; folded text "
        f"{folded.stat().st_size / 1e6:.1f} MB, stack table {table_file.stat().st_size / 1e6:.2f} MB.",
        "",
        "| step | CPU s | × read+split | wall s |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds, wall in (
        ("read + split of the folded text (floor)", floor, floor_wall),
        ("`profiler match` on the stack table", by_table, table_wall),
        ("`profiler match` on the folded text", by_text, text_wall),
    ):
        lines.append(f"| {name} | {seconds:.2f} | {seconds / floor:.2f} | {wall:.2f} |")
    lines += [
        "",
        "All runs (CPU s): read+split " + ", ".join(f"{t:.2f}" for t in floor_all)
        + "; table " + ", ".join(f"{t:.2f}" for t in table_all)
        + "; folded " + ", ".join(f"{t:.2f}" for t in text_all) + ".",
        "",
        "Goal (issue 29): the stack table matched within 3× of read+split (5.1× from folded text before).",
        "The table's frames are matched once each and its stacks decided from their frame ids, so no stack",
        "text is built or split; what remains is reading the gzip stream, undoing the prefix coding and one",
        "`filter(map(...))` over each stack's frame ids.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.no_write:
        RESULT_DOC.write_text(report, encoding="utf-8")
        print(f"wrote {RESULT_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
