"""Re-match saved folded stacks with an application profile, without profiling again.

STACKS are stack files (folded text, root first, count last, or a capture's stacks.tpc stack table) or
directories: a host capture directory, or a coordinator run directory, whose pids/*/stacks.tpc (or, in
captures before format 4, pids/*/stacks.folded) files are all read. Prints samples and share
per task (with the 95 % confidence interval of the share), how many samples the leaf-first rule
decided between several tasks, and the top self frames of unmatched stacks as candidate patterns.
Nothing is written unless --csv or --unmatched is given.

examples:
  profiler match --profile application_profiles/spark_structured_streaming.txt capture/
  profiler match --profile my.txt capture/pids/4242/stacks.tpc --csv tasks.csv
  profiler match --profile my.txt runs/20260101-1200/ --unmatched unmatched.folded --top 20
  profiler match --profile my.txt --explain 'Executor task l;...;JacksonParser.parse'
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from ..argtypes import existing_path, non_negative_int
from ..capture.checks import contained, present
from ..capture.format import META_FILE, PIDS_DIR, SAMPLER_FILE, STACKS_FILE
from ..capture.read import check_pid_files, read_meta, read_sampler_stats
from ..capture.stacktable import STACK_TABLE_FILE, is_table_file, read_table
from ..defaults import DEFAULT_PROFILE, data_file
from ..errors import CaptureFormatError, ConfigError
from ..files.atomic import atomic_write_text
from ..files.outputs import check_output_file, csv_header, folded_text
from ..matching.matcher import MatchResult
from ..matching.stats import share_ci95


def stack_files(inputs: Sequence[Path]) -> list[Path]:
    """Stack files named directly, and every PID's stacks file below each directory (its stacks.tpc, else
    its stacks.folded)."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            tables = sorted(path.rglob(f"{PIDS_DIR}/*/{STACK_TABLE_FILE}"))
            have_table = {table.parent for table in tables}
            folded = [f for f in path.rglob(f"{PIDS_DIR}/*/{STACKS_FILE}") if f.parent not in have_table]
            found = sorted(tables + folded)
            if not found:
                raise ConfigError(
                    f"{path}: no {PIDS_DIR}/*/{STACK_TABLE_FILE} or {PIDS_DIR}/*/{STACKS_FILE} below this directory; "
                    "pass stack files, a capture directory or a run directory"
                )
            # a link or a FIFO where a stacks file belongs is refused (checks.present), never read through
            files.extend(contained(path, found_file) for found_file in found if present(found_file))
            # a capture of a format this build does not read, or whose files are not of its format, is refused
            for found_file in found:
                capture_dir = found_file.parent.parent.parent
                if (capture_dir / META_FILE).exists() and found_file.parent.name.isdigit():
                    check_pid_files(capture_dir, read_meta(capture_dir), int(found_file.parent.name))
        else:
            files.append(path)
    # The same file named twice would count its samples twice.
    return list(dict.fromkeys(p.resolve() for p in files))


def format_stack_health(files: Sequence[Path]) -> str:
    """Per PID of a capture (a pids/PID/stacks.folded beside its sampler.json): what the walk lost."""
    lines = []
    for path in files:
        sampler_file = path.parent / SAMPLER_FILE
        if path.name not in (STACKS_FILE, STACK_TABLE_FILE) or not sampler_file.is_file():
            continue
        try:
            stats = read_sampler_stats(path.parent.parent.parent, int(path.parent.name))
        except (ValueError, CaptureFormatError):
            continue
        if stats is None:
            continue
        for health in (stats.stack_health(), stats.inlining_health()):
            if health is not None:
                lines.append(f"  pid {stats.pid}: {health}")
    if not lines:
        return ""
    return "\nstack health (see docs/capture-format.md, sampler.json):\n" + "\n".join(lines) + "\n"


def format_table(result: MatchResult, top_candidates: Sequence[tuple[str, int]]) -> str:
    """The task table: samples and share ± half-width of its 95 % CI, then the quality figures."""
    total = result.total_samples
    rows: list[tuple[str, str, str]] = []
    for task, samples in result.task_samples.items():
        share = f"{100 * samples / total:6.2f} % ± {100 * share_ci95(samples, total):.2f}" if total else "-"
        rows.append((task, str(samples), share))
    rows.append(("total", str(total), "100 %" if total else "-"))
    width = max(len(r[0]) for r in rows)
    count_width = max(max(len(r[1]) for r in rows), 7)
    lines = [f"{'task':<{width}}  {'samples':>{count_width}}  share (± 95 % CI)"]
    for task, count_text, share in rows:
        lines.append(f"{task:<{width}}  {count_text:>{count_width}}  {share}")
    multi_share = f" ({100 * result.multi_task_samples / total:.1f} %)" if total else ""
    lines.append("")
    lines.append(
        f"multi-task samples: {result.multi_task_samples}{multi_share} matched more than one task in "
        "different frames; the leaf-first rule decided them"
    )
    for (chosen, other), count in sorted(result.decided_over.items(), key=lambda item: (-item[1], item[0]))[:10]:
        lines.append(f"  {count:>{count_width}}  {chosen} over {other}")
    if top_candidates:
        lines.append("")
        lines.append("top self frames of unmatched stacks (candidate patterns):")
        for frame, count in top_candidates:
            lines.append(f"  {count:>{count_width}}  {frame}")
    return "\n".join(lines) + "\n"


def result_csv(result: MatchResult) -> str:
    """Columns task,samples,share; share is empty when there are no samples."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["task", "samples", "share"])
    for task, samples in result.task_samples.items():
        share = samples / result.total_samples if result.total_samples else None
        writer.writerow([task, samples, "" if share is None else f"{share:.6g}"])
    return buffer.getvalue()


class MatchCommand:
    __doc__ = __doc__  # the module's: its examples reach --help (a class docstring would hide them)

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "stacks",
            nargs="*",
            type=existing_path,
            metavar="STACKS",
            help="folded files, capture directories or run directories",
        )
        parser.add_argument(
            "--profile",
            type=existing_path,
            default=None,
            help=f"application profile (default: {DEFAULT_PROFILE})",
        )
        parser.add_argument("--csv", type=Path, metavar="OUT", help="write task,samples,share to this CSV file")
        parser.add_argument("--unmatched", type=Path, metavar="OUT", help="write the unmatched stacks (folded)")
        parser.add_argument(
            "--top", type=non_negative_int, default=10, help="candidate patterns to list from unmatched stacks (10)"
        )
        parser.add_argument(
            "--explain",
            action="append",
            default=[],
            metavar="STACK",
            help="print which frame and pattern decide this folded stack (repeatable; STACKS optional)",
        )
        parser.add_argument("--force", action="store_true", help="overwrite existing --csv/--unmatched files")

    def run(self, args: argparse.Namespace) -> int:
        from ..capture.folded import format_folded
        from ..matching.appprofile import load_profile
        from ..matching.matcher import Matcher, StackAccumulator, candidate_patterns

        if not args.stacks and not args.explain:
            raise ConfigError("nothing to match; pass folded files or capture directories (or --explain STACK)")
        if args.csv is not None:
            check_output_file(args.csv, "--csv", force=args.force, signature=csv_header("task", "samples", "share"))
        if args.unmatched is not None:
            check_output_file(args.unmatched, "--unmatched", force=args.force, signature=folded_text)
        profile_path = args.profile if args.profile is not None else data_file(DEFAULT_PROFILE)
        matcher = Matcher(load_profile(profile_path))
        for stack in args.explain:
            print(matcher.explain(stack.strip()).describe())
        if not args.stacks:
            return 0
        files = stack_files(args.stacks)
        accumulator = StackAccumulator(matcher)
        for path in files:
            try:
                if path.name == STACK_TABLE_FILE or is_table_file(path):
                    accumulator.add_table(read_table(path))
                else:
                    accumulator.add_folded_file(path)
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}); check the path") from None
        result = accumulator.result()
        # task_stacks stay unbuilt: materializing every task's table would cost as much as matching
        print(
            f"profile {profile_path}: {len(matcher.task_names)} tasks; {len(files)} stack file(s), "
            f"{accumulator.entries} stacks"
        )
        print(format_table(result, candidate_patterns(result.unmatched, args.top)), end="")
        print(format_stack_health(files), end="")
        if args.csv is not None:
            atomic_write_text(args.csv, result_csv(result))
            print(f"wrote {args.csv}", file=sys.stderr)
        if args.unmatched is not None:
            atomic_write_text(args.unmatched, format_folded(result.unmatched))
            print(f"wrote {args.unmatched} ({len(result.unmatched)} stacks)", file=sys.stderr)
        if result.unmatched:
            print("next: add patterns for the frames above to the profile and run this command again", file=sys.stderr)
        return 0


COMMAND = MatchCommand
