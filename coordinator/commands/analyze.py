"""Match the stacks of one or more runs to tasks and write summary.csv.

Reads every host's per-PID stacks (stack tables, or folded stacks of older captures), counters and
scope of the given run directories (or bare
host captures), applies the application profile with the host agent's own matcher (on Spark, or in
this process for small inputs on a local master: --engine) and writes summary.csv (per run, host,
PID and task, with host `*` cluster rows) and unmatched.folded (stacks no task matched, most samples
first); each task's stacks stay in the captures (`coordinator export --format folded --per-task` and
the report derive them). The raw captures are only read:
edit the profile and analyse again as often as needed.
--from/--to restrict every row to a sub-window (seconds into the sampling window) of a capture
with a timeline (format_version 2, stack_collection ringbuf): the whole intervals overlapping it
are used, and analysis.json says which.
--by stage adds cluster rows per Spark stage to summary.csv (a capture of format 3: every sample of an
executor task thread knows its stage; the driver's REST API adds job, query and micro-batch);
--by vertex adds rows per Flink job vertex, subtask and operator of its chain (each task thread's full
name "<chain> (i/n)#attempt"; flink.json adds the TaskManager). docs/summary-format.md.
Spark runs in local mode by default; any master URL works for large archives (the executors then
need python3 with pyarrow and numpy; the code is shipped with the job).

examples:
  coordinator analyze runs/20260122-014700
  coordinator analyze runs/20260122-014700 --profile my_profile.txt --print
  coordinator analyze runs/20260122-014700 --from 300 --to 600 --out analysis/steady-state
  coordinator analyze runs/20260122-014700 --by stage      # + rows per Spark stage (job, micro-batch)
  coordinator analyze runs/demo-flink --by vertex          # + rows per Flink vertex, subtask, operator
  coordinator analyze runs/* --out analysis/all-runs --master local[2]
  coordinator analyze runs/* --out /shared/analysis --master spark://head:7077
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from coordinator.analysis.timeline import SubWindow
from profiler.argtypes import existing_dir, existing_file, label, seconds_into_window

_MASTER = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?|local-cluster\[.+\]|spark://.+|yarn|k8s://.+|mesos://.+)$"
)


def master_url(text: str) -> str:
    if not _MASTER.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Spark master URL (local[*], local[N], spark://HOST:PORT, yarn, k8s://URL)"
        )
    return text


class AnalyzeCommand:
    """Match the stacks of one or more runs to tasks and write summary.csv and per-task stacks."""

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser, "run_dirs", nargs="+")
        parser.add_argument(
            "--profile",
            type=existing_file,
            metavar="FILE",
            help="application profile (default: the copy saved in the run)",
        )
        add_engine_options(
            parser,
            "where the job runs: auto (default) runs small inputs on a local master in this process "
            "with the same code and output, without Spark's start-up; spark always starts Spark",
        )
        parser.add_argument(
            "--out",
            type=Path,
            metavar="DIR",
            help="output directory (default: the run directory; required for several runs)",
        )
        add_label_option(parser, "add or override a run label (a summary.csv column); repeatable")
        parser.add_argument(
            "--from",
            dest="window_from",
            type=seconds_into_window,
            metavar="S",
            help="start of the sub-window, seconds into the sampling window (default: its start)",
        )
        parser.add_argument(
            "--to",
            dest="window_to",
            type=seconds_into_window,
            metavar="S",
            help="end of the sub-window, seconds into the sampling window (default: its end); "
            "whole timeline intervals overlapping [--from, --to) are used",
        )
        parser.add_argument(
            "--print",
            dest="print_table",
            action="store_true",
            help="also print the task table in the terminal (as `coordinator summary`)",
        )

        parser.add_argument(
            "--by",
            choices=("stage", "vertex"),
            help="also cut summary.csv by Spark stage or by Flink job vertex and subtask (rows with a stage or "
            "vertex column; with --from/--to over the sub-window)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.analysis.engines import analyze

        window = SubWindow(args.window_from, args.window_to)  # --from < --to, else a ConfigError
        output = analyze(
            args.run_dirs,
            out_dir=args.out,
            profile=args.profile,
            master=args.master,
            labels=dict(args.label) or None,
            engine=args.engine,
            window=window if window.requested else None,
            by=args.by,
        )
        stats = output.stats
        print(
            f"analysed {stats.runs} run(s), {stats.hosts} host(s), {stats.pids} process(es): "
            f"{stats.samples} samples, {stats.distinct_stacks} distinct stacks "
            f"in {stats.session_seconds + stats.job_seconds:.1f} s (Spark start-up {stats.session_seconds:.1f} s)"
        )
        for note in output.window_notes:
            print(note)
        print(f"wrote {output.summary_csv}")
        print(f"wrote {output.unmatched_file}")
        print(f"wrote {output.analysis_json}")
        print("next:")
        print(
            f"  edit the profile and re-analyse: coordinator analyze {' '.join(str(p) for p in args.run_dirs)}"
            f" --profile FILE{' --out ' + str(args.out) if args.out else ''}{_window_args(window)}"
        )
        if len(args.run_dirs) == 1 and output.out_dir == Path(args.run_dirs[0]):
            from coordinator.report.render import render_report

            index = render_report(output.out_dir)
            print(f"wrote {index}")
            print(f"  open the report: {index}")
        print("  compare two runs: coordinator compare RUN_A RUN_B")
        if args.print_table:
            from coordinator.report.terminal import print_summary

            print_summary(output.out_dir)
        return 0


def _window_args(window: SubWindow) -> str:
    start, end = window.start, window.end
    return (f" --from {start:g}" if start is not None else "") + (f" --to {end:g}" if end is not None else "")


AnalyzeCommand.__doc__ = __doc__  # the module docstring, with examples, is the help text
COMMAND = AnalyzeCommand


def add_run_dir(
    parser: argparse.ArgumentParser,
    dest: str = "run_dir",
    *,
    metavar: str = "RUN_DIR",
    nargs: str | None = None,
    help: str = "run directory (run.json) or host capture directory (meta.json)",
) -> None:
    """The run directory a command reads (analyze, draft-profile, export, report, summary): checked to exist."""
    parser.add_argument(dest, nargs=nargs, type=existing_dir, metavar=metavar, help=help)


def add_label_option(parser: argparse.ArgumentParser, label_help: str) -> None:
    """--label KEY=VALUE of the commands that record labels (profile, analyze, campaign): repeatable."""
    parser.add_argument("--label", type=label, action="append", default=[], metavar="KEY=VALUE", help=label_help)


def add_engine_options(parser: argparse.ArgumentParser, engine_help: str) -> None:
    """--master and --engine of the commands that run the analysis (analyze, campaign): one spelling,
    one default, the engines of coordinator.analysis.engines.ENGINES."""
    parser.add_argument(
        "--master",
        type=master_url,
        default="local[*]",
        metavar="URL",
        help="Spark master URL (default: %(default)s)",
    )
    parser.add_argument("--engine", choices=("auto", "spark", "in-process"), default="auto", help=engine_help)
