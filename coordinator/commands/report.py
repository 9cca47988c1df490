"""Render the HTML report of a run directory (or of one bare host capture).

Reads run.json, the host captures, summary.csv (or the hosts' <host>_result.csv) and the
application profile, and writes RUN_DIR/report/index.html with task-coloured flamegraphs, the task
tables, a cycles chart and a health panel. Works offline: d3 and d3-flame-graph are copied beside it.
A previous report in the output directory is replaced atomically.

examples:
  coordinator report runs/20260122-014700
  coordinator report runs/20260122-014700 --publish /var/www/html/profiles
  coordinator report /tmp/cap --out /tmp/cap-report --max-stacks 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coordinator.commands.analyze import add_run_dir
from profiler.argtypes import bounded

DEFAULT_MAX_STACKS = 3000  # keep in step with coordinator.report.flame.DEFAULT_MAX_STACKS (not imported: lazy)


max_stacks = bounded(int, 0, what="distinct stacks (0 keeps every stack)")


class ReportCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        parser.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: RUN_DIR/report)")
        parser.add_argument(
            "--max-stacks",
            type=max_stacks,
            default=DEFAULT_MAX_STACKS,
            metavar="N",
            help="distinct stacks drawn per flamegraph; the smallest beyond N are merged into one "
            f"frame (default {DEFAULT_MAX_STACKS}, 0 keeps all)",
        )
        parser.add_argument(
            "--publish",
            type=Path,
            metavar="DIR",
            help="also copy the report to DIR/<run-id>/ and rewrite DIR/index.html (all runs)",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="replace an --out directory this tool wrote that is not a report (never one of your own files)",
        )

    def run(self, args: argparse.Namespace) -> int:
        import json

        from coordinator.report.publish import check_publish_root
        from coordinator.report.render import format_bytes, render_report

        if args.publish is not None:
            check_publish_root(args.publish)  # before any work, as every output
        index = render_report(args.run_dir, args.out, max_stacks=args.max_stacks, force=args.force)
        summary = json.loads((index.parent / "report.json").read_text(encoding="utf-8"))
        print(
            f"report: wrote {index} ({format_bytes(index.stat().st_size)}; payload "
            f"{format_bytes(summary['payload_bytes'])} in {summary['flamegraphs']} flamegraphs)"
        )
        if summary["flamegraphs_pruned"]:
            print(
                f"report: {summary['flamegraphs_pruned']} flamegraph(s) draw only their {summary['max_stacks']} "
                "largest stacks; --max-stacks N changes that (0 keeps all)"
            )
        if args.publish is not None:
            from coordinator.report.publish import publish

            problems: list[str] = []
            published = publish(index.parent, args.publish, problems)
            for problem in problems:
                print(f"report: warning: {problem}", file=sys.stderr)
            print(f"report: published {published} and {args.publish / 'index.html'}")
            print(f"next: coordinator serve {args.publish}")
        else:
            print(f"next: open {index.resolve().as_uri()}  (or: coordinator serve {index.parent})")
        return 0


COMMAND = ReportCommand
