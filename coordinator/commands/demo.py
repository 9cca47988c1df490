"""`coordinator demo`: YSB on a local engine cluster, profiled end to end (see DemoCommand for the help)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from profiler.argtypes import bounded, duration, frequency, positive_int
from profiler.errors import ProfilerError

if TYPE_CHECKING:
    from coordinator.remote.session import ProfileOutcome
    from coordinator.workloads.ysb.engines import WindowResult, YsbEngine
    from profiler.capture import EventCount

_HELP = """Run the Yahoo Streaming Benchmark on a local Spark cluster and profile it: the first result.

Starts a Spark standalone Master and Worker from the pyspark package on free loopback ports, two
1-core executors (-XX:+PreserveFramePointer), and the YSB query: generated ad events (JSON) ->
from_json -> filter views -> projection -> join with the static ad->campaign table -> enrich
(pre-window latency) -> 10 s event-time window count per campaign -> Redis (a private redis-server,
when installed; a CSV file sink otherwise). --spe spark-str (default) runs it on Structured
Streaming with 1 s micro-batches and Spark's stateful window; --spe spark-cp on Continuous
Processing, where Spark has no window: the sink keeps the window counts in Redis, as in the paper;
--spe flink runs it as a Java DataStream job on a local Flink 2.3 cluster (a JobManager and
--executors 1-slot TaskManagers from PyPI's apache-flink distribution, installed into
~/.cache/spe-taskprof on first use) and profiles the TaskManagers.
Once the query processes events and the warm-up is over, profiles the executors for --duration
seconds with the engine's shipped profile, counts the events of the window, writes summary.csv
(cycles per event per task) and the HTML report into the run directory, prints the throughput,
and stops everything it started (also on Ctrl-C). If the workload fails, its logs are kept in
<run>/workload/. Needs root for eBPF; expect about a minute of start-up.

examples:
  $ coordinator demo
  $ coordinator demo --duration 30 --rate 10000 --out runs/demo --force
  $ coordinator demo --spe spark-cp --duration 60
  $ coordinator demo --spe flink --duration 60
  $ coordinator demo --warmup 900 --duration 900      # the paper's experiment: 15 min warm-up, 15 min window
  $ coordinator demo --sink file --executors 1
  then:
  $ xdg-open runs/demo/report/index.html
  $ coordinator analyze runs/demo --profile my_edited_profile.txt
"""


_non_negative = bounded(float, 0.0, 86400.0, "seconds")
_executors = bounded(int, 1, 8, "local executors")

# The workload's logs inside the run directory: all of them when the workload failed, otherwise
# only the query's own output (its progress lines).
WORKLOAD_DIR = "workload"
_LOG_SUFFIXES = (".log", ".out", ".err")
_NOT_LOGS = ("local", "checkpoint", "sink", "conf")


def _is_failed_demo(run_dir: Path) -> bool:
    """A directory a failed demo left: only the kept workload logs, no run.json."""
    return run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [WORKLOAD_DIR]


def _prepare_out(out: Path, force: bool) -> None:
    """Refuse (or, with --force, clear) an existing run before starting anything; profile_cluster then
    finds an empty directory. A failed demo's leftovers can be replaced with --force like a run."""
    from coordinator.remote.session import prepare_run_dir

    if force and _is_failed_demo(out):
        shutil.rmtree(out)
    prepare_run_dir(out, force)
    for child in out.iterdir():
        child.rmdir()


def _remove_unused(run_dir: Path, created: bool) -> None:
    """Undo _prepare_out when profiling never started and no logs were kept, so the same --out works again."""
    if created and run_dir.is_dir() and not (run_dir / "run.json").exists() and not _is_failed_demo(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def log_files(log_dir: Path) -> list[Path]:
    """The workload's logs: daemon and app logs, executors' stdout/stderr; no data, jars or checkpoints."""
    found = []
    for path in sorted(log_dir.rglob("*")):
        parts = path.relative_to(log_dir).parts
        if any(part in _NOT_LOGS or part.startswith("ysb-") for part in parts[:-1]):
            continue
        if path.is_file() and (path.suffix in _LOG_SUFFIXES or path.name in ("stdout", "stderr")):
            found.append(path)
    return found


def keep_logs(log_dir: Path, dest: Path, suffix: str = "") -> Path:
    """Copy the workload's logs (only those whose name ends with ``suffix``, if given) into ``dest``."""
    for path in log_files(log_dir):
        if suffix and not path.name.endswith(suffix):
            continue
        target = dest / path.relative_to(log_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def with_kept_logs(exc: ProfilerError, log_dir: Path, kept: Path) -> ProfilerError:
    """The same error, naming the kept copies of the logs instead of the scratch ones, which are removed."""
    message = str(exc)
    if str(log_dir) in message:
        message = message.replace(str(log_dir), str(kept))
    else:
        message = f"{message}; the workload's logs are in {kept}"
    kept_error = type(exc)(message)
    kept_error.exit_code = exc.exit_code
    return kept_error


def fill_event_counts(outcome: ProfileOutcome, counted: EventCount | None) -> list[Path]:
    """Where the profiler could not count the window's events from the engine (Spark Continuous
    Processing runs no micro-batches for the REST count), write the count the query itself gives;
    the profiler's reason stays in the detail. Returns the events.json files written."""
    from coordinator.rundir import host_capture_dir
    from profiler.capture import EventCount, read_events, write_events

    written = []
    for host in outcome.info.hosts:
        capture = host_capture_dir(outcome.run_dir, host.host)
        current = read_events(capture) if capture.is_dir() else None
        if counted is None or current is None or current.count is not None:
            continue
        detail = f"{counted.detail}; the profiler's own count: {current.detail}"
        filled = EventCount(counted.count, counted.source, detail, current.window_start, current.window_end)
        write_events(capture, filled)
        written.append(capture / "events.json")
    return written


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class DemoCommand:
    __doc__ = _HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from coordinator.workloads.ysb.engines import DEFAULT_ENGINE, ENGINES

        parser.add_argument(
            "--spe", choices=sorted(ENGINES), default=DEFAULT_ENGINE,
            help=f"stream processing engine: spark-str (Structured Streaming micro-batches), spark-cp "
            f"(Continuous Processing) or flink ({DEFAULT_ENGINE})",
        )
        parser.add_argument("--duration", type=duration, default=60.0, help="seconds to profile (60)")
        parser.add_argument("--out", type=Path, help="run directory (default: runs/demo-<time>)")
        parser.add_argument("--force", action="store_true", help="replace an existing run directory")
        parser.add_argument("--rate", type=positive_int, default=20_000, help="generated events per second (20000)")
        parser.add_argument("--campaigns", type=positive_int, default=1000, help="YSB campaigns, 10 ads each (1000)")
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
        parser.add_argument("--frequency", type=frequency, default=99, help="samples per second per CPU (99)")
        parser.add_argument(
            "--ready-timeout", type=duration, default=600.0, help="seconds to wait for the first events (600)"
        )
        parser.add_argument("--quiet", "-q", action="store_true", help="no per-host progress lines")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.rundir import new_run_id
        from coordinator.workloads.ysb.engines import ENGINES
        from coordinator.workloads.ysb.spark import YsbOptions

        out = args.out or Path("runs") / f"demo-{new_run_id()}"
        created = not out.exists()
        _prepare_out(out, args.force)
        options = YsbOptions(
            rate=args.rate, campaigns=args.campaigns, sink=args.sink, executors=args.executors, executor_cores=1
        )
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # stop everything, as on Ctrl-C
        try:
            with tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch:
                log_dir = Path(scratch) / WORKLOAD_DIR
                try:
                    engine = ENGINES[args.spe](options, log_dir)
                    outcome, window, elapsed = self._profile(args, out, engine, Path(scratch))
                except ProfilerError as exc:
                    raise with_kept_logs(exc, log_dir, keep_logs(log_dir, out / WORKLOAD_DIR)) from exc
                keep_logs(log_dir, out / WORKLOAD_DIR, suffix=".out")
        except KeyboardInterrupt:
            print("coordinator demo: interrupted; everything it started is stopped", file=sys.stderr)
            _remove_unused(out, created)
            return 130
        except BaseException:
            _remove_unused(out, created)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous_term)
        return self._print_result(outcome, window, elapsed)

    @staticmethod
    def _profile(
        args: argparse.Namespace, out: Path, engine: YsbEngine, scratch: Path
    ) -> tuple[ProfileOutcome, WindowResult, float]:
        """Start the engine and its query, warm up, profile, stop everything; also the query's own
        report of the profiling window."""
        from coordinator.remote.cluster import local_host
        from coordinator.remote.hosts import RunRequest
        from coordinator.remote.session import RunOptions, analyze_run, profile_cluster
        from profiler.defaults import data_file

        say = print  # a few lines; --quiet only drops the per-host progress lines
        with engine:
            say(f"demo: {engine.describe()} (logs {engine.log_dir})")
            say(f"demo: YSB on {engine.spe} at {args.rate} events/s; waiting for the query to process events")
            engine.wait_ready(args.ready_timeout)
            say(f"demo: processing; executors {engine.workload_pids()}; warming up for {args.warmup:.0f} s")
            engine.wait_processing(args.warmup)
            say(f"demo: profiling for {args.duration:.0f} s; events counted from {engine.events_source}")
            known_spes = scratch / "known_spes.txt"
            known_spes.write_text(engine.known_spes())
            request = RunRequest(
                duration=float(args.duration),
                frequency=int(args.frequency),
                profile=data_file(engine.profile),
                known_spes=known_spes,
            )
            labels = {"workload": "ysb", "spe": engine.spe, "rate": str(args.rate), "campaigns": str(args.campaigns)}
            options = RunOptions(labels=labels, progress=not args.quiet, analyze=False, force=args.force)
            outcome = profile_cluster([local_host()], request, out, options)
            engine.check_running()  # a workload that died inside the window leaves a meaningless profile
            # The sampling window (shorter when Ctrl-C stopped it early).
            started = outcome.info.start_time or 0.0
            ended = min(outcome.info.end_time or started + args.duration, started + args.duration)
            window = engine.window(started, ended)
            fill_event_counts(outcome, engine.count_events(started, ended))
        return analyze_run(outcome), window, max(0.0, ended - started)

    @staticmethod
    def _print_result(outcome: ProfileOutcome, window: WindowResult, elapsed: float) -> int:
        events = "no event count" if window.events is None else f"{window.events} events"
        print(
            f"demo: {window.units} {window.unit_name}, {events} in the {elapsed:.0f} s window; "
            f"{window.throughput}; {window.sink_rows} window rows in the sink"
        )
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
