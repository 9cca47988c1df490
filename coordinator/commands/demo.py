"""`coordinator demo`: YSB on a local Spark cluster, profiled end to end (see DemoCommand for the help)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from profiler.argtypes import bounded

_HELP = """Run the Yahoo Streaming Benchmark on a local Spark cluster and profile it: the first result.

Starts a Spark standalone Master and Worker from the pyspark package on free loopback ports, two
1-core executors (-XX:+PreserveFramePointer), and the YSB query on Spark Structured Streaming:
generated ad events (JSON) -> from_json -> filter views -> projection -> join with the static
ad->campaign table -> enrich (pre-window latency) -> 10 s event-time window count per campaign ->
Redis (a private redis-server, when installed; a CSV file sink otherwise). Once micro-batches flow,
profiles the executors for --duration seconds with the shipped Spark profile, writes summary.csv
and the HTML report into the run directory, prints the throughput, and stops everything it
started (also on Ctrl-C). Needs root for eBPF; expect about a minute of start-up.

--spe flink runs the same pipeline as a Java DataStream job on a local Flink standalone cluster
(a JobManager and --executors TaskManagers with one slot each, from PyPI's apache-flink
distribution, installed into ~/.cache/spe-taskprof on first use), profiles the TaskManagers and the
JobManager with the shipped Flink profile and counts events from Flink's REST API.

examples:
  $ coordinator demo
  $ coordinator demo --duration 30 --rate 10000 --out runs/demo --force
  $ coordinator demo --sink file --executors 1
  $ coordinator demo --spe flink
  then:
  $ xdg-open runs/demo/report/index.html
  $ coordinator analyze runs/demo --profile my_edited_profile.txt
"""


_positive_int = bounded(int, 1)
_duration = bounded(float, 1.0, 86400.0, "seconds")
_non_negative = bounded(float, 0.0, 3600.0, "seconds")
_executors = bounded(int, 1, 8, "local executors")


def demo_known_spes(master_port: int, driver_port: int) -> str:
    """A known_spes file that selects only this demo's processes (the machine may run other Spark)."""
    return "\n".join(
        [
            "# coordinator demo: only the processes of this demo's local cluster",
            "spark  workload  executor  org.apache.spark.executor.CoarseGrainedExecutorBackend"
            f"  arg=spark://CoarseGrainedScheduler@127.0.0.1:{driver_port}",
            f"spark  managing  driver   org.apache.spark.deploy.SparkSubmit  arg=spark.driver.port={driver_port}",
            f"spark  managing  master   org.apache.spark.deploy.master.Master  arg={master_port}",
            f"spark  managing  worker   org.apache.spark.deploy.worker.Worker  arg=spark://127.0.0.1:{master_port}",
            "",
        ]
    )


def _remove_unused(run_dir: Path, created: bool) -> None:
    """Undo prepare_run_dir when profiling never started (no run.json), so the same --out works again."""
    if created and run_dir.is_dir() and not (run_dir / "run.json").exists():
        shutil.rmtree(run_dir, ignore_errors=True)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class DemoCommand:
    __doc__ = _HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--duration", type=_duration, default=60.0, help="seconds to profile (60)")
        parser.add_argument(
            "--spe", choices=("spark", "flink"), default="spark", help="the engine: Spark Structured Streaming or Flink"
        )
        parser.add_argument("--out", type=Path, help="run directory (default: runs/demo-<time>)")
        parser.add_argument("--force", action="store_true", help="replace an existing run directory")
        parser.add_argument("--rate", type=_positive_int, default=20_000, help="generated events per second (20000)")
        parser.add_argument("--campaigns", type=_positive_int, default=1000, help="YSB campaigns, 10 ads each (1000)")
        parser.add_argument(
            "--warmup",
            type=_non_negative,
            default=30.0,
            help="seconds of processing before profiling starts, so the JIT has compiled the pipeline (30)",
        )
        parser.add_argument(
            "--executors", type=_executors, default=2, help="1-core executors; 1-slot TaskManagers for flink (2)"
        )
        parser.add_argument(
            "--sink", choices=("auto", "redis", "file"), default="auto", help="auto: Redis when redis-server exists"
        )
        parser.add_argument("--frequency", type=_positive_int, default=99, help="samples per second per CPU (99)")
        parser.add_argument(
            "--ready-timeout", type=_duration, default=600.0, help="seconds to wait for the first micro-batch (600)"
        )
        parser.add_argument("--quiet", "-q", action="store_true", help="no per-host progress lines")

    def run(self, args: argparse.Namespace) -> int:
        if args.spe == "flink":
            from ..flinkdemo import run_flink_demo

            return run_flink_demo(args)
        from profiler.defaults import DEFAULT_PROFILE, data_file

        from ..cluster import local_host
        from ..rundir import new_run_id
        from ..session import prepare_run_dir, profile_cluster
        from ..sparkcluster import LocalSparkCluster, free_port
        from ..ysb.runner import YsbOptions, YsbRun, batches_between

        out = args.out or Path("runs") / f"demo-{new_run_id()}"
        created = not out.exists()
        # Refuse (or, with --force, clear) an existing run before starting anything; profile_cluster
        # then finds an empty directory.
        prepare_run_dir(out, args.force)
        for child in out.iterdir():
            child.rmdir()
        profile = data_file(DEFAULT_PROFILE)
        say = print  # a few lines; --quiet only drops the per-host progress lines
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # stop everything, as on Ctrl-C
        driver_port = free_port()
        options = YsbOptions(
            rate=args.rate, campaigns=args.campaigns, sink=args.sink, executors=args.executors, executor_cores=1
        )
        try:
            with (
                tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch,
                LocalSparkCluster(worker_cores=args.executors, worker_memory=f"{args.executors}g") as cluster,
            ):
                say(f"demo: Spark master {cluster.master_url} (logs {cluster.tmp_dir})")
                with YsbRun(cluster, options, driver_port=driver_port) as ysb:
                    say(f"demo: YSB at {args.rate} events/s, sink {ysb.sink}; waiting for the first micro-batch")
                    ysb.wait_ready(timeout=args.ready_timeout)
                    executors = cluster.executor_pids()
                    say(f"demo: processing; executors {executors}; warming up for {args.warmup:.0f} s")
                    ysb.wait_processing(args.warmup)
                    say(f"demo: profiling for {args.duration:.0f} s")
                    known_spes = Path(scratch) / "known_spes.txt"
                    known_spes.write_text(demo_known_spes(cluster.master_port, driver_port))
                    outcome = profile_cluster(
                        [local_host()],
                        duration=args.duration,
                        out_dir=out,
                        profile=profile,
                        known_spes=known_spes,
                        frequency=args.frequency,
                        labels={
                            "workload": "ysb",
                            "spe": "spark-structured-streaming",
                            "rate": str(args.rate),
                            "campaigns": str(args.campaigns),
                        },
                        progress=not args.quiet,
                        force=args.force,
                    )
                    # The sampling window (shorter when Ctrl-C stopped it early).
                    started = outcome.info.start_time or 0.0
                    ended = min(outcome.info.end_time or started + args.duration, started + args.duration)
                    window = batches_between(ysb.progress(), started, ended)
                    elapsed = max(0.0, ended - started)
                    windows_written = ysb.redis_windows() if ysb.sink == "redis" else ysb.file_sink_rows()
        except KeyboardInterrupt:
            print("coordinator demo: interrupted; everything it started is stopped", file=sys.stderr)
            _remove_unused(out, created)
            return 130
        except BaseException:
            _remove_unused(out, created)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous_term)
        return self._print_result(outcome, window, elapsed, windows_written)

    @staticmethod
    def _print_result(outcome: Any, window: list[Any], elapsed: float, windows_written: int) -> int:
        from ..ysb.runner import median_processed_rate, sustained_throughput

        rows = sum(b.input_rows for b in window)
        print(
            f"demo: {len(window)} micro-batches, {rows} events in the {elapsed:.0f} s window; throughput "
            f"{sustained_throughput(window):.0f} events/s of busy time, median batch "
            f"{median_processed_rate(window):.0f} events/s; {windows_written} window rows in the sink"
        )
        return DemoCommand.print_outcome(outcome)

    @staticmethod
    def print_outcome(outcome: Any) -> int:
        """Host failures, the files written and the next command; the exit code."""
        for host in outcome.info.hosts:
            if host.state != "ok":
                print(f"coordinator demo: {host.host}: {host.state}: {host.reason}", file=sys.stderr)
        print(f"wrote {outcome.run_dir / 'run.json'}")
        if outcome.summary_csv is not None:
            print(f"wrote {outcome.summary_csv}")
        if outcome.analysis_error:
            print(f"coordinator demo: analysis failed: {outcome.analysis_error}", file=sys.stderr)
            return 1
        if outcome.report is not None:
            print(f"wrote {outcome.report}")
            print(f"next: open {outcome.report}")
        return int(outcome.exit_code)


COMMAND = DemoCommand
