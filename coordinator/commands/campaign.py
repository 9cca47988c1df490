"""Turn a set of runs into the figures of an experiment: cycles per event per task against a run label.

Analyses the runs together on the same pipeline as `coordinator analyze` (in this process for small
inputs on a local master, on Spark for archives or with --master), then writes campaign.csv (one
row per run and task: events, samples, share, cycles, CPU seconds, cycles per event with its 95 %
interval, IPC and stall cycles per event when measured, the run labels) and report/index.html: one
panel per task of cycles per event against --by, one line per --series value with error bars, a
stacked total per series, IPC, and a table. Runs are told apart by the labels they were profiled
with (`coordinator profile --label rate=20000 --label spe=flink`, or the demo's own).
--by defaults to the one label (besides --series) whose values differ between the runs; --series to the `spe` label,
else the engine column.

examples:
  coordinator campaign runs/rate-* --by rate
  coordinator campaign runs/* --by nodes --series spe --out campaigns/scale-out
  coordinator campaign runs/* --by rate --master spark://head:7077 --out /shared/campaigns/rates
  then:
  xdg-open <out>/report/index.html
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from coordinator.commands.analyze import add_engine_options, add_label_option
from profiler.argtypes import existing_dir, existing_file
from profiler.errors import ConfigError, OutputExistsError
from profiler.files.outputs import check_output_dir

CAMPAIGN_REPORT_DIR = "report"


def default_out(run_dirs: list[Path]) -> Path:
    """``<common parent of the runs>/campaign``: beside the runs it summarises."""
    parents = [str(Path(p).resolve().parent) for p in run_dirs]
    return Path(os.path.commonpath(parents)) / "campaign"


def check_out(out: Path, force: bool) -> None:
    """A previous campaign or analysis (campaign.csv, analysis.json) is replaced; a run directory never
    is; another directory this tool wrote needs --force; a directory of the user's files never
    (profiler.files.outputs)."""
    from coordinator.analysis.campaign import CAMPAIGN_FILE
    from coordinator.analysis.rows import ANALYSIS_FILE

    if (out / "run.json").exists():
        raise OutputExistsError(f"{out}: is a run directory; a campaign goes beside the runs, choose another --out")
    check_output_dir(out, "--out", force=force, own_kind=(CAMPAIGN_FILE, ANALYSIS_FILE), replace_own=True)


def varying_label(label_values: dict[str, set[str]]) -> str:
    """The --by default: the one label (besides the series) whose value differs between runs."""
    varying = sorted(key for key, values in label_values.items() if len(values) > 1)
    if len(varying) == 1:
        return varying[0]
    if not varying:
        raise ConfigError("the runs' labels are all the same: say which label is the x axis with --by LABEL")
    raise ConfigError(f"labels {', '.join(varying)} differ between the runs: choose the x axis with --by LABEL")


class CampaignCommand:
    """Turn a set of runs into the figures of an experiment: cycles per event per task against a run label."""

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dirs", nargs="+", type=existing_dir, metavar="RUN_DIR", help="run directories")
        parser.add_argument("--by", metavar="LABEL", help="run label on the x axis (default: the one that varies)")
        parser.add_argument(
            "--series", metavar="LABEL", help="run label that separates the lines (default: spe, else engine)"
        )
        parser.add_argument(
            "--out", type=Path, metavar="DIR", help="output directory (default: <runs' parent>/campaign)"
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="write into a directory this tool wrote that is not a campaign (never one of your own files)",
        )
        parser.add_argument(
            "--profile", type=existing_file, metavar="FILE", help="application profile (default: the runs' own copy)"
        )
        add_engine_options(parser, "where the analysis runs (as for coordinator analyze; default: auto)")
        add_label_option(parser, "add or override a label on every run (as for coordinator analyze); repeatable")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.analysis.engines import analyze

        out = args.out if args.out is not None else default_out(args.run_dirs)
        check_out(out, args.force)
        output = analyze(
            args.run_dirs,
            out_dir=out,
            profile=args.profile,
            master=args.master,
            labels=dict(args.label) or None,
            engine=args.engine,
        )
        stats = output.stats
        print(
            f"analysed {stats.runs} run(s), {stats.hosts} host(s), {stats.pids} process(es): {stats.samples} samples "
            f"in {stats.session_seconds + stats.job_seconds:.1f} s (Spark start-up {stats.session_seconds:.1f} s)"
        )
        print(f"wrote {output.summary_csv}")
        csv_path, index, by = write_campaign(out, args.by, args.series)
        print(f"wrote {csv_path} (x axis: label {by})")
        print(f"wrote {index}")
        print(f"next: open {index}")
        print(f"  another axis: coordinator campaign {' '.join(map(str, args.run_dirs))} --by LABEL --out {out}")
        return 0


def write_campaign(out: Path, by: str | None, series: str | None) -> tuple[Path, Path, str]:
    """campaign.csv and the page from ``out``/summary.csv (an analysis of several runs); returns their
    paths and the x label used. Also the demo's last step (`coordinator demo --rates`)."""
    from coordinator.analysis.campaign import (
        CAMPAIGN_FILE,
        campaign_rows,
        default_series,
        format_campaign,
        label_key_column,
        summary_label_columns,
    )
    from coordinator.analysis.rows import SUMMARY_FILE, read_summary
    from coordinator.report.campaign import render_campaign
    from profiler.files.atomic import atomic_write_text

    summary = read_summary(out / SUMMARY_FILE)
    label_columns = summary_label_columns(list(summary[0]) if summary else [])
    rows = campaign_rows(summary, label_columns)
    series = series or default_series(label_columns)
    if series != "engine":
        label_key_column(series, label_columns)  # a ConfigError naming the labels there are
    if by is None:
        values: dict[str, set[str]] = {}
        for row in rows:
            for key, value in row.labels.items():
                if key != series:
                    values.setdefault(key, set()).add(value)
        by = varying_label(values)
    label_key_column(by, label_columns)
    csv_path = out / CAMPAIGN_FILE
    atomic_write_text(csv_path, format_campaign(rows, label_columns))
    runs = len({r.run for r in rows})
    index = render_campaign(out / CAMPAIGN_REPORT_DIR, rows, by, series, f"{runs} runs by {by}")
    return csv_path, index, by


CampaignCommand.__doc__ = __doc__  # the module docstring, with examples, is the help text
COMMAND = CampaignCommand
