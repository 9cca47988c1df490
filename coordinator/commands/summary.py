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

from coordinator.commands.analyze import add_run_dir


class SummaryCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser, metavar="RUN", help="run directory, host capture or analysis directory holding summary.csv")
        parser.add_argument("--hosts", action="store_true", help="also a table per host")
        parser.add_argument("--pids", action="store_true", help="also a table per process")
        parser.add_argument(
            "--host", action="append", default=[], metavar="H", help="tables of this host only (repeatable)"
        )

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.report.terminal import print_summary

        print_summary(args.run_dir, hosts=args.hosts or bool(args.host), pids=args.pids, only_hosts=args.host)
        return 0


COMMAND = SummaryCommand
