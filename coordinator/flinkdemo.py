"""`coordinator demo --spe flink`: YSB on a local Flink cluster, profiled end to end."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.capture import read_events
from profiler.defaults import data_file

if TYPE_CHECKING:
    from .session import ProfileOutcome
    from .ysb.flink import JobWindow


def run_flink_demo(args: argparse.Namespace) -> int:
    """The demo's steps for Flink: cluster, job, warm-up, profile_cluster, the counts; 130 on Ctrl-C."""
    from .cluster import local_host
    from .commands.demo import _raise_interrupt, _remove_unused
    from .flinkcluster import flink_home
    from .rundir import new_run_id
    from .session import prepare_run_dir, profile_cluster
    from .ysb.flink import FlinkYsbEngine
    from .ysb.runner import YsbOptions

    out = args.out or Path("runs") / f"demo-{new_run_id()}"
    created = not out.exists()
    options = YsbOptions(rate=args.rate, campaigns=args.campaigns, sink=args.sink, executors=args.executors)
    engine = FlinkYsbEngine(options)  # refuses --sink file before anything starts
    prepare_run_dir(out, args.force)
    for child in out.iterdir():
        child.rmdir()
    say = print
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        flink_home(say=say)  # installs Flink into the cache on first use
        with tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch, engine:
            say(f"demo: {engine.describe()}, TaskManagers {engine.workload_pids()} (logs {engine.log_dir})")
            say(f"demo: YSB on flink at {args.rate} events/s, sink redis; waiting for the first window")
            engine.wait_ready(args.ready_timeout)
            say(f"demo: processing; warming up for {args.warmup:.0f} s")
            engine.wait_processing(args.warmup)
            say(f"demo: profiling for {args.duration:.0f} s; events counted from {engine.events_source}")
            known_spes = Path(scratch) / "known_spes.txt"
            known_spes.write_text(engine.known_spes())
            outcome = profile_cluster(
                [local_host()],
                duration=args.duration,
                out_dir=out,
                profile=data_file(engine.profile),
                known_spes=known_spes,
                frequency=args.frequency,
                labels={"workload": "ysb", "spe": engine.spe, "rate": str(args.rate), "campaigns": str(args.campaigns)},
                progress=not args.quiet,
                force=args.force,
            )
            engine.check_running()  # a job that failed inside the window leaves a meaningless profile
            started = outcome.info.start_time or 0.0
            ended = min(outcome.info.end_time or started + args.duration, started + args.duration)
            job = engine.job_window(started, ended)
    except KeyboardInterrupt:
        print("coordinator demo: interrupted; everything it started is stopped", file=sys.stderr)
        _remove_unused(out, created)
        return 130
    except BaseException:
        _remove_unused(out, created)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return _print_result(outcome, max(0.0, ended - started), job)


def _print_result(outcome: ProfileOutcome, elapsed: float, job: JobWindow) -> int:
    from .commands.demo import DemoCommand

    counted = [read_events(path) for path in sorted((outcome.run_dir / "hosts").glob("*"))]
    rest = next((c.count for c in counted if c is not None and c.count is not None), None)
    rest_text = f"{rest} events (Flink REST API, source numRecordsOut)" if rest is not None else "no REST event count"
    print(
        f"demo: {rest_text} in the {elapsed:.0f} s window; the job's own count from its Redis windows: "
        f"{job.events} in {job.windows} windows; {job.sink_rows} window rows in the sink"
    )
    return DemoCommand.print_outcome(outcome)
