"""Rebuild the capture of a killed `profiler run` from its checkpoint journal.

A run that was killed (SIGKILL, the OOM killer, a crash of the host) before it wrote its capture leaves
DIR/checkpoint/journal.tpj: every --checkpoint seconds (30 by default) the run appended what it had
sampled since. This writes an ordinary capture into DIR from the last whole checkpoint: the window
ends there (samples after it are lost, at most one checkpoint period), meta.json says stopped_by
"recovered" with a warning. Processes still running are symbolized as usual; for those that are gone,
native frames are named from the saved /proc/PID/maps and the ELF files on disk, Java frames from the
saved perf-map versions. A damaged journal tail (a kill mid-write) is dropped, never fatal.
The coordinator runs this by itself for a host whose profiler died.

examples:
  profiler recover /tmp/cap
  profiler recover /tmp/cap --keep-journal
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from ..argtypes import existing_dir


class RecoverCommand:
    __doc__ = __doc__

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dir", type=existing_dir, metavar="DIR", help="the killed run's --out directory")
        parser.add_argument(
            "--keep-journal", action="store_true", help="keep DIR/checkpoint after the capture is written"
        )
        parser.add_argument("--quiet", action="store_true", help="print only the summary line")

    def run(self, args: argparse.Namespace) -> int:
        from ..capture.checkpoint import checkpoint_dir
        from ..run.recovery import recover_capture

        result = recover_capture(args.dir)
        if not args.keep_journal:
            shutil.rmtree(checkpoint_dir(args.dir), ignore_errors=True)
        at = time.strftime("%H:%M:%S", time.localtime(result.end_time))
        offline = sorted(pid for pid, how in result.symbolized.items() if how == "offline")
        print(
            f"recovered {result.samples} samples up to {at} ({result.checkpoints} checkpoints) into {args.dir}",
            flush=True,
        )
        if not args.quiet:
            if offline:
                print(f"profiler: pids {', '.join(map(str, offline))} were gone: named from saved maps and ELF files")
            if result.damage:
                print(f"profiler: warning: journal tail dropped ({result.damage})", file=sys.stderr)
            print(f"next: profiler match --profile {args.dir}/application_profile.txt {args.dir}")
        return 0


COMMAND = RecoverCommand
