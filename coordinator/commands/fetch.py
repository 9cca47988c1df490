"""Bring home the captures a run left on its hosts, and complete its run.json.

When the coordinator is killed mid-run (kill -9, a lost laptop) or loses a host for longer than its
reconnect window, the host profilers are not stopped: each finishes its window on its own and keeps
its capture in its private work directory, which run.json names (`workdir`). This command reaches
those hosts again (SSH as in `coordinator profile`, with the run's copy of cluster.txt), waits for
a profiler still sampling (at most until the window's end plus the finish grace, then it is stopped
and what it has is kept), fetches each capture into RUN_DIR/hosts/<host>/ (what the analysis and the
report read: the host's <host>_unmatched.folded stays there unless --all), removes the work
directory, and rewrites run.json. Exit code 0 when every host is now ok, 9 when some are not.
Running it again is harmless: hosts without a work directory are left alone.

examples:
  $ coordinator fetch runs/20260122-101500
  node2: done
  fetched node2; run.json complete
  next: coordinator analyze runs/20260122-101500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from profiler.argtypes import existing_dir, positive_float


class FetchCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", type=existing_dir, metavar="RUN_DIR", help="run directory (run.json)")
        parser.add_argument("--known-hosts", type=Path, help="known_hosts file (default: ~/.ssh/known_hosts)")
        parser.add_argument("--connect-timeout", type=positive_float, default=10.0, help="seconds to reach a host (10)")
        parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines (for scripts)")
        parser.add_argument(
            "--all",
            action="store_true",
            dest="fetch_all",
            help="also fetch what the analysis does not read (each host's <host>_unmatched.folded)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.errors import PartialRunError
        from coordinator.remote.recover import fetch_run
        from coordinator.remote.session import make_transport

        outcome = fetch_run(
            args.run_dir,
            make_transport(args.known_hosts, False, args.connect_timeout),
            progress=not args.quiet,
            everything=args.fetch_all,
        )
        info = outcome.info
        if not outcome.fetched:
            print(f"fetch: no host of {args.run_dir} left a work directory; nothing to fetch")
        for host in info.hosts:
            if host.host in outcome.fetched or host.state != "ok":
                detail = f": {host.reason}" if host.reason else ""
                print(f"{host.host}: {host.state}{detail}", file=sys.stdout if host.ok else sys.stderr)
        print(f"wrote {args.run_dir / 'run.json'} ({'complete' if info.complete else 'partial'})")
        print(f"next: coordinator analyze {args.run_dir}")
        return 0 if info.complete else PartialRunError.exit_code


COMMAND = FetchCommand
