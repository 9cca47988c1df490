"""Run YSB on a LocalFlinkCluster: the job jar (YsbFlink.java compiled against Flink's own jars), a
private redis-server, the REST submission, the ready handshake and the job's record counts.

The job is a small Java DataStream program, not PyFlink: Python UDFs run in separate Python worker
processes (Beam's SDK harness) that would dominate the CPU profile and hide Flink's own task costs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from coordinator.workloads.flinkcluster import FlinkClusterError, LocalFlinkCluster, flink_home
from coordinator.workloads.kafka import KafkaFeed
from coordinator.workloads.processes import Lifecycle, stop_in_order
from coordinator.workloads.sparkcluster import DEFAULT_JAVA_OPTIONS as FLINK_JAVA_OPTIONS
from coordinator.workloads.ysb.campaigns import YsbLoad, ad_campaign_mapping
from coordinator.workloads.ysb.javabuild import RESP_SOURCE, cache_dir, compile_jar
from coordinator.workloads.ysb.latency import WindowLatency, read_window_latency
from coordinator.workloads.ysb.query import QueryEngine
from coordinator.workloads.ysb.redis import RedisServer
from coordinator.workloads.ysb.spark import YsbOptions
from profiler.errors import ConfigError
from profiler.files.atomic import atomic_write_text

if TYPE_CHECKING:
    from typing import Self  # 3.11; annotations are not evaluated at run time

YSB_DIR = Path(__file__).resolve().parent
JOB_SOURCE = YSB_DIR / "YsbFlink.java"
JOB_CLASS = "ysb.YsbFlink"
KAFKA_JOB_SOURCE = YSB_DIR / "YsbFlinkKafka.java"
KAFKA_JOB_CLASS = "ysb.YsbFlinkKafka"
WINDOW_MS = 10_000
# The generator makes every third event a view (event_type = index mod 3), so a window's view count
# times three is the number of events generated in its 10 s of event time (= generation wall time).
EVENTS_PER_VIEW = 3


def taskmanager_java_options(cache: Path | None = None) -> str:
    """JVM options for TaskManagers running the job: its function classes (package ysb) are never
    inlined by the JIT, so DeserializeBolt, RedisJoinBolt, ... keep their own frames in the sampled
    stacks. Flink's operator frames (StreamFlatMap.processElement, ...) inline user functions into
    one compiled method per chain, and the profile could not tell the YSB steps apart. The cost is
    one real call per operator and record. A command file, since Flink's scripts expand '$' and '*'."""
    path = (cache or cache_dir()) / "ysb-flink-compile-commands.txt"
    text = "dontinline ysb.*::*\n"
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text, mode=0o644)
    return f"-XX:CompileCommandFile={path}"


def build_job_jar(flink_home: Path, cache: Path | None = None) -> Path:
    """Compile YsbFlink.java against the distribution's lib/ jars, cached by source and Flink version."""
    jars = sorted(p.name for p in (flink_home / "lib").glob("flink-dist-*.jar"))
    return compile_jar([JOB_SOURCE, RESP_SOURCE], str(flink_home / "lib" / "*"), "ysb-flink-job", jars, cache)


def build_kafka_job_jar(flink_home: Path, cache: Path | None = None) -> Path:
    """The job reading Kafka (YsbFlinkKafka.java) with flink-connector-kafka and kafka-clients inside
    the jar: a job brings its connectors, Flink's lib/ holds none."""
    from coordinator.workloads.kafka import flink_kafka_jars

    jars = sorted(p.name for p in (flink_home / "lib").glob("flink-dist-*.jar"))
    return compile_jar(
        [JOB_SOURCE, RESP_SOURCE, KAFKA_JOB_SOURCE], str(flink_home / "lib" / "*"), "ysb-flink-kafka-job", jars,
        cache, bundle=flink_kafka_jars(),
    )


@dataclass(frozen=True)
class YsbFlinkOptions(YsbLoad):
    parallelism: int = 2
    kafka_bootstrap: str = ""  # read the events from kafka_topic of this broker, not the generator
    kafka_topic: str = ""


def events_between(window_views: Mapping[str, int], start: float, end: float) -> float:
    """The job's own count of events generated in [start, end] (epoch seconds), from its Redis windows
    (``ysb:window:<campaign>:<window_start_ms>`` -> views): each 10 s window's views times three,
    windows at the ends by the fraction of them inside (events are spread evenly over a window)."""
    per_window: dict[int, int] = {}
    for key, views in window_views.items():
        try:
            window_start = int(key.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        per_window[window_start] = per_window.get(window_start, 0) + views
    total = 0.0
    for window_start, views in per_window.items():
        begin, finish = window_start / 1000.0, (window_start + WINDOW_MS) / 1000.0
        inside = max(0.0, min(end, finish) - max(start, begin))
        total += EVENTS_PER_VIEW * views * inside / (finish - begin)
    return total


@dataclass
class YsbFlinkRun(Lifecycle):
    """Context manager: the YSB job running on ``cluster`` (and its redis-server) until stop()."""

    cluster: LocalFlinkCluster
    options: YsbFlinkOptions = field(default_factory=YsbFlinkOptions)
    redis: RedisServer | None = field(init=False, default=None)
    job_id: str = field(init=False, default="")

    def start(self) -> YsbFlinkRun:
        try:
            kafka = bool(self.options.kafka_bootstrap)
            jar = build_kafka_job_jar(self.cluster.home) if kafka else build_job_jar(self.cluster.home)
            mapping = ad_campaign_mapping(self.options.campaigns, self.options.ads_per_campaign)
            ads = self.cluster.tmp_dir / "ysb-ads.txt"
            ads.write_text("".join(f"{m.ad_id} {m.campaign_id}\n" for m in mapping))
            self.redis = RedisServer().start()
            args = ["--rate", str(self.options.rate), "--ads", str(ads), "--redis-port", str(self.redis.port),
                    "--parallelism", str(self.options.parallelism)]
            if kafka:
                args += ["--kafka-bootstrap", self.options.kafka_bootstrap, "--kafka-topic", self.options.kafka_topic]
            main_class = KAFKA_JOB_CLASS if kafka else JOB_CLASS
            self.job_id = self.cluster.submit_jar(jar, main_class, args, parallelism=self.options.parallelism)
            self.cluster.wait_for_job_running(self.job_id)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the first window reached Redis: every operator of the pipeline has run."""
        deadline = time.monotonic() + timeout
        while self.redis_windows() == 0:
            self.check_running()
            if time.monotonic() > deadline:
                raise FlinkClusterError(
                    f"Flink job {self.job_id}: no window in Redis after {timeout:.0f} s; read {self.cluster.tmp_dir}"
                )
            time.sleep(0.5)

    def wait_processing(self, seconds: float) -> None:
        """Let the job run for ``seconds``, failing early if it stops."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_running()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def check_running(self) -> None:
        state = self.cluster.job(self.job_id).get("state")
        if state != "RUNNING":
            raise FlinkClusterError(
                f"Flink job {self.job_id} is {state}: {self.cluster.job_exception(self.job_id)}; "
                f"read {self.cluster.tmp_dir}"
            )

    def redis_windows(self) -> int:
        """Windows the sink wrote (keys ``ysb:window:*``)."""
        if self.redis is None:
            return 0
        with self.redis.client() as client:
            return len(client.keys("ysb:window:*"))

    def window_counts(self) -> dict[str, int]:
        """``events`` of every window in Redis (views per campaign and 10 s window), by window key."""
        if self.redis is None:
            return {}
        counts: dict[str, int] = {}
        with self.redis.client() as client:
            for key in client.keys("ysb:window:*"):
                counts[key] = int(client.hgetall(key).get("events", "0"))
        return counts

    def window_latency(self, start: float, end: float, how: str) -> WindowLatency | None:
        """YSB's latency of the windows in Redis that closed in [start, end] (read_window_latency)."""
        if self.redis is None:
            return None
        with self.redis.client() as client:
            return read_window_latency(client, WINDOW_MS, start, end, how)

    def stop(self) -> None:
        """Cancel the job, then stop redis-server; the second runs even when the first is interrupted."""
        try:
            if self.job_id:
                job_id, self.job_id = self.job_id, ""
                self.cluster.cancel(job_id)
        finally:
            if self.redis is not None:
                redis, self.redis = self.redis, None
                redis.stop()


def flink_known_spes(conf_dir: Path) -> str:
    """A known_spes file that selects only this cluster's Flink processes (by their --configDir)."""
    return "\n".join(
        [
            "# coordinator demo --spe flink: only the processes of this demo's local cluster",
            f"flink  workload  taskmanager  org.apache.flink.runtime.taskexecutor.TaskManagerRunner  arg={conf_dir}",
            "flink  managing  jobmanager  org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
            f"  arg={conf_dir}",
            "",
        ]
    )


@dataclass(frozen=True)
class JobWindow:
    """What the job itself says about the profiling window."""

    windows: int  # 10 s event-time windows that lie in the profiling window, whole or in part
    events: int  # the job's own count of events generated in it (events_between)
    sink_rows: int  # window rows in Redis
    latency: WindowLatency | None = None  # YSB's latency of the windows that closed in it


# Windows fire once the watermark (1 s behind the newest event) passes their end: the job's count of a
# window is read this long after the end of the last 10 s window it overlaps (1 s and a 2 s margin).
WINDOW_FIRE_S = 3.0


def windows_fired_at(end: float) -> float:
    """When the windows holding events of a window ending at ``end`` (epoch seconds) have fired: the end
    of the last 10 s window that overlaps it, plus WINDOW_FIRE_S. (It was ``end`` + 13 s: the same margin
    when ``end`` fell just after a window's start, up to 10 s more otherwise.)"""
    last_window_end = -(-round(end * 1000) // WINDOW_MS) * WINDOW_MS / 1000.0
    return last_window_end + WINDOW_FIRE_S


class FlinkYsbEngine(QueryEngine[YsbFlinkRun]):
    """YSB on a LocalFlinkCluster for the demo: the cluster (TaskManagers = ``options.executors``, one
    slot each), the job and its redis-server; a context manager that stops everything it started.
    Shaped like the demo's engine interface (describe, wait_ready, known_spes, ...)."""

    spe = "flink"
    profile = "application_profiles/flink.txt"
    events_source = "the Flink REST API (the source operator's numRecordsOut)"

    def __init__(self, options: YsbOptions, log_dir: Path) -> None:
        if options.sink == "file":
            raise ConfigError("--sink file: the Flink job writes to Redis only; drop --sink or use --sink redis")
        self.options = YsbFlinkOptions(
            rate=options.rate, campaigns=options.campaigns, ads_per_campaign=options.ads_per_campaign,
            parallelism=options.executors,
        )
        self.cluster = LocalFlinkCluster(
            taskmanagers=options.executors,
            slots=1,
            log_dir=log_dir,
            taskmanager_java_options=taskmanager_java_options(),
            java_options=FLINK_JAVA_OPTIONS if options.frame_pointers else "",
        )
        self.ysb: YsbFlinkRun | None = None
        self.log_dir = log_dir  # the cluster's logs, conf, pid files and the job's ad file
        self.kafka = KafkaFeed.for_options(options, log_dir)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        ysb, self.ysb = self.ysb, None
        kafka = self.kafka.stop if self.kafka is not None else None
        stop_in_order(ysb.stop if ysb is not None else None, kafka, lambda: self.cluster.__exit__(exc_type, exc, tb))

    def start(self) -> None:
        try:
            flink_home(say=print)  # installs Flink into the cache on first use
            self.cluster.start()
            if self.kafka is not None:
                self.kafka.start()
                self.options = replace(self.options, kafka_bootstrap=self.kafka.bootstrap, kafka_topic=self.kafka.topic)
            self.ysb = YsbFlinkRun(self.cluster, self.options).start()
        except BaseException:
            self.stop()
            raise

    def check_running(self) -> None:
        if self.kafka is not None:
            self.kafka.check_running()
        super().check_running()

    def stop(self) -> None:
        self.__exit__(None, None, None)

    def describe(self) -> str:
        kafka = f"; {self.kafka.describe()}" if self.kafka is not None else ""
        return f"Flink JobManager {self.cluster.rest_url}, job {self._run().job_id}{kafka}"

    def known_spes(self) -> str:
        broker = self.kafka.known_spes() if self.kafka is not None else ""
        return flink_known_spes(self.cluster.tmp_dir / "conf") + broker

    def workload_pids(self) -> list[int]:
        return self.cluster.taskmanager_pids()

    def managing_pids(self) -> list[int]:
        pid = self.cluster.jobmanager_pid()
        return [pid] if pid is not None else []

    def job_window(self, start: float, end: float) -> JobWindow:
        """The job's own account of [start, end], once the windows covering its end have fired."""
        time.sleep(max(0.0, windows_fired_at(end) - time.time()))
        run = self._run()
        views = run.window_counts()
        first, last = int(start * 1000) // WINDOW_MS, int(end * 1000) // WINDOW_MS
        how = (
            f"read {WINDOW_FIRE_S:g} s after the end of the last 10 s window the profiled window overlaps (a window "
            "fires once, when the watermark, 1 s behind the newest event, passes its end)"
        )
        latency = run.window_latency(start, end, how)
        return JobWindow(last - first + 1, round(events_between(views, start, end)), len(views), latency)
