"""Compare the task cycles and shares of two runs, with a test of whether each share differs.

Per task: cycles and share of all samples in run A and run B, the delta (B - A) and relative delta of
cycles, and a pooled two-proportion z-test of the shares; a task is marked `*` when the share
difference is larger than the sampling error (p < 0.05). Uses each run's summary.csv (cluster rows,
host `*`); runs without one, or all runs when --profile is given, are analysed first, as `analyze`
does: in this process when small and the master is local, else on Spark (nothing is written into
the runs then). A side may also be a summary.csv file of one run.
--out DIR also writes compare.csv and DIR/index.html: the table and a differential flamegraph of
both runs' stacks (each analysis's tasks/*.folded and unmatched.folded), every frame coloured by
the change of its share of all samples, pale where the change is within sampling error.

examples:
  coordinator compare runs/baseline runs/tuned
  coordinator compare runs/baseline runs/tuned --csv compare.csv
  coordinator compare runs/baseline runs/tuned --out compare-baseline-tuned
  coordinator compare runs/baseline runs/tuned --profile my_profile.txt
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from coordinator.analysis.compare import (
    COMPARE_COLUMNS,
    analysis_stacks,
    compare_runs,
    format_compare_csv,
    format_compare_table,
)
from coordinator.analysis.rows import existing_summary, summary_totals
from coordinator.commands.analyze import existing_file, master_url
from profiler.argtypes import bounded
from profiler.files.atomic import atomic_write_text
from profiler.files.outputs import check_output_dir, check_output_file, csv_header

COMPARE_CSV = "compare.csv"


def run_or_summary(text: str) -> Path:
    path = Path(text)
    if not (path.is_dir() or path.is_file()):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a run directory nor a summary.csv")
    return path


probability = bounded(float, 0.0, 1.0, exclusive=True)


class CompareCommand:
    """Compare the task cycles and shares of two runs, with a test of whether each share differs."""

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_a", type=run_or_summary, metavar="RUN_A")
        parser.add_argument("run_b", type=run_or_summary, metavar="RUN_B")
        parser.add_argument("--csv", type=Path, metavar="OUT", help="also write the comparison as CSV")
        parser.add_argument(
            "--out",
            type=Path,
            metavar="DIR",
            help="also write compare.csv and index.html with the differential flamegraph into DIR",
        )
        parser.add_argument(
            "--profile",
            type=existing_file,
            metavar="FILE",
            help="re-analyse both runs with this application profile first",
        )
        parser.add_argument(
            "--master",
            type=master_url,
            default="local[*]",
            metavar="URL",
            help="Spark master URL when runs need analysing (default: %(default)s)",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="replace an --out or --csv this tool wrote that is not a comparison (never your own files)",
        )
        parser.add_argument(
            "--level",
            type=probability,
            default=0.05,
            help="significance level of the share test (default: %(default)s)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.report.diffpage import COMPARE_MARKER

        # a previous comparison is replaced, as before; anything else of ours needs --force
        if args.csv is not None:
            signature = csv_header(*COMPARE_COLUMNS)
            check_output_file(args.csv, "--csv", force=args.force, signature=signature, replace_own=True)
        if args.out is not None:
            check_output_dir(args.out, "--out", force=args.force, own_kind=(COMPARE_MARKER,), replace_own=True)
        sides = [args.run_a, args.run_b]
        with tempfile.TemporaryDirectory(prefix="taskprof-compare-") as scratch:
            analyses = self._analyses(sides, args.profile, args.master, Path(scratch))
            totals = [summary_totals(summary) for summary in analyses]
            rows = compare_runs(totals[0], totals[1], args.level)
            # The table and its legend are the data (stdout); what was written and hints go to stderr.
            print(format_compare_table(rows, "A", "B"), end="")
            print(f"A = {args.run_a}\nB = {args.run_b}\n* = share differs beyond sampling error (p < {args.level})")
            if args.csv is not None:
                atomic_write_text(args.csv, format_compare_csv(rows))
                print(f"wrote {args.csv}", file=sys.stderr)
            if args.out is not None:
                self._write_page(args, rows, [summary.parent for summary in analyses])
            else:
                print("  the differential flamegraph: add --out DIR", file=sys.stderr)
        return 0

    @staticmethod
    def _write_page(args: argparse.Namespace, rows: list[dict[str, Any]], analysis_dirs: list[Path]) -> None:
        from coordinator.report.diffpage import render_compare

        stacks = [analysis_stacks(directory) for directory in analysis_dirs]
        names = (_side_name(args.run_a), _side_name(args.run_b))
        index = render_compare(args.out, rows, stacks[0], stacks[1], names, args.level)
        atomic_write_text(args.out / COMPARE_CSV, format_compare_csv(rows))
        print(f"wrote {args.out / COMPARE_CSV}")
        print(f"wrote {index}")
        print(f"next: open {index}")

    @staticmethod
    def _analyses(sides: list[Path], profile: Path | None, master: str, scratch: Path) -> list[Path]:
        """The summary.csv of each side: its own (a run's analysis or a summary file), or, for runs
        without one and for all runs with --profile, one made in ``scratch`` (the runs are not
        written to), in this process or with one Spark session as `analyze` would choose."""
        summaries: list[Path | None] = [
            (path if path.is_file() else existing_summary(path)) if profile is None or path.is_file() else None
            for path in sides
        ]
        missing = [i for i, summary in enumerate(summaries) if summary is None]
        if missing:
            from coordinator.analysis.engines import analyze, choose_engine, spark_session
            from coordinator.analysis.inputs import read_inputs

            # analyze's own engine choice: in this process when small on a local master, else one session
            needs_spark = choose_engine("auto", master, read_inputs([sides[i] for i in missing])) == "spark"
            with contextlib.ExitStack() as stack:
                spark = stack.enter_context(spark_session(master)) if needs_spark else None
                for i in missing:
                    output = analyze([sides[i]], out_dir=scratch / str(i), profile=profile, master=master, spark=spark)
                    summaries[i] = output.summary_csv
        return [summary for summary in summaries if summary is not None]


def _side_name(path: Path) -> str:
    """A side's name on the page: the run directory's name (the parent's for a summary.csv)."""
    return (path.parent if path.is_file() else path).resolve().name


CompareCommand.__doc__ = __doc__  # the module docstring, with examples, is the help text
COMMAND = CompareCommand
