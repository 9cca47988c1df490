"""`coordinator profile`: capture every host of the cluster at once (see ProfileCommand for the help)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.commands.analyze import add_label_option
from coordinator.rundir import MAX_START_DELAY
from profiler.argtypes import bounded, positive_float
from profiler.run.options import FORWARDED, add_run_arguments, option_values
from profiler.scope.spes import ROLES

if TYPE_CHECKING:
    from coordinator.remote.cluster import HostSpec
    from coordinator.remote.session import ProfileOutcome

_HELP = """Profile every host of cluster.txt at the same time and bring the results home.

Connects to each host (SSH with key authentication and known_hosts checking; the bare `localhost`
entry runs locally without SSH), ships the host agent into a private temporary directory, starts
`profiler run` on all hosts so that sampling begins within a second everywhere, shows one progress
line per host, fetches every capture into runs/<run-id>/hosts/<host>/, removes everything it put on
the hosts, then computes summary.csv and the HTML report. Ctrl-C stops every host early and keeps
what was sampled. A host that cannot be profiled is listed with its reason in run.json; the others
complete (exit code 9 for such a partial run, 0 when every host succeeded).

cluster.txt, one host per line:  [user@]host[:port] [role...] [identity=KEY] [name=LABEL] [python=PATH]

examples:
  $ coordinator profile --duration 900
  localhost: sampling, 12 s, 888 s left, 3 processes
  ...
  wrote runs/20260122-101500/summary.csv
  $ coordinator profile --cluster cluster.txt --duration 300 --label load=50k --label engine=spark
  $ coordinator profile --duration 60 --accept-new-hosts       # first contact: record host keys
  $ coordinator profile --duration 60 --out runs/baseline --force --quiet
  $ coordinator profile --duration 60 --roles workload,managing,broker   # the Kafka brokers' cost too
  then:
  $ coordinator analyze runs/baseline --profile my_edited_profile.txt
  $ xdg-open runs/baseline/report/index.html
"""

# profiler run's options as every host gets them (profiler/run/options.py), worded for the whole cluster
WORDING = {
    "duration": "sampling window in seconds",
    "roles": f"the known_spes.txt roles to profile, of {', '.join(ROLES)} ({{default}}): broker adds the Kafka "
    "brokers, counted like managing processes, with their cycles per event in summary.csv",
    "off_cpu": "also sum each task's blocked time by cause on every host (profiler run --off-cpu, docs/offcpu.md)",
    "interval": "seconds per timeline slice ({default}): the report's time chart, analyze --from/--to",
    "perf_map_refresh": "seconds between Java perf-map refreshes on every host ({default}; 0 = at the end only)",
    "checkpoint": "seconds between checkpoints of every host profiler ({default}; 0 = none): a host profiler "
    "killed mid-window is recovered up to its last one (the host is 'partial')",
    "events": "events the application processed in the window",
    "pids": "also sample this PID on every host",
}


def add_roles_option(parser: argparse.ArgumentParser) -> None:
    """--roles: which roles of known_spes.txt each host puts in its scope (profiler run --roles)."""
    add_run_arguments(parser, ["roles"], WORDING)


class ProfileCommand:
    __doc__ = _HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, ["duration"], WORDING)
        parser.add_argument(
            "--cluster",
            type=Path,
            default=None,
            help="cluster file (default: ./cluster.txt, else the installed one, which holds localhost)",
        )
        parser.add_argument("--out", type=Path, help="run directory (default: runs/<run-id>)")
        parser.add_argument("--force", action="store_true", help="replace an existing run directory")
        passed = [name for name in FORWARDED if name not in ("duration", "pids", "events")]
        add_run_arguments(parser, [*passed, "events"], WORDING)  # --profile ... --events, as profiler run has them
        add_label_option(parser, "experiment factor recorded in run.json (repeatable), e.g. load=50k")
        parser.add_argument(
            "--accept-new-hosts", action="store_true", help="record unknown host keys (never changed ones)"
        )
        parser.add_argument("--known-hosts", type=Path, help="known_hosts file (default: ~/.ssh/known_hosts)")
        parser.add_argument("--connect-timeout", type=positive_float, default=10.0, help="seconds to reach a host (10)")
        parser.add_argument(
            "--start-delay",
            type=bounded(float, 0.0, MAX_START_DELAY, "seconds"),
            default=None,
            help="seconds between 'all hosts deployed' and the common start at the latest, for BPF compilation; "
            "the hosts start together earlier once every profiler is attached (10)",
        )
        add_run_arguments(parser, ["pids"], WORDING)
        parser.add_argument("--no-analyze", action="store_true", help="only capture; run `coordinator analyze` later")
        parser.add_argument(
            "--fetch-all",
            action="store_true",
            help="also fetch what the analysis does not read (each host's <host>_unmatched.folded)",
        )
        parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines (for scripts)")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.remote.cluster import default_cluster_file
        from coordinator.remote.session import load_cluster
        from coordinator.rundir import new_run_id
        from profiler.defaults import DEFAULT_KNOWN_SPES, DEFAULT_PROFILE, data_file

        args.cluster = args.cluster or default_cluster_file()
        hosts = load_cluster(args.cluster)
        out = args.out or Path("runs") / new_run_id()
        profile = args.profile or data_file(DEFAULT_PROFILE)
        known_spes = args.known_spes or data_file(DEFAULT_KNOWN_SPES)
        labels = dict(args.label)
        try:
            outcome = self._profile(args, hosts, out, profile, known_spes, labels)
        except KeyboardInterrupt:
            from coordinator.rundir import is_run_dir

            if not is_run_dir(out):
                raise
            print(
                f"coordinator profile: analysis interrupted; the captures are in {out}; "
                f"next: coordinator analyze {out}",
                file=sys.stderr,
            )
            return 130
        return self._report(outcome)

    @staticmethod
    def _profile(
        args: argparse.Namespace,
        hosts: Sequence[HostSpec],
        out: Path,
        profile: Path,
        known_spes: Path,
        labels: dict[str, str],
    ) -> ProfileOutcome:
        from coordinator.remote.hosts import run_request
        from coordinator.remote.session import RunOptions, profile_cluster

        passed = {**option_values(args, FORWARDED), "profile": profile, "known_spes": known_spes}
        request = run_request(**passed, fetch_all=args.fetch_all)
        options = RunOptions(
            labels=labels,
            cluster_file=args.cluster,
            known_hosts=args.known_hosts,
            accept_new_hosts=args.accept_new_hosts,
            connect_timeout=args.connect_timeout,
            start_delay=args.start_delay,
            progress=not args.quiet,
            analyze=not args.no_analyze,
            force=args.force,
        )
        return profile_cluster(hosts, request, out, options)

    @staticmethod
    def _report(outcome: ProfileOutcome) -> int:
        from coordinator.errors import PartialRunError

        run_dir = outcome.run_dir
        for warning in outcome.warnings:
            print(f"coordinator profile: warning: {warning}", file=sys.stderr)
        print_hosts_and_files(outcome, "coordinator profile")
        if outcome.report is not None:
            print(f"wrote {outcome.report}")
        if outcome.analysis_error:
            print(
                f"coordinator profile: analysis failed (the captures are kept): {outcome.analysis_error}; "
                f"retry with: coordinator analyze {run_dir}",
                file=sys.stderr,
            )
        print(f"next: edit a copy of {run_dir / 'application_profile.txt'}, then")
        print(f"      coordinator analyze {run_dir} --profile EDITED_PROFILE")
        if outcome.report is not None:
            print(f"      open {outcome.report}")
        else:
            print(f"      coordinator report {run_dir}")
        if not outcome.complete:
            failed = [h.host for h in outcome.info.hosts if h.state != "ok"]
            print(
                f"coordinator profile: partial run: {len(failed)} of {len(outcome.info.hosts)} host(s) not fully "
                f"profiled ({', '.join(failed)}); see {run_dir / 'run.json'}",
                file=sys.stderr,
            )
            return PartialRunError.exit_code
        return 1 if outcome.analysis_error else 0


COMMAND = ProfileCommand


def print_hosts_and_files(outcome: ProfileOutcome, prog: str) -> None:
    """After a profile (coordinator profile, demo): the hosts that are not ok on stderr, then the run's
    run.json and summary.csv as written."""
    for host in outcome.info.hosts:
        if host.state != "ok":
            print(f"{prog}: {host.host}: {host.state}: {host.reason}", file=sys.stderr)
    print(f"wrote {outcome.run_dir / 'run.json'}")
    if outcome.summary_csv is not None:
        print(f"wrote {outcome.summary_csv}")
