"""Compare the task cycles and shares of two runs, with a test of whether each share differs.

Per task: cycles and share of all samples in run A and run B, the delta (B - A) and relative delta of
cycles, and a pooled two-proportion z-test of the shares; a task is marked `*` when the share
difference is larger than the sampling error (p < 0.05). Uses each run's summary.csv (cluster rows,
host `*`); runs without one, or all runs when --profile is given, are analysed first, as `analyze`
does: in this process when small and the master is local, else on Spark (nothing is written into
the runs then). A side may also be a summary.csv file of one run.

examples:
  coordinator compare runs/baseline runs/tuned
  coordinator compare runs/baseline runs/tuned --csv compare.csv
  coordinator compare runs/baseline runs/tuned --profile my_profile.txt
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from coordinator.analysis.compare import compare_runs, format_compare_csv, format_compare_table
from coordinator.analysis.rows import TaskTotals, existing_summary, summary_totals
from coordinator.commands.analyze import existing_file, master_url
from profiler.capture import atomic_write_text


def run_or_summary(text: str) -> Path:
    path = Path(text)
    if not (path.is_dir() or path.is_file()):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a run directory nor a summary.csv")
    return path


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


class CompareCommand:
    """Compare the task cycles and shares of two runs, with a test of whether each share differs."""


    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_a", type=run_or_summary, metavar="RUN_A")
        parser.add_argument("run_b", type=run_or_summary, metavar="RUN_B")
        parser.add_argument("--csv", type=Path, metavar="OUT", help="also write the comparison as CSV")
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
            "--level",
            type=probability,
            default=0.05,
            help="significance level of the share test (default: %(default)s)",
        )

    def run(self, args: argparse.Namespace) -> int:
        sides = [args.run_a, args.run_b]
        summaries: list[Path | None] = [self._existing_summary(p) if args.profile is None else None for p in sides]
        totals: list[dict[str, TaskTotals]] = [{}, {}]
        missing = [i for i, s in enumerate(summaries) if s is None]
        if missing:
            analysed = self._analyse([sides[i] for i in missing], args.profile, args.master)
            for i, result in zip(missing, analysed):
                totals[i] = result
        for i, summary in enumerate(summaries):
            if summary is not None:
                totals[i] = summary_totals(summary)
        rows = compare_runs(totals[0], totals[1], args.level)
        print(format_compare_table(rows, "A", "B"), end="")
        print(f"A = {args.run_a}\nB = {args.run_b}\n* = share differs beyond sampling error (p < {args.level})")
        if args.csv is not None:
            atomic_write_text(args.csv, format_compare_csv(rows))
            print(f"wrote {args.csv}")
        return 0

    @staticmethod
    def _existing_summary(path: Path) -> Path | None:
        return path if path.is_file() else existing_summary(path)

    @staticmethod
    def _analyse(paths: list[Path], profile: Path | None, master: str) -> list[dict[str, TaskTotals]]:
        """Analyse runs into a scratch directory; the runs are not written to. Small runs on a local
        master are analysed in this process (as `analyze` does); one Spark session serves the rest."""
        from coordinator.analysis.engines import analyze, choose_engine, spark_session
        from coordinator.analysis.inputs import read_inputs

        run_dirs = [path for path in paths if not path.is_file()]
        needs_spark = bool(run_dirs) and choose_engine("auto", master, read_inputs(run_dirs)) == "spark"
        results: list[dict[str, Any]] = []
        with contextlib.ExitStack() as stack:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="taskprof-compare-")))
            spark = stack.enter_context(spark_session(master)) if needs_spark else None
            for index, path in enumerate(paths):
                if path.is_file():
                    results.append(summary_totals(path))
                    continue
                output = analyze([path], out_dir=scratch / str(index), profile=profile, master=master, spark=spark)
                results.append(summary_totals(output.summary_csv))
        return results


CompareCommand.__doc__ = __doc__  # the module docstring, with examples, is the help text
COMMAND = CompareCommand
