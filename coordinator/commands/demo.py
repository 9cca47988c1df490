"""`coordinator demo`: YSB on a local engine cluster, profiled end to end (see DemoCommand for the help)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from coordinator.commands._demo_counts import (
    fill_event_counts,
    latency_clause,
    produced_clause,
    record_latency,
    record_produced,
    sampling_window,
)
from coordinator.commands._demo_hosts import host_counts
from coordinator.commands.profile import add_roles_option
from profiler.argtypes import bounded, duration, positive_int
from profiler.errors import ConfigError, ProfilerError
from profiler.run.options import add_run_arguments

if TYPE_CHECKING:
    from collections.abc import Callable

    from coordinator.commands._demo_hosts import DemoCluster
    from coordinator.remote.session import ProfileOutcome
    from coordinator.workloads.ysb.engines import WindowResult, YsbEngine

_HELP = """Run the Yahoo Streaming Benchmark on a local Spark cluster and profile it: the first result.

Starts a Spark standalone Master and Worker from the pyspark package on free loopback ports, two
1-core executors (-XX:+PreserveFramePointer), and the YSB query: generated ad events (JSON) ->
from_json -> filter views -> projection -> join with the static ad->campaign table -> enrich
(pre-window latency) -> 10 s event-time window count per campaign -> Redis (a private redis-server,
when installed; a CSV file sink otherwise). --spe spark-str (default) runs it on Structured
Streaming with 1 s micro-batches and Spark's stateful window (--spark-window sink: the window in
the Redis sink instead); --spe spark-cp on Continuous
Processing, where Spark has no window: the sink keeps the window counts in Redis, as in the paper;
--spe spark-rtm on Real-time Mode (Spark 4.1+, 5 s long-running batches, --source kafka only), the
join Spark's broadcast hash join and the window, refused by RTM, in a foreach writer over Redis;
--spe flink runs it as a Java DataStream job on a local Flink 2.3 cluster (a JobManager and
--executors 1-slot TaskManagers from PyPI's apache-flink distribution, installed into
~/.cache/spe-taskprof on first use) and profiles the TaskManagers.
Once the query processes events and the warm-up is over, profiles the executors for --duration
seconds (the profiler deploys and starts during the warm-up) with the engine's shipped profile,
counts the events of the window, writes summary.csv (cycles per event per task) and the HTML
report into the run directory, prints the throughput, and stops everything it started (also on
Ctrl-C). If the workload fails, its logs are kept in
<run>/workload/. --rates (or several --spe) make a campaign: one profile per rate on the same
cluster, <out>/<spe>-<rate>/ each, then <out>/campaign/ with campaign.csv and its page.
Needs root for eBPF; expect about a minute of start-up.

examples:
  $ coordinator demo
  $ coordinator demo --duration 30 --rate 10000 --out runs/demo --force
  $ coordinator demo --spe spark-cp --duration 60
  $ coordinator demo --spe flink --duration 60
  $ coordinator demo --source kafka --duration 60     # YSB read from a local Kafka broker
  $ coordinator demo --source kafka --spe flink --duration 60
  $ coordinator demo --source kafka --spe spark-rtm --duration 60   # Spark's Real-time Mode
  $ coordinator demo --source kafka --roles workload,managing,broker   # the broker's cycles per event too
  $ coordinator demo --source kafka --spark-window sink --warmup 300   # spark-str, the window in the sink
  $ coordinator demo --udf python --rate 5000   # deserialize/filter/projection as a Python UDF
  $ coordinator demo --warmup 900 --duration 900      # the paper's experiment: 15 min warm-up, 15 min window
  $ coordinator demo --sink file --executors 1
  $ coordinator demo --rates 5000,10000,20000 --duration 60   # one profile per rate, then the campaign page
  $ coordinator demo --hosts 1,2,4 --duration 30   # on 1, 2 and 4 namespaced hosts: the nodes figure
  then:
  $ xdg-open runs/demo/report/index.html
  $ coordinator analyze runs/demo --profile my_edited_profile.txt
"""


_non_negative = bounded(float, 0.0, 86400.0, "seconds")


def rate_list(text: str) -> list[int]:
    """``5000,10000,20000``: positive event rates, each once, in the order given."""
    rates = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not rates or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct rates separated by commas, e.g. 5000,10000,20000")
    return rates


def spe_list(text: str) -> list[str]:
    """``spark-str`` or ``spark-str,flink``: engines of coordinator/workloads/ysb/engines.py, each once."""
    from coordinator.workloads.ysb.engines import ENGINES

    spes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [spe for spe in spes if spe not in ENGINES]
    if not spes or unknown or len(set(spes)) != len(spes):
        raise argparse.ArgumentTypeError(
            f"{text!r}: choose from {', '.join(sorted(ENGINES))}, separated by commas, each once"
        )
    return spes
_executors = bounded(int, 1, 8, "local executors")


def bootstrap_servers(text: str) -> str:
    """``host:port[,host:port...]``: Kafka bootstrap servers."""
    servers = [part.strip() for part in text.split(",")]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
            raise argparse.ArgumentTypeError(f"{text!r}: give HOST:PORT of a Kafka broker, e.g. 127.0.0.1:9092")
    return ",".join(servers)


def kafka_topic(text: str) -> str:
    from coordinator.workloads.kafka import topic_name
    from profiler.errors import ConfigError

    try:
        return topic_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

# The workload's logs inside the run directory: all of them when the workload failed, otherwise
# only the query's own output (its progress lines).
WORKLOAD_DIR = "workload"
DURATION = 60.0  # the demo's window unless --duration says otherwise (profiler run has none: it must be given)
OFF_CPU_WORDING = (
    "also sum each task's blocked time by cause (profiler run --off-cpu, docs/offcpu.md): the report shows it "
    "beside the on-CPU time"
)
_LOG_SUFFIXES = (".log", ".out", ".err")
_NOT_LOGS = ("local", "checkpoint", "sink", "conf")


def _is_failed_demo(run_dir: Path) -> bool:
    """A directory a failed demo left: only the kept workload logs, no run.json."""
    from profiler.files.outputs import MARKER

    # the marker says the demo made the directory: a user's own "workload" folder is never taken for one
    return run_dir.is_dir() and sorted(p.name for p in run_dir.iterdir()) == sorted((MARKER, WORKLOAD_DIR))


def _prepare_out(out: Path, force: bool) -> None:
    """Refuse (or, with --force, clear) an existing run before starting anything; profile_cluster then
    finds an empty directory. A failed demo's leftovers can be replaced with --force like a run."""
    from coordinator.remote.session import prepare_run_dir

    if force and _is_failed_demo(out):
        shutil.rmtree(out)
    prepare_run_dir(out, force)
    for child in out.iterdir():  # hosts/: profile_cluster prepares it again; the marker stays
        if child.is_dir():
            child.rmdir()


def _clear_run(run_dir: Path) -> None:
    """Back to what _prepare_out left (only the marker): a run that failed before its window holds no
    capture, and the failed demo's kept logs then make the directory that --force may replace."""
    from profiler.files.outputs import MARKER

    for child in run_dir.iterdir():
        if child.name == MARKER:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


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


def warm_up_cpu(engine: YsbEngine, seconds: float, say: Callable[[str], None], every: float = 5.0) -> None:
    """Until every workload process has used ``seconds`` of CPU since it started (--warmup-cpu; 0: at
    once), saying once a minute how much the least-run one still lacks. The engine fails the wait if
    its query dies."""
    from coordinator.workloads.ysb.jvmstats import cpu_short_of, process_cpu_seconds

    said = time.monotonic()
    waited = 0.0
    while (short := cpu_short_of({p: process_cpu_seconds(p) for p in engine.workload_pids()}, seconds)) > 0:
        if time.monotonic() - said >= 60.0:
            say(f"demo: warming up: an executor lacks {short:.1f} of {seconds:.0f} CPU-seconds ({waited:.0f} s)")
            said = time.monotonic()
        engine.wait_processing(every)
        waited += every
    if seconds > 0:
        say(f"demo: every executor has used {seconds:.0f} CPU-seconds ({waited:.0f} s after --warmup)")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class DemoCommand:
    __doc__ = _HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        from coordinator.workloads.ysb.engines import DEFAULT_ENGINE, ENGINES
        from coordinator.workloads.ysb.pyudfs import UDFS
        from coordinator.workloads.ysb.spark import SPARK_WINDOWS

        parser.add_argument(
            "--spe", type=spe_list, default=[DEFAULT_ENGINE], metavar="SPE[,SPE...]",
            help=f"stream processing engine: {', '.join(sorted(ENGINES))}: spark-str (Structured Streaming "
            f"micro-batches), spark-cp (Continuous Processing), spark-rtm (Real-time Mode, --source kafka only) or "
            f"flink ({DEFAULT_ENGINE}); several, "
            "comma-separated, make a campaign",
        )
        add_run_arguments(parser, ["duration"], {"duration": "seconds to profile ({default})"}, {"duration": DURATION})
        parser.add_argument("--out", type=Path, help="run directory (default: runs/demo-<time>)")
        parser.add_argument("--force", action="store_true", help="replace an existing run directory")
        rates = parser.add_mutually_exclusive_group()
        rates.add_argument("--rate", type=positive_int, default=20_000, help="generated events per second (20000)")
        rates.add_argument(
            "--rates", type=rate_list, metavar="R1,R2,...",
            help="a campaign: one profile per rate (and per --spe) on the same running cluster, then the "
            "campaign page of cycles per event per task against the rate (docs/campaigns.md)",
        )
        parser.add_argument("--campaigns", type=positive_int, default=1000, help="YSB campaigns, 10 ads each (1000)")
        parser.add_argument(
            "--warmup",
            type=_non_negative,
            default=30.0,
            help="seconds of processing before the profiling window starts, so the JIT has compiled the "
            "pipeline; the profiler deploys and starts during them (30)",
        )
        parser.add_argument(
            "--warmup-cpu",
            type=_non_negative,
            default=0.0,
            metavar="SECONDS",
            help="after --warmup, keep warming up until every executor (TaskManager) has used SECONDS of CPU "
            "since it started: the JIT's warm-up is an amount of the executors' CPU, which a loaded host "
            "gives them slowly (0: wall-clock --warmup only)",
        )
        parser.add_argument(
            "--executors", type=_executors, default=2, help="1-core executors; 1-slot TaskManagers for flink (2)"
        )
        parser.add_argument(
            "--sink", choices=("auto", "redis", "file"), default="auto", help="auto: Redis when redis-server exists"
        )
        parser.add_argument(
            "--source", choices=("generator", "kafka"), default="generator",
            help="generator: the events are made inside the engine (default); kafka: a local Kafka broker, and "
            "a producer JVM writing --rate events/s into its topic, which the query reads",
        )
        parser.add_argument(
            "--kafka-bootstrap", type=bootstrap_servers, default=None, metavar="HOST:PORT",
            help="with --source kafka: use this running broker instead of starting a local one",
        )
        parser.add_argument(
            "--kafka-topic", type=kafka_topic, default="ysb",
            help="with --source kafka: the topic the demo creates (it must not exist yet) and reads (ysb)",
        )
        parser.add_argument(
            "--spark-window", choices=SPARK_WINDOWS, default=SPARK_WINDOWS[0],
            help="spark-str: where the 10 s campaign windows are kept: state: Spark's stateful window "
            "(withWatermark + groupBy(window)), as today (default); sink: no stateful operator, the Redis sink "
            "counts each micro-batch's windows and adds them up in Redis, as Spark CP's sink and YSB's own Spark "
            "code do (no shuffle, and no code Spark generates anew for each window's watermark)",
        )
        parser.add_argument(
            "--udf", choices=UDFS, default=UDFS[0],
            help="spark-str: YSB's deserialize, filter and projection as SQL expressions (sql, default) or as one "
            "Python UDF run by PySpark's Python workers (python: coordinator/workloads/ysb/pyudfs.py); the report "
            "then shows the UDF's functions and the JVM-Python serialization as tasks beside the JVM's",
        )
        add_roles_option(parser)
        add_run_arguments(parser, ["frequency"])
        parser.add_argument(
            "--frame-pointers",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="start the engine's JVMs with -XX:+PreserveFramePointer (default); --no-frame-pointers starts them "
            "as production clusters run, the HotSpot unwinder walking their JIT code",
        )
        add_run_arguments(parser, ["off_cpu"], {"off_cpu": OFF_CPU_WORDING})
        parser.add_argument(
            "--ready-timeout", type=duration, default=600.0, help="seconds to wait for the first events (600)"
        )
        parser.add_argument(
            "--hosts", type=host_counts, metavar="N[,N...]",
            help="spread the query over N hosts made on this machine (own network, UTS, mount and PID namespaces, "
            "each a real sshd and a Spark Worker with one 1-core executor), profiled over SSH: one run per N into "
            "<out>/hosts-<N>/, then the campaign page of cycles per event per task against the hosts (the nodes "
            "figure, docs/demo.md); spark-str, --source generator and the file sink only so far",
        )
        parser.add_argument("--quiet", "-q", action="store_true", help="no per-host progress lines")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.rundir import new_run_id
        from coordinator.workloads.ysb.engines import ENGINES
        from coordinator.workloads.ysb.spark import YsbOptions, check_source, check_spark_window, check_udf

        for spe in args.spe:
            check_source(args.source, spe)  # before anything starts
            check_spark_window(args.spark_window, spe, args.sink)
            check_udf(args.udf, spe)
        if args.kafka_bootstrap and args.source != "kafka":
            raise ConfigError(f"--kafka-bootstrap {args.kafka_bootstrap}: only with --source kafka")
        if args.hosts is not None and args.udf != "sql":
            raise ConfigError(f"--udf {args.udf}: not with --hosts yet (the hosts' Python workers are not set up)")
        if args.hosts is not None:
            from coordinator.commands._demo_hosts import run_hosts

            return run_hosts(args)
        if args.rates is not None or len(args.spe) > 1:
            return run_campaign(args)
        out = args.out or Path("runs") / f"demo-{new_run_id()}"
        created = not out.exists()
        _prepare_out(out, args.force)
        options = YsbOptions(
            rate=args.rate, campaigns=args.campaigns, sink=args.sink, executors=args.executors, executor_cores=1,
            frame_pointers=args.frame_pointers,
            source=args.source, kafka_bootstrap=args.kafka_bootstrap or "", kafka_topic=args.kafka_topic,
            spark_window=args.spark_window, udf=args.udf,
        )
        previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # stop everything, as on Ctrl-C
        try:
            with tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch:
                log_dir = Path(scratch) / WORKLOAD_DIR
                try:
                    engine = ENGINES[args.spe[0]](options, log_dir)
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
        return self.print_result(outcome, window, elapsed)

    @classmethod
    def _profile(
        cls, args: argparse.Namespace, out: Path, engine: YsbEngine, scratch: Path
    ) -> tuple[ProfileOutcome, WindowResult, float]:
        """Start the engine and its query, warm up, profile, stop everything; also the query's own
        report of the profiling window."""
        from coordinator.remote.session import analyze_run

        began = time.monotonic()
        with engine:
            print(f"demo: {engine.describe()} (logs {engine.log_dir}); started in {time.monotonic() - began:.0f} s")
            outcome, window, elapsed = cls.profile_running(args, out, engine, scratch, args.rate)
        return analyze_run(outcome), window, elapsed

    @staticmethod
    def profile_running(
        args: argparse.Namespace, out: Path, engine: YsbEngine, scratch: Path, rate: int,
        cluster: DemoCluster | None = None,
    ) -> tuple[ProfileOutcome, WindowResult, float]:
        """On a started engine: wait for the query, warm up, profile into ``out`` (not analysed yet:
        remote.session.analyze_run); the query's own report of the window and its length. Also each
        level of a campaign (coordinator/workloads/ysb/campaign.py). ``cluster``: the hosts to profile
        over SSH and the run's extra labels (coordinator demo --hosts); this machine by default."""
        from coordinator.remote.cluster import local_host
        from coordinator.remote.hosts import run_request
        from coordinator.remote.session import RunOptions, profile_cluster
        from profiler.defaults import data_file

        say = print  # a few lines; --quiet only drops the per-host progress lines
        say(f"demo: YSB on {engine.spe} at {rate} events/s; waiting for the query to process events")
        waited = time.monotonic()
        engine.wait_ready(args.ready_timeout)
        ready = f"processing after {time.monotonic() - waited:.0f} s"  # the driver, executors and first batch
        warmed_at: float | None = None
        if args.warmup_cpu > 0:  # the warm-up's end is not known beforehand: warm up, then start the profiler
            say(f"demo: {ready}; executors {engine.workload_pids()}; warming up for {args.warmup:.0f} s")
            engine.wait_processing(args.warmup)
            warm_up_cpu(engine, args.warmup_cpu, say)
        else:  # the profiler deploys, compiles and attaches during the warm-up; its window starts at the end
            warmed_at = time.time() + args.warmup
            say(
                f"demo: {ready}; executors {engine.workload_pids()}; warming up for {args.warmup:.0f} s "
                "while the profiler starts"
            )
        source = engine.events_source if cluster is None else "the query's own count (no host runs the driver)"
        say(f"demo: profiling for {args.duration:.0f} s; events counted from {source}")
        known_spes = scratch / "known_spes.txt"
        known_spes.write_text(engine.known_spes())
        request = run_request(
            args.duration, data_file(engine.profile), known_spes, frequency=args.frequency, off_cpu=args.off_cpu,
            roles=args.roles,
        )
        labels = {"workload": "ysb", "spe": engine.spe, "rate": str(rate), "campaigns": str(args.campaigns)}
        if args.source != "generator":
            labels["source"] = args.source
        if args.spark_window != "state":
            labels["spark_window"] = args.spark_window
        if args.udf != "sql":
            labels["udf"] = args.udf
        labels |= dict(cluster.labels) if cluster is not None else {}
        options = RunOptions(
            labels=labels, progress=not args.quiet, analyze=False, force=args.force,
            not_before=warmed_at, watch=engine.check_running,
            known_hosts=cluster.known_hosts if cluster is not None else None,
        )  # fmt: skip
        try:
            outcome = profile_cluster(list(cluster.hosts) if cluster else [local_host()], request, out, options)
        except ProfilerError:  # the query died before the window (RunOptions.watch): nothing worth keeping
            _clear_run(out)
            raise
        engine.check_running()  # a workload that died inside the window leaves a meaningless profile
        started, ended = sampling_window(outcome, args.duration)
        window = engine.window(started, ended)
        fill_event_counts(outcome, engine.count_events(started, ended))
        record_produced(outcome, window)
        record_latency(outcome, window)
        return outcome, window, max(0.0, ended - started)

    @staticmethod
    def print_result(outcome: ProfileOutcome, window: WindowResult, elapsed: float) -> int:
        events = "no event count" if window.events is None else f"{window.events} events"
        print(
            f"demo: {window.units} {window.unit_name}, {events} in the {elapsed:.0f} s window; "
            f"{window.throughput}; {window.sink_rows} window rows in the sink"
            f"{produced_clause(window.events, window.produced)}{latency_clause(window.latency)}"
        )
        from coordinator.commands.profile import print_hosts_and_files

        print_hosts_and_files(outcome, "coordinator demo")
        if outcome.analysis_error:
            print(f"coordinator demo: analysis failed: {outcome.analysis_error}", file=sys.stderr)
            return 1
        if outcome.report is not None:
            print(f"wrote {outcome.report}")
            print(f"next: open {outcome.report}")
        return int(outcome.exit_code)


CAMPAIGN_DIR = "campaign"


def _level_dir(out: Path, spe: str, rate: int) -> Path:
    return out / f"{spe}-{rate}"


def run_levels(
    out: Path, force: bool, made_by: str, label: str, levels: Iterable[tuple[list[Path], int]], stopped: str
) -> int:
    """A campaign's skeleton: ``out`` checked and marked as made by ``made_by``, ``levels`` run one after
    another (each yields its run directories and exit code; a lazy iterable, so every level runs under
    the SIGTERM-as-Ctrl-C handler), then all of them drawn together into ``<out>/campaign/`` by
    ``label``. Exit 130 on an interrupt, saying what ``stopped``."""
    from coordinator.commands.campaign import check_out
    from profiler.files.outputs import check_output_dir, mark_output_dir

    check_output_dir(out, "--out", force=force, own_kind=(CAMPAIGN_DIR,))
    check_out(out / CAMPAIGN_DIR, force)
    out.mkdir(parents=True, exist_ok=True)
    mark_output_dir(out, made_by)
    run_dirs: list[Path] = []
    exit_code = 0
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # stop everything, as on Ctrl-C
    try:
        for dirs, code in levels:
            run_dirs += dirs
            exit_code = max(exit_code, code)
    except KeyboardInterrupt:
        print(f"coordinator demo: interrupted; {stopped}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return max(exit_code, campaign_page(out / CAMPAIGN_DIR, run_dirs, label))


def run_campaign(args: argparse.Namespace) -> int:
    """``--rates`` / several ``--spe``: per engine one cluster, and on it one profile per rate (the
    query restarted at each rate: YsbEngine.restart_query), each into ``<out>/<spe>-<rate>/``; then
    all of them analysed together into ``<out>/campaign/`` with campaign.csv and the campaign page."""
    from coordinator.rundir import new_run_id

    out = args.out or Path("runs") / f"demo-campaign-{new_run_id()}"
    rates = args.rates or [args.rate]
    levels = (_campaign_engine(args, out, spe, rates) for spe in args.spe)
    return run_levels(
        out, args.force, "coordinator demo --rates", "rate", levels, "everything it started is stopped"
    )


def _campaign_engine(args: argparse.Namespace, out: Path, spe: str, rates: list[int]) -> tuple[list[Path], int]:
    """One engine's cluster, started once; one profiled and analysed run per rate. Returns the run
    directories and the worst exit code of their analyses (print_result). A level is analysed once its
    query is stopped, never beside a query at full rate: beside the next query's start-up (before its
    warm-up), the last level once the cluster is stopped."""
    from coordinator.workloads.ysb.engines import ENGINES
    from coordinator.workloads.ysb.spark import YsbOptions

    options = YsbOptions(
        rate=rates[0], campaigns=args.campaigns, sink=args.sink, executors=args.executors, executor_cores=1,
        frame_pointers=args.frame_pointers,
        source=args.source, kafka_bootstrap=args.kafka_bootstrap or "", kafka_topic=args.kafka_topic,
        spark_window=args.spark_window, udf=args.udf,
    )
    done: list[Path] = []
    exit_code = 0
    unanalysed: list[tuple[ProfileOutcome, WindowResult, float]] = []
    with tempfile.TemporaryDirectory(prefix="coordinator-demo-") as scratch:
        log_dir = Path(scratch) / WORKLOAD_DIR
        level, created = _level_dir(out, spe, rates[0]), False
        try:
            with ENGINES[spe](options, log_dir) as engine:
                print(f"demo: {engine.describe()} (logs {engine.log_dir}); rates {', '.join(map(str, rates))}")
                for index, rate in enumerate(rates):
                    level = _level_dir(out, spe, rate)
                    created = not level.exists()
                    _prepare_out(level, args.force)
                    if index:
                        print(f"demo: restarting the query at {rate} events/s on the same cluster")
                        engine.restart_query(rate)
                        exit_code = max(exit_code, _analysed(unanalysed))
                    outcome, window, elapsed = DemoCommand.profile_running(args, level, engine, Path(scratch), rate)
                    keep_logs(log_dir, level / WORKLOAD_DIR, suffix=".out")
                    unanalysed.append((outcome, window, elapsed))
                    done.append(level)
            exit_code = max(exit_code, _analysed(unanalysed))
        except ProfilerError as exc:
            _analysed(unanalysed)  # a level profiled before the failure keeps its report
            raise with_kept_logs(exc, log_dir, keep_logs(log_dir, level / WORKLOAD_DIR)) from exc
        except BaseException:
            _remove_unused(level, created)
            raise
    return done, exit_code


def _analysed(unanalysed: list[tuple[ProfileOutcome, WindowResult, float]]) -> int:
    """Analyse and print the levels not analysed yet (emptying the list); the worst exit code of print_result."""
    from coordinator.remote.session import analyze_run

    exit_code = 0
    while unanalysed:
        outcome, window, elapsed = unanalysed.pop(0)
        exit_code = max(exit_code, DemoCommand.print_result(analyze_run(outcome), window, elapsed))
    return exit_code


def campaign_page(target: Path, run_dirs: list[Path], by: str) -> int:
    """All levels analysed together (the same pipeline as coordinator analyze) and the campaign page
    with label ``by`` on the x axis (rate; hosts for coordinator demo --hosts)."""
    from coordinator.analysis.engines import analyze
    from coordinator.commands.campaign import check_out, write_campaign

    check_out(target, True)
    output = analyze(run_dirs, out_dir=target)
    csv_path, index, _ = write_campaign(target, by, None)
    print(f"wrote {output.summary_csv}")
    print(f"wrote {csv_path}")
    print(f"wrote {index}")
    print(f"next: open {index}")
    runs = " ".join(map(str, run_dirs))
    print(f"  the same figures again, or by another label: coordinator campaign {runs} --by {by} --out {target}")
    return 0


COMMAND = DemoCommand
