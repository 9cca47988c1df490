"""Export a run's stacks for other viewers: speedscope, pprof (go tool pprof, Pyroscope) or folded.

Reads the run's host captures (per-PID stacks, the analysed sub-window's intervals when
`analyze --from/--to` was used), gives every stack the task summary.csv counted it in (the same
matcher and profile) and writes one file:
  speedscope  a profile per host/PID with the task as root frame ([task: NAME]); --per-task: a
              profile per host/PID and task. Samples weighted by sample counts.
  pprof       gzip-compressed perftools.profiles.Profile: samples/count, cpu/nanoseconds (the PID's
              CPU seconds × the stack's share of its samples) and cycles/count when measured; every
              sample labelled run, host, pid, role, engine, kind, thread and task.
  folded      flamegraph.pl / inferno input with the task as root frame; --per-task: a directory
              with one file per task (the stacks as they are, like tasks/ of the analysis).
--task, --host and --pid select (repeatable). docs/exports.md shows how to open each file.

examples:
  coordinator export runs/20260122-014700 --format speedscope
  coordinator export runs/20260122-014700 --format pprof --host node1 --out node1.pb.gz
  coordinator export runs/20260122-014700 --format folded --task Deserialize | flamegraph.pl > d.svg
  coordinator export runs/20260122-014700 --format folded --per-task --pid 4242
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coordinator.commands.analyze import add_run_dir
from coordinator.export.formats import FORMATS, export_format
from profiler.argtypes import positive_int


class ExportCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser, metavar="RUN")
        parser.add_argument("--format", required=True, choices=tuple(FORMATS), help="file format to write")
        parser.add_argument("--task", action="append", default=[], metavar="T", help="only this task (repeatable)")
        parser.add_argument("--host", action="append", default=[], metavar="H", help="only this host (repeatable)")
        parser.add_argument(
            "--pid", action="append", default=[], type=positive_int, metavar="P", help="only this PID (repeatable)"
        )
        parser.add_argument(
            "--per-task",
            action="store_true",
            help="speedscope: a profile per PID and task; folded: a directory with one file per task",
        )
        parser.add_argument(
            "--out",
            type=Path,
            metavar="F",
            help="output file, '-' for standard output (default: RUN/exports/<run>[-host-H][-pid-P][-task-T].<ext>)",
        )
        parser.add_argument("--force", action="store_true", help="overwrite an existing output")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.export.files import Selection, output_path, sizes
        from coordinator.export.stacks import load_export_set, select
        from coordinator.report.formats import format_bytes
        from profiler.errors import ConfigError

        selection = Selection(tuple(args.task), tuple(args.host), tuple(args.pid))
        fmt = export_format(args.format)
        if args.out is not None and str(args.out) != "-":
            fmt.check_out(args.out, args.per_task, args.force)  # before any work
        export = select(load_export_set(args.run_dir), selection.tasks, selection.hosts, selection.pids)
        for host in export.left_out:
            print(f"export: warning: not exported: host {host}", file=sys.stderr)
        content = fmt.render(export, args.per_task)
        samples = sum(s.count for s in export.stacks)
        if args.out is not None and str(args.out) == "-":
            if not isinstance(content, bytes):
                raise ConfigError("--per-task writes a directory; give --out DIR instead of '-'")
            sys.stdout.buffer.write(content)
            sys.stdout.flush()
            what = f"{samples} samples of {len(export.processes)} process(es)"
            print(f"export: {what} to standard output", file=sys.stderr)
            return 0
        out = args.out if args.out is not None else output_path(
            args.run_dir, export.run_id, args.format, selection, args.per_task
        )
        fmt.check_out(out, args.per_task, args.force)
        written = fmt.write(content, out, args.force)
        print(
            f"export: wrote {out} ({args.format}, {format_bytes(sizes(written))}; {samples} samples of "
            f"{len(export.processes)} process(es), {len(export.stacks)} stacks)"
        )
        print(f"next: {fmt.next_step(out, args.per_task)}  (docs/exports.md)")
        return 0


COMMAND = ExportCommand
