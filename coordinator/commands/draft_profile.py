"""Draft an application profile for the Spark query or Flink job of a run, from its plan and its stacks.

Tasks are named after the query's physical operators: one per whole-stage-codegen stage (the
operators Spark fused into GeneratedIteratorForCodegenStage<N>, from the SQL plan the host agent read
from the driver's REST API into spark.json), one per operator Spark runs outside generated code
(scan, JSON, state store, exchange, sink), then the runtime (network, task runtime, GC, JIT) and the
thread kinds nothing else claims. Only tasks that get samples are kept. It prints the profile on stdout
(`> FILE` keeps it) or writes it with --out, for you to edit and analyse with; the share each task
would get on this run and the next steps go to stderr.
Without spark.json (the REST API was off) codegen stages are listed as "operators unknown".
For a Flink run (flink.json in a capture) the tasks are the job graph's operators, Flink's runtime
and, per job vertex, what no operator claims ("chain, operator unknown"); docs/matching.md.
On both engines a run reading Kafka gets "Kafka source (consumer fetch)" and, apart from it, "Kafka
record deserialization" first.

examples:
  coordinator draft-profile runs/demo-20261123-1840
  coordinator draft-profile runs/demo-20261123-1840 --out my_query.txt
  coordinator analyze runs/demo-20261123-1840 --profile my_query.txt --by stage
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.commands.analyze import add_run_dir

if TYPE_CHECKING:
    from coordinator.analysis.draft import Draft
    from coordinator.analysis.stages import SparkIndex


class DraftProfileCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        parser.add_argument("--out", type=Path, metavar="FILE", help="write the drafted profile to FILE")
        parser.add_argument("--force", action="store_true", help="replace an existing --out FILE")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.analysis.draft import draft_profile
        from coordinator.analysis.flinkdraft import draft_flink_profile, flink_vertices_of
        from coordinator.analysis.inputs import read_inputs, read_pid_stacks
        from coordinator.analysis.stages import read_spark_index
        from profiler.errors import ConfigError
        from profiler.files.atomic import atomic_write_text
        from profiler.files.outputs import check_output_file, text_prefix

        if args.out is not None:  # a draft this command wrote starts with its "# Drafted by" comment
            check_output_file(args.out, "--out", force=args.force, signature=text_prefix(b"# Drafted by"))
        (run,) = read_inputs([args.run_dir], None, None)
        stacks: Counter[str] = Counter()
        for pid in run.pids:
            if pid.stacks is not None:
                stacks.update(read_pid_stacks(pid.stacks, pid.intervals))
        if not stacks:
            raise ConfigError(
                f"{args.run_dir}: no stacks of workload processes to draft from; profile a run in which the "
                "scope finds the engine's workload processes (see scope.json, known_spes.txt)"
            )
        vertices = flink_vertices_of(run)
        index = read_spark_index(run)
        if vertices:  # a Flink run: tasks from its job graph (flink.json)
            draft = draft_flink_profile(stacks, vertices, str(args.run_dir))
        else:
            draft = draft_profile(stacks, index, str(args.run_dir))
        # The profile is this command's data: it alone goes to stdout (`draft-profile RUN > my.txt` is a
        # profile); the shares, notes and next steps go to stderr.
        if args.out is None:
            sys.stdout.write(draft.text)
            sys.stdout.flush()
        for line in draft_notes(draft, None if vertices else index):
            print(line, file=sys.stderr)
        if args.out is not None:
            atomic_write_text(args.out, draft.text)
            print(f"wrote {args.out}", file=sys.stderr)
            by = " --by vertex" if vertices else " --by stage"
            print(f"next: edit it, then: coordinator analyze {args.run_dir} --profile {args.out}{by}", file=sys.stderr)
        else:
            print(
                f"next: coordinator draft-profile {args.run_dir} > FILE (or --out FILE); edit FILE; analyze with "
                "--profile FILE",
                file=sys.stderr,
            )
        return 0


def draft_notes(draft: Draft, index: SparkIndex | None) -> list[str]:
    """What the user reads beside the draft: a missing Spark plan, the shares on this run, candidate leaves."""
    lines = []
    if index is not None and not index.reachable:
        note = index.notes[0] if index.notes else "no spark.json in the captures"
        lines.append(f"note: no Spark plan ({note}); codegen stages are not named by their operators")
    lines.append(f"shares on this run ({draft.samples} samples of the workload processes):")
    lines.extend(f"  {share:6.1%}  {samples:8d}  {task}" for task, samples, share in draft.shares)
    if draft.candidates:
        leaves = ", ".join(frame for frame, _samples in draft.candidates[:5])
        lines.append(f"unmatched stacks' leaf frames (candidate patterns): {leaves}")
    return lines


COMMAND = DraftProfileCommand
