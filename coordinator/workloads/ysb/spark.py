"""Run the YSB application on a LocalSparkCluster: the Redis sink jar, a private redis-server, the
spark-submit, the ready handshake and the throughput read from the app's PROGRESS lines."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from coordinator.workloads.processes import Lifecycle
from coordinator.workloads.sparkcluster import (
    DEFAULT_JAVA_OPTIONS,
    LocalSparkCluster,
    SparkClusterError,
    SparkSubmitProcess,
    WorkerHost,
    first_error_line,
    free_port,
)
from coordinator.workloads.ysb.campaigns import ADS_KEY, AdCampaign, YsbLoad, ad_campaign_mapping
from coordinator.workloads.ysb.javabuild import RESP_SOURCE, compile_jar
from coordinator.workloads.ysb.pyudfs import UDFS
from coordinator.workloads.ysb.redis import RedisServer, redis_server_binary
from profiler.errors import ConfigError

YSB_DIR = Path(__file__).resolve().parent
APP = YSB_DIR / "app.py"
SINK_SOURCE = YSB_DIR / "RedisSink.java"
SINK_CLASS = "ysb.RedisSink"
SINKS = ("auto", "redis", "file")
SOURCES = ("generator", "kafka")
# Where Spark STR keeps YSB's 10 s windows: Spark's stateful operator (withWatermark + groupBy(window)),
# or the Redis sink (RedisSink's window mode, as Spark CP and YSB's own Spark code keep them).
SPARK_WINDOWS = ("state", "sink")
KAFKA_TOPIC = "ysb"


@dataclass(frozen=True)
class BatchProgress:
    batch: int
    timestamp: str
    input_rows: int
    input_rows_per_s: float
    processed_rows_per_s: float
    trigger_ms: int


@dataclass(frozen=True)
class YsbOptions(YsbLoad):
    partitions: int = 2
    trigger_seconds: float = 1.0
    sink: str = "auto"  # auto: Redis when redis-server is installed, else a CSV file sink
    executor_cores: int = 1
    executors: int = 1
    executor_memory: str = "1g"
    frame_pointers: bool = True  # the engine's JVMs run with -XX:+PreserveFramePointer (else as in production)
    source: str = "generator"  # or "kafka": a broker and producer (coordinator/workloads/kafka.py)
    kafka_bootstrap: str = ""  # with source "kafka": a running broker to use ("": start a local one)
    kafka_topic: str = KAFKA_TOPIC  # made by the demo with ``partitions`` partitions
    spark_window: str = "state"  # spark-str: one of SPARK_WINDOWS
    udf: str = "sql"  # spark-str: deserialize, filter and projection as SQL ("sql") or a Python UDF ("python")
    # coordinator demo --hosts: one 1-core Worker in each of these hosts, the Master and driver on bind_address
    worker_hosts: tuple[WorkerHost, ...] = ()
    bind_address: str = "127.0.0.1"


# Spark's Real-time Mode reads only sources that support it (SupportsRealTimeMode: Kafka here; the rate
# sources raise STREAMING_REAL_TIME_MODE.INPUT_STREAM_NOT_SUPPORTED).
KAFKA_ONLY_SPES = ("spark-rtm",)


def check_source(source: str, spe: str) -> str:
    """``source`` when it is one ``spe`` reads (the generator: all but Real-time Mode), else a ConfigError."""
    if source not in SOURCES:
        raise ConfigError(f"--source {source}: unknown source; use one of {', '.join(SOURCES)}")
    if source != "kafka" and spe in KAFKA_ONLY_SPES:
        raise ConfigError(
            f"--spe {spe} reads only Kafka (Spark's Real-time Mode has no generator source): add --source kafka"
        )
    return source


def check_spark_window(window: str, spe: str, sink: str) -> str:
    """``window`` when it is one of SPARK_WINDOWS that ``spe`` (a --spe name) runs with ``sink``, else a
    ConfigError: only Structured Streaming has the choice (Continuous Processing always windows in the
    sink, Flink in its own operator), and only the Redis sink keeps windows."""
    if window not in SPARK_WINDOWS:
        raise ConfigError(f"--spark-window {window}: unknown; use one of {', '.join(SPARK_WINDOWS)}")
    if window == "sink" and spe != "spark-str":
        raise ConfigError(f"--spark-window sink: only with --spe spark-str, not {spe}")
    if window == "sink" and sink == "file":
        raise ConfigError("--spark-window sink keeps the windows in Redis: use --sink auto or redis, not file")
    return window


def check_udf(udf: str, spe: str) -> str:
    """``udf`` when ``spe`` runs it, else a ConfigError: Python UDFs only on Structured Streaming's
    micro-batches, the one engine they were run and checked on (Continuous Processing's and Real-time
    Mode's operator lists were not tried with Python's evaluation operators; Flink's query is Java)."""
    if udf not in UDFS:
        raise ConfigError(f"--udf {udf}: unknown; use one of {', '.join(UDFS)}")
    if udf != "sql" and spe != "spark-str":
        raise ConfigError(f"--udf {udf}: only with --spe spark-str, not {spe}")
    return udf


def python_udf_conf(options: YsbOptions) -> dict[str, str]:
    """With a Python UDF: its workers import coordinator.workloads.ysb.pyudfs from the same tree as the
    driver (the UDF is pickled by reference), and rows go to them pickled, not as Arrow batches (no
    pyarrow in the venv). Nothing for SQL."""
    if options.udf == "sql":
        return {}
    return {
        "spark.executorEnv.PYTHONPATH": _app_env()["PYTHONPATH"],
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",
        "spark.python.worker.reuse": "true",
    }


def parse_progress(stdout: str) -> list[BatchProgress]:
    """The PROGRESS lines of the app's stdout, in order; malformed lines are skipped."""
    batches = []
    for line in stdout.splitlines():
        if not line.startswith("PROGRESS "):
            continue
        try:
            raw = json.loads(line[len("PROGRESS "):])
            batches.append(
                BatchProgress(
                    batch=int(raw["batch"]),
                    timestamp=str(raw.get("timestamp", "")),
                    input_rows=int(raw.get("input_rows") or 0),
                    input_rows_per_s=float(raw.get("input_rows_per_s") or 0.0),
                    processed_rows_per_s=float(raw.get("processed_rows_per_s") or 0.0),
                    trigger_ms=int(raw.get("trigger_ms") or 0),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return batches


def batch_began(batch: BatchProgress) -> float | None:
    """The unix time the micro-batch's trigger began (None without a readable timestamp)."""
    try:
        return datetime.fromisoformat(batch.timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def batches_between(batches: list[BatchProgress], start: float, end: float) -> list[BatchProgress]:
    """Batches that began within [start, end] (epoch seconds); batches with no timestamp are left out."""
    return [b for b in batches if (began := batch_began(b)) is not None and start <= began <= end]


def batches_finished_between(batches: list[BatchProgress], start: float, end: float) -> list[BatchProgress]:
    """Batches that finished within [start, end]: the rule of the profiler's count from the driver's
    REST API (profiler/engines/sparkbatches.py places each micro-batch by its finish time)."""
    return [
        b for b in batches
        if (began := batch_began(b)) is not None and start <= began + b.trigger_ms / 1000.0 <= end
    ]


def kafka_read_span(batches: list[BatchProgress], selected: list[BatchProgress]) -> tuple[float, float] | None:
    """When the records ``selected`` (consecutive micro-batches of ``batches``) read from Kafka were
    produced: a micro-batch reads up to the end offsets it finds when it begins, so from the beginning
    of the batch before the first selected one to the beginning of the last. None when that batch is
    not in ``batches`` (the app missed its progress) or a timestamp is unreadable."""
    if not selected:
        return None
    began = {b.batch: batch_began(b) for b in batches}
    first, last = began.get(selected[0].batch - 1), began.get(selected[-1].batch)
    return None if first is None or last is None else (first, last)


@dataclass(frozen=True)
class EpochOffset:
    """One committed epoch of a continuous query (its ``rate`` or Kafka source)."""

    epoch: int
    committed_at: float  # unix time the driver wrote its offsets (mtime of offsets/<epoch>)
    rows: int  # rows the source had produced (rate) or read up to (Kafka) over all partitions by the epoch's end


def parse_epoch_offsets(text: str, partitions: int) -> int:
    """Rows so far from one offsets/<epoch> file of a continuous query: "v1", the batch metadata,
    then the source's offset.

    The ``rate`` source's: {"0":{"value":546966,"runTimeMs":...},"1":{"value":382563,...}}, each
    partition's reader starting at its partition number and stepping ``value`` by the number of
    partitions per row. The Kafka source's: {"<topic>":{"0":120433,"1":119876}}, the next offset to
    read per partition, whose sum is the records read up to there (the topic starts at offset 0).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    offsets = json.loads(lines[-1])
    if all(isinstance(o, dict) and "value" in o for o in offsets.values()):
        return sum((int(o["value"]) - int(p)) // partitions for p, o in offsets.items())
    return sum(int(offset) for topic in offsets.values() for offset in topic.values())


def read_epoch_offsets(checkpoint: Path, partitions: int) -> list[EpochOffset]:
    """Committed epochs of a continuous query from its checkpoint (offsets/ and commits/)."""
    commits, offsets = checkpoint / "commits", checkpoint / "offsets"
    committed = {p.name for p in commits.glob("[0-9]*")} if commits.is_dir() else set()
    epochs = []
    for path in offsets.glob("[0-9]*") if offsets.is_dir() else []:
        if path.name not in committed:
            continue
        try:
            rows = parse_epoch_offsets(path.read_text(), partitions)
            epochs.append(EpochOffset(int(path.name), path.stat().st_mtime, rows))
        except (OSError, ValueError, KeyError, IndexError, AttributeError, TypeError):
            continue
    return sorted(epochs, key=lambda e: e.epoch)


def epoch_rows_between(epochs: list[EpochOffset], start: float, end: float) -> tuple[int, int] | None:
    """(rows, epochs) the source produced in the epochs that ended inside [start, end]: the difference of
    the last epochs before ``start`` and before ``end``; None without an epoch on either side."""
    before = [e for e in epochs if e.committed_at <= start]
    inside = [e for e in epochs if start < e.committed_at <= end]
    if not before or not inside:
        return None
    return inside[-1].rows - before[-1].rows, len(inside)


def batch_gaps(epochs: list[EpochOffset], batch_seconds: float) -> list[float]:
    """Seconds of each batch cycle of a Real-time Mode query in which no task reads: the time from one
    batch's commit to the next one's, less the batch's duration (its tasks read for that long; the rest
    is planning, launching the tasks, merging the offsets and committing; records wait in the topic)."""
    commits = [e.committed_at for e in epochs]
    return [max(0.0, later - earlier - batch_seconds) for earlier, later in zip(commits, commits[1:])]


def prorated_rows(epochs: list[EpochOffset], start: float, end: float) -> tuple[float, float, int] | None:
    """(rows, rows per second, batches) for [start, end] from the committed batches around it: the rows
    read from the commit of the last batch before ``start`` to that of the last inside, whole batch
    cycles (each with its gap), at their mean rate times the window's length. None without a batch
    on either side."""
    counted = epoch_rows_between(epochs, start, end)
    before = [e.committed_at for e in epochs if e.committed_at <= start]
    inside = [e.committed_at for e in epochs if start < e.committed_at <= end]
    if counted is None or not before or not inside or inside[-1] <= before[-1]:
        return None
    rows, batches = counted
    rate = rows / (inside[-1] - before[-1])
    return rate * (end - start), rate, batches


def sustained_throughput(batches: list[BatchProgress]) -> float:
    """Events per second the query processed: rows over the busy time of the batches (0 without any)."""
    rows = sum(b.input_rows for b in batches)
    busy_ms = sum(b.trigger_ms for b in batches)
    return rows / (busy_ms / 1000.0) if busy_ms > 0 else 0.0


def median_processed_rate(batches: list[BatchProgress]) -> float:
    rates = [b.processed_rows_per_s for b in batches if b.input_rows > 0]
    return statistics.median(rates) if rates else 0.0


def resolve_sink(requested: str) -> str:
    if requested not in SINKS:
        raise ConfigError(f"--sink {requested}: unknown sink; use one of {', '.join(SINKS)}")
    if requested == "auto":
        return "redis" if redis_server_binary() else "file"
    return requested


def _spark_conf(options: YsbOptions) -> dict[str, str]:
    """The app's Spark configuration. The UI is on (on a free loopback port) because the profiler
    counts the window's events from its SQL REST API; the retention limits keep the driver's heap
    flat over hours of one micro-batch per second (the defaults keep 1000 executions, jobs and stages
    with their plans and task metrics); the profiler's 5 s polling needs only the last few."""
    cores = options.executor_cores * options.executors
    return {
        "spark.executor.cores": str(options.executor_cores),
        "spark.cores.max": str(cores),
        "spark.executor.memory": options.executor_memory,
        "spark.sql.shuffle.partitions": str(max(2, cores)),
        "spark.sql.streaming.numRecentProgressUpdates": "10",
        "spark.ui.enabled": "true",
        "spark.ui.port": str(free_port()),
        "spark.ui.retainedJobs": "200",
        "spark.ui.retainedStages": "200",
        "spark.ui.retainedTasks": "2000",
        "spark.sql.ui.retainedExecutions": "200",
        "spark.ui.retainedDeadExecutors": "10",
    } | ({} if options.frame_pointers else {"spark.executor.extraJavaOptions": "", "spark.driver.extraJavaOptions": ""})


# A continuous query's checkpoint keeps its epochs for this long. The window's events are the difference
# of two epochs' offsets, the last one before the window and the last inside it (epoch_rows_between), read
# after the window; Spark's default (spark.sql.streaming.minBatchesToRetain, 100) purges every epoch but the
# last 100, so a window of more than ~100 one-second epochs had no epoch before it left and no event count.
CONTINUOUS_CHECKPOINT_SECONDS = 4 * 3600


def continuous_checkpoint_conf(epoch_seconds: float) -> dict[str, str]:
    """Keep CONTINUOUS_CHECKPOINT_SECONDS of a continuous query's epochs (about 4 small files per epoch),
    not Spark's last 100. Only for continuous queries: a micro-batch query's state store keeps as many
    versions of its state as this says."""
    epochs = int(CONTINUOUS_CHECKPOINT_SECONDS / max(epoch_seconds, 0.1))
    return {"spark.sql.streaming.minBatchesToRetain": str(max(epochs, 100))}


# Executors reading Kafka continuously: Spark's KafkaDataConsumer warns on every fetch that a continuous
# task's thread is not an UninterruptibleThread (KAFKA-1894), once per record; measured, that warning
# took 73 of the Kafka task's 193 samples (38 %). It stays an error-level logger; the rest is Spark's
# own default (log4j2-defaults.properties: INFO to stderr).
_EXECUTOR_LOG4J2 = """\
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.kafkaconsumer.name = org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer
logger.kafkaconsumer.level = error
"""


def executor_log_conf(options: YsbOptions, work: Path) -> dict[str, str]:
    """The executors' log4j2 configuration for a continuous query on Kafka (_EXECUTOR_LOG4J2, written
    into ``work``), on top of their other JVM options; nothing otherwise."""
    config = work / "executor-log4j2.properties"
    config.write_text(_EXECUTOR_LOG4J2)
    java = DEFAULT_JAVA_OPTIONS if options.frame_pointers else ""
    return {"spark.executor.extraJavaOptions": f"{java} -Dlog4j2.configurationFile={config}".strip()}


def store_ad_campaigns(redis: RedisServer, mapping: list[AdCampaign]) -> None:
    """The static ad -> campaign table as one Redis hash, as YSB's setup stores it (the continuous
    query's join loads it from there)."""
    with redis.client() as client:
        client.command("DEL", ADS_KEY)
        for chunk in range(0, len(mapping), 1000):
            fields: list[str] = []
            for row in mapping[chunk : chunk + 1000]:
                fields += [row.ad_id, row.campaign_id]
            client.command("HSET", ADS_KEY, *fields)


def _app_env() -> dict[str, str]:
    """The app imports ``coordinator`` from the same tree as this process: a worktree or checkout
    other than the installed one must not run the installed copy's pipeline."""
    root = str(YSB_DIR.parents[2])  # the tree holding the coordinator package (ysb -> workloads -> coordinator)
    inherited = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": root + (os.pathsep + inherited if inherited else "")}


def build_sink_jar(spark_home: Path, cache_dir: Path | None = None) -> Path:
    """Compile RedisSink.java against this Spark's jars into a jar, cached by source and Spark version."""
    jars = sorted(p.name for p in (spark_home / "jars").glob("spark-sql-api_*.jar")) + sorted(
        p.name for p in (spark_home / "jars").glob("spark-sql_*.jar")
    )
    return compile_jar([SINK_SOURCE, RESP_SOURCE], str(spark_home / "jars" / "*"), "ysb-redis-sink", jars, cache_dir)


@dataclass
class YsbRun(Lifecycle):
    """Context manager: the YSB query running on ``cluster`` (and its redis-server) until stop()."""

    cluster: LocalSparkCluster
    options: YsbOptions = field(default_factory=YsbOptions)
    duration: float = 0.0  # the app stops itself after this long (0: until stopped)
    driver_port: int = 0  # fixed driver RPC port (executors' --driver-url names it); 0: Spark picks one
    continuous: bool = False  # Spark Continuous Processing instead of micro-batches
    realtime: bool = False  # Spark Real-time Mode (long-running batch tasks) instead of micro-batches
    kafka_bootstrap: str = ""  # read the events from options.kafka_topic of this broker, not the generator
    sink: str = field(init=False, default="")
    redis: RedisServer | None = field(init=False, default=None)
    app: SparkSubmitProcess | None = field(init=False, default=None)
    _work: Path | None = field(init=False, default=None)

    @property
    def sink_dir(self) -> Path:
        assert self._work is not None
        return self._work / "sink"

    def start(self) -> YsbRun:
        self.sink = resolve_sink(self.options.sink)
        if (self.continuous or self.realtime or self.options.spark_window == "sink") and self.sink != "redis":
            raise ConfigError(
                "the YSB window is kept in Redis here (Spark Continuous Processing, Real-time Mode, --spark-window "
                "sink): install "
                "redis-server (scripts/setup.sh does) and use --sink auto or redis"
            )
        self._work = Path(tempfile.mkdtemp(prefix="ysb-", dir=self.cluster.tmp_dir))
        try:
            args = [
                "--rate", str(self.options.rate),
                "--campaigns", str(self.options.campaigns),
                "--ads-per-campaign", str(self.options.ads_per_campaign),
                "--partitions", str(self.options.partitions),
                "--trigger", str(self.options.trigger_seconds),
                "--duration", str(self.duration),
                "--checkpoint", str(self._work / "checkpoint"),
            ]
            jars = []
            if self.kafka_bootstrap:
                from coordinator.workloads.kafka import spark_kafka_jars

                args += ["--kafka-bootstrap", self.kafka_bootstrap, "--kafka-topic", self.options.kafka_topic]
                jars += [str(jar) for jar in spark_kafka_jars()]
            redis_conf: dict[str, str] = {}
            if self.sink == "redis":
                self.redis = RedisServer().start()
                mapping = ad_campaign_mapping(self.options.campaigns, self.options.ads_per_campaign)
                store_ad_campaigns(self.redis, mapping)
                args += ["--redis-port", str(self.redis.port)]
                jars.append(str(build_sink_jar(self.cluster.spark_home)))
                redis_conf = {"spark.ysb.redis.port": str(self.redis.port), "spark.ysb.redis.adsKey": ADS_KEY}
            else:
                args += ["--file-sink", str(self.sink_dir)]
            if self.continuous or self.realtime:
                args.append("--continuous" if self.continuous else "--realtime")
            elif self.options.spark_window != "state":
                args += ["--window", self.options.spark_window]
            if self.options.udf != "sql":
                args += ["--udf", self.options.udf]
            conf = _spark_conf(self.options) | redis_conf | python_udf_conf(self.options)
            if self.continuous or self.realtime:
                conf |= continuous_checkpoint_conf(self.options.trigger_seconds)
            if (self.continuous or self.realtime) and self.kafka_bootstrap:
                conf |= executor_log_conf(self.options, self._work)
            if jars:
                conf["spark.jars"] = ",".join(jars)
            if self.driver_port:
                conf["spark.driver.port"] = str(self.driver_port)
            self.app = self.cluster.submit(APP, args, conf=conf, name="ysb", env=_app_env())
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Until the first micro-batch with input rows (continuous: the first epoch's windows) has gone
        through the whole pipeline."""
        assert self.app is not None
        if not (self.continuous or self.realtime):
            self.app.wait_for_output(r"^READY", timeout=timeout)
            return
        # A continuous query reports no progress; its sink writes windows when the first epoch commits
        # (Real-time Mode's when its first batch ends).
        deadline = time.monotonic() + timeout
        while self.redis_windows() == 0:
            self.check_running()
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"{self.app.stderr_path}: the {'continuous' if self.continuous else 'real-time'} YSB query "
                    f"wrote no window after {timeout:.0f} s; "
                    "read the log, or raise --ready-timeout"
                )
            time.sleep(1.0)

    def epochs(self) -> list[EpochOffset]:
        """Committed epochs of the continuous query, or batches of the Real-time Mode one (empty for
        micro-batches)."""
        if not (self.continuous or self.realtime) or self._work is None:
            return []
        return read_epoch_offsets(self._work / "checkpoint", self.options.partitions)

    def wait_processing(self, seconds: float) -> None:
        """Let the query run for ``seconds``, failing early if the app dies."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_running()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        self.check_running()

    def check_running(self) -> None:
        """SparkClusterError naming the app's log and the error in it when the app has exited."""
        assert self.app is not None
        if self.app.poll() is not None:
            cause = first_error_line([self.app.stderr_path, self.app.stdout_path]) or "no error line in its log"
            raise SparkClusterError(
                f"{self.app.stderr_path}: the YSB app exited with code {self.app.returncode} while running: {cause}"
            )

    def progress(self) -> list[BatchProgress]:
        return parse_progress(self.app.output()) if self.app is not None else []

    def redis_windows(self) -> int:
        """Windows the sink wrote to Redis (keys ``ysb:window:*``); 0 with the file sink."""
        if self.redis is None:
            return 0
        with self.redis.client() as client:
            return len(client.keys("ysb:window:*"))

    def file_sink_rows(self) -> int:
        if self._work is None or not self.sink_dir.exists():
            return 0
        rows = 0
        for part in self.sink_dir.glob("part-*"):
            with contextlib.suppress(OSError):
                rows += max(0, len(part.read_text(errors="replace").splitlines()) - 1)
        return rows

    def stop(self) -> None:
        """Stop the app, then redis-server, then remove the work directory; each step runs even when
        an earlier one is interrupted (a second Ctrl-C must not leave redis-server behind)."""
        try:
            if self.app is not None:
                app, self.app = self.app, None
                self.cluster.stop_app(app)
        finally:
            try:
                if self.redis is not None:
                    redis, self.redis = self.redis, None
                    redis.stop()
            finally:
                if self._work is not None:
                    shutil.rmtree(self._work, ignore_errors=True)
                    self._work = None
