"""Print the task table of an analysed run in the terminal: no browser needed over SSH.

Reads summary.csv (of a run directory, a bare capture's analysis/, or an `analyze --out` directory
of several runs) and prints per run the cluster table: samples, share ± 95 % CI, cycles, CPU
seconds, cycles per event and multi-task samples per task. --hosts and --pids add the tables of
every host and every process (only of --host H when given). Nothing is written.

examples:
  coordinator summary runs/20260122-014700
  coordinator summary runs/20260122-014700 --pids --host node1
  coordinator summary analysis/all-runs --hosts
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiler.argtypes import existing_dir


class SummaryCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "run_dir",
            type=existing_dir,
            metavar="RUN",
            help="run directory, host capture or analysis directory holding summary.csv",
        )
        parser.add_argument("--hosts", action="store_true", help="also a table per host")
        parser.add_argument("--pids", action="store_true", help="also a table per process")
        parser.add_argument(
            "--host", action="append", default=[], metavar="H", help="tables of this host only (repeatable)"
        )

    def run(self, args: argparse.Namespace) -> int:
        print_summary(args.run_dir, hosts=args.hosts or bool(args.host), pids=args.pids, only_hosts=args.host)
        return 0


def print_summary(run_dir: Path, hosts: bool = False, pids: bool = False, only_hosts: list[str] | None = None) -> None:
    """Print the task tables of ``run_dir``'s summary.csv (also `analyze --print`)."""
    from coordinator.analysis.rows import existing_summary, read_summary
    from coordinator.report.terminal import print_tables, task_tables
    from profiler.errors import ConfigError

    summary = existing_summary(Path(run_dir))
    if summary is None:
        raise ConfigError(f"{run_dir}: no summary.csv; run `coordinator analyze {run_dir}` first")
    rows = read_summary(summary)
    levels = ("cluster",) + (("host",) if hosts else ()) + (("pid",) if pids else ())
    known = sorted({row.get("host", "") for row in rows} - {"", "*"})
    for host in only_hosts or ():
        if host not in known:
            raise ConfigError(f"host {host}: not in {summary}; choose from: {', '.join(known)}")
    tables = task_tables(rows, levels, only_hosts or ())
    print(f"{summary}:")
    print_tables(tables)


COMMAND = SummaryCommand
