"""`coordinator demo --spe flink`: YSB on a local Flink cluster, profiled end to end."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.capture import read_events
from profiler.defaults import data_file

if TYPE_CHECKING:
    from .session import ProfileOutcome

FLINK_PROFILE = "application_profiles/flink.txt"
# Windows fire once the watermark (1 s behind the newest event) passes their end.
_WINDOW_FIRE_S = 13.0


def flink_known_spes(conf_dir: Path) -> str:
    """A known_spes file that selects only this demo's Flink processes (by their --configDir)."""
    return "\n".join(
        [
            "# coordinator demo --spe flink: only the processes of this demo's local cluster",
            f"flink  workload  taskmanager  org.apache.flink.runtime.taskexecutor.TaskManagerRunner  arg={conf_dir}",
            "flink  managing  jobmanager  org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
            f"  arg={conf_dir}",
            "",
        ]
    )


def run_flink_demo(args: argparse.Namespace) -> int:
    """The demo's steps for Flink: cluster, job, warm-up, profile_cluster, the counts; 130 on Ctrl-C."""
    from .cluster import local_host
    from .commands.demo import _raise_interrupt, _remove_unused
    from .flinkcluster import LocalFlinkCluster, flink_home
    from .rundir import new_run_id
    from .session import prepare_run_dir, profile_cluster
    from .ysb.flink import YsbFlinkOptions, YsbFlinkRun, events_between, taskmanager_java_options

    if args.sink == "file":
        print("coordinator demo: --spe flink writes to Redis only; drop --sink file", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / f"demo-{new_run_id()}"
    created = not out.exists()
    prepare_run_dir(out, args.force)
    for child in out.iterdir():
        child.rmdir()
    say = print
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    options = YsbFlinkOptions(rate=args.rate, campaigns=args.campaigns, parallelism=args.executors)
    try:
        flink_home(say=say)  # installs Flink into the cache on first use
        with (
            tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch,
            LocalFlinkCluster(
                taskmanagers=args.executors, slots=1, taskmanager_java_options=taskmanager_java_options()
            ) as cluster,
        ):
            say(f"demo: Flink JobManager {cluster.rest_url}, TaskManagers {cluster.taskmanager_pids()} "
                f"(logs {cluster.tmp_dir})")
            with YsbFlinkRun(cluster, options) as ysb:
                say(f"demo: YSB job {ysb.job_id} at {args.rate} events/s, sink redis; waiting for the first window")
                ysb.wait_ready(timeout=args.ready_timeout)
                say(f"demo: processing; warming up for {args.warmup:.0f} s")
                ysb.wait_processing(args.warmup)
                say(f"demo: profiling for {args.duration:.0f} s")
                known_spes = Path(scratch) / "known_spes.txt"
                known_spes.write_text(flink_known_spes(cluster.tmp_dir / "conf"))
                outcome = profile_cluster(
                    [local_host()],
                    duration=args.duration,
                    out_dir=out,
                    profile=data_file(FLINK_PROFILE),
                    known_spes=known_spes,
                    frequency=args.frequency,
                    labels={
                        "workload": "ysb", "spe": "flink", "rate": str(args.rate), "campaigns": str(args.campaigns)
                    },
                    progress=not args.quiet,
                    force=args.force,
                )
                started = outcome.info.start_time or 0.0
                ended = min(outcome.info.end_time or started + args.duration, started + args.duration)
                # The windows covering the window's end must have fired before the job's count is read.
                time.sleep(max(0.0, ended + _WINDOW_FIRE_S - time.time()))
                job_events = events_between(ysb.window_counts(), started, ended)
                windows_written = ysb.redis_windows()
    except KeyboardInterrupt:
        print("coordinator demo: interrupted; everything it started is stopped", file=sys.stderr)
        _remove_unused(out, created)
        return 130
    except BaseException:
        _remove_unused(out, created)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return _print_result(outcome, max(0.0, ended - started), job_events, windows_written)


def _print_result(outcome: ProfileOutcome, elapsed: float, job_events: float, windows_written: int) -> int:
    from .commands.demo import DemoCommand

    counted = [read_events(path) for path in sorted((outcome.run_dir / "hosts").glob("*"))]
    rest = next((c.count for c in counted if c is not None and c.count is not None), None)
    rest_text = f"{rest} events (Flink REST API, source numRecordsOut)" if rest is not None else "no REST event count"
    print(
        f"demo: {rest_text} in the {elapsed:.0f} s window; the job's own count from its Redis windows: "
        f"{job_events:.0f}; {windows_written} window rows in the sink"
    )
    return DemoCommand.print_outcome(outcome)
