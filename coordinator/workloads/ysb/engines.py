"""The stream processing engines `coordinator demo --spe` can run YSB on, behind one small interface.

An engine starts its local cluster and the YSB query, says when the query processes events, names its
processes (known_spes), its application profile and where the profiler counts its events, and stops
everything. Adding an engine means one class here and one entry in ENGINES (Flink's lives in
coordinator/workloads/ysb/flink.py, with its cluster in coordinator/workloads/flinkcluster.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from coordinator.workloads.kafka import KafkaFeed
from coordinator.workloads.processes import Lifecycle, free_port, stop_in_order
from coordinator.workloads.sparkcluster import LocalSparkCluster, SparkClusterError
from coordinator.workloads.ysb.flink import WINDOW_MS, FlinkYsbEngine, JobWindow, YsbFlinkRun
from coordinator.workloads.ysb.latency import WindowLatency, read_window_latency
from coordinator.workloads.ysb.query import QueryEngine
from coordinator.workloads.ysb.spark import (
    BatchProgress,
    EpochOffset,
    YsbOptions,
    YsbRun,
    batch_gaps,
    batches_finished_between,
    epoch_rows_between,
    prorated_rows,
)

if TYPE_CHECKING:
    from profiler.capture.format import EventCount


@dataclass(frozen=True)
class WindowResult:
    """What the query itself reports for the profiling window (printed by the demo)."""

    units: int  # micro-batches or epochs that finished in the window
    unit_name: str
    events: int | None  # input events the query reports for the window (None: it reports none)
    throughput: str  # one human-readable clause
    sink_rows: int
    produced: SourceCount | None = None  # reading Kafka: the records produced over the span ``events`` covers
    latency: WindowLatency | None = None  # YSB's latency of the windows that closed in it (None: no Redis sink)


@dataclass(frozen=True)
class SourceCount:
    """Records produced into Kafka over the span whose records an engine's count of the window covers,
    to hold that count against (EventCount.produced in events.json)."""

    records: int
    span_start: float
    span_end: float
    detail: str


def produced_over(feed: KafkaFeed | None, span: tuple[float, float] | None, how: str) -> SourceCount | None:
    """The records ``feed``'s producer had acknowledged over ``span`` (None without Kafka, a span or
    producer reports covering both ends)."""
    if feed is None or span is None:
        return None
    records = feed.produced_between(*span)
    if records is None:
        return None
    detail = (
        f"records the broker acknowledged to the demo's producer from {span[0]:.3f} to {span[1]:.3f} (unix s), "
        f"{how}; each end interpolated between the producer's once-a-second reports"
    )
    return SourceCount(records, span[0], span[1], detail)


class YsbEngine(Protocol):
    """One engine running YSB locally; a context manager that stops everything it started."""

    spe: str  # the run's "spe" label
    profile: str  # application profile, relative to the source tree (profiler.defaults.data_file)
    events_source: str  # how the profiler counts the window's events, one line for the demo's output
    log_dir: Path  # every log of the cluster and the query (kept by the demo when the workload fails)

    def describe(self) -> str: ...
    def start(self) -> None: ...
    def wait_ready(self, timeout: float) -> None: ...
    def wait_processing(self, seconds: float) -> None: ...
    def check_running(self) -> None: ...
    def known_spes(self) -> str: ...  # with --source kafka also the broker's line (role broker)
    def workload_pids(self) -> list[int]: ...
    def managing_pids(self) -> list[int]: ...
    def window(self, start: float, end: float) -> WindowResult: ...
    def count_events(self, start: float, end: float) -> EventCount | None: ...
    def restart_query(self, rate: int) -> None: ...
    def stop(self) -> None: ...
    def __enter__(self) -> YsbEngine: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def spark_known_spes(master_port: int, driver_port: int, address: str = "127.0.0.1") -> str:
    """A known_spes file that selects only this demo's processes (the machine may run other Spark); ``address``
    the one the Master and the driver bind."""
    return "\n".join(
        [
            "# coordinator demo: only the processes of this demo's local cluster",
            "spark  workload  executor  org.apache.spark.executor.CoarseGrainedExecutorBackend"
            f"  arg=spark://CoarseGrainedScheduler@{address}:{driver_port}",
            f"spark  managing  driver   org.apache.spark.deploy.SparkSubmit  arg=spark.driver.port={driver_port}",
            f"spark  managing  master   org.apache.spark.deploy.master.Master  arg={master_port}",
            f"spark  managing  worker   org.apache.spark.deploy.worker.Worker  arg=spark://{address}:{master_port}",
            "",
        ]
    )


# coordinator demo --udf python: the executors' Python workers (the daemon and the workers it forks) run the
# UDF and their half of the serialization. Their command line names no driver port: any PySpark worker of the
# machine matches; each is tied to the executor JVM it serves (scope.json's "serves").
PYTHON_WORKER_SPES = (
    "spark  workload  python-worker  pyspark.daemon\n"
    "spark  workload  python-worker  pyspark.worker\n"
)


# A window that closed in the profiled window is read back this long after the window's end, plus two
# triggers (micro-batches, epochs, real-time batches): its last update comes at the end of the batch that
# read its last events, or of the next one when they arrived while no task read (Real-time Mode's gaps).
LATENCY_MARGIN_S = 5.0


class _SparkYsb(QueryEngine[YsbRun], Lifecycle):
    """YSB on a LocalSparkCluster; the subclasses pick the trigger (micro-batch, continuous, real-time)."""

    spe = ""
    profile = ""
    events_source = ""
    continuous = False
    realtime = False

    def __init__(self, options: YsbOptions, log_dir: Path) -> None:
        self.options = options
        self.log_dir = log_dir
        self.driver_port = free_port()
        spread = bool(options.worker_hosts)  # one Worker, one executor per host
        self.cluster = LocalSparkCluster(
            worker_cores=options.executor_cores if spread else options.executors * options.executor_cores,
            worker_memory="1g" if spread else f"{options.executors}g",
            log_dir=log_dir, bind_address=options.bind_address, worker_hosts=options.worker_hosts,
        )
        self.ysb: YsbRun | None = None
        self.kafka = KafkaFeed.for_options(options, log_dir)

    def start(self) -> None:
        try:
            # The Worker's, the broker's, the driver's and the producer's JVMs start side by side: the app is
            # submitted once the Master is ALIVE and the topic exists, and its executors start when the Worker
            # registers. The query reads the topic from its latest offsets when it starts, so the order of
            # the producer and the query changes no record it reads.
            self.cluster.start(wait=False)
            if self.kafka is not None:
                self.kafka.start(produce=False)
            self.ysb = self._new_run()
            self.ysb.start()
            if self.kafka is not None:
                self.kafka.start_producer()
            self.cluster.wait_started()
        except BaseException:
            self.stop()
            raise

    def _new_run(self) -> YsbRun:
        bootstrap = self.kafka.bootstrap if self.kafka is not None else ""
        return YsbRun(
            self.cluster, self.options, driver_port=self.driver_port, continuous=self.continuous,
            realtime=self.realtime, kafka_bootstrap=bootstrap,
        )

    def describe(self) -> str:
        kafka = f"; {self.kafka.describe()}" if self.kafka is not None else ""
        return f"Spark master {self.cluster.master_url}{kafka}"

    def check_running(self) -> None:
        if self.kafka is not None:
            self.kafka.check_running()
        super().check_running()

    def restart_query(self, rate: int) -> None:
        """Stop the query and start it again at ``rate`` events/s on the same running cluster (a
        campaign's next level). Spark's executors belong to the application: they are new JVMs."""
        if self.ysb is not None:
            ysb, self.ysb = self.ysb, None
            ysb.stop()
        self.options = replace(self.options, rate=rate)
        self.driver_port = free_port()
        if self.kafka is not None:
            self.kafka.restart_producer(rate)
        self.ysb = self._new_run()
        self.ysb.start()

    def known_spes(self) -> str:
        broker = self.kafka.known_spes() if self.kafka is not None else ""
        python = PYTHON_WORKER_SPES if self.options.udf != "sql" else ""
        return spark_known_spes(self.cluster.master_port, self.driver_port, self.options.bind_address) + python + broker

    def workload_pids(self) -> list[int]:
        return self.cluster.executor_pids()

    def managing_pids(self) -> list[int]:
        """The driver JVM (the app's process tree holds it and its Python)."""
        return self.cluster.driver_pids(self._run().app)

    def sink_rows(self) -> int:
        ysb = self._run()
        return ysb.redis_windows() if ysb.sink == "redis" else ysb.file_sink_rows()

    def window(self, start: float, end: float) -> WindowResult:
        raise NotImplementedError

    def window_latency(self, start: float, end: float) -> WindowLatency | None:
        """YSB's latency of the windows that closed in [start, end], read from Redis once their last update
        is likely written (None with the file sink)."""
        ysb = self._run()
        if ysb.redis is None:
            return None
        settle = 2 * self.options.trigger_seconds + LATENCY_MARGIN_S
        time.sleep(max(0.0, end + settle - time.time()))
        how = (
            f"read {settle:g} s after the profiled window's end (two {self.options.trigger_seconds:g} s triggers "
            f"and {LATENCY_MARGIN_S:g} s): a window's update after that is not seen"
        )
        with ysb.redis.client() as client:
            return read_window_latency(client, WINDOW_MS, start, end, how)

    def count_events(self, start: float, end: float) -> EventCount | None:
        """The window's events from the query itself, for when the profiler cannot count them (None:
        the profiler's own count stands)."""
        return None

    def stop(self) -> None:
        """The query, then the producer, the broker and the cluster; each step even when one before failed."""
        ysb, self.ysb = self.ysb, None
        kafka = self.kafka.stop if self.kafka is not None else None
        stop_in_order(ysb.stop if ysb is not None else None, kafka, self.cluster.stop)


class SparkStructuredYsb(_SparkYsb):
    """Spark Structured Streaming, 1 s micro-batches, the stateful 10 s window inside Spark."""

    spe = "spark-structured-streaming"
    profile = "application_profiles/spark_structured_streaming.txt"
    events_source = "the driver's SQL REST API (rows its micro-batches read; Spark UI on a free loopback port)"

    def window(self, start: float, end: float) -> WindowResult:
        from coordinator.workloads.ysb.spark import kafka_read_span, median_processed_rate, sustained_throughput

        progress = self._run().progress()
        # placed by their finish time, as the profiler's count from the driver's REST API places them
        batches: list[BatchProgress] = batches_finished_between(progress, start, end)
        how = (
            "the span whose records the micro-batches that finished in the window read (from the start of "
            "the batch before the first to the start of the last: a batch reads up to the end offsets it "
            "finds when it starts)"
        )
        return WindowResult(
            units=len(batches),
            unit_name="micro-batches",
            events=sum(b.input_rows for b in batches),
            throughput=f"throughput {sustained_throughput(batches):.0f} events/s of busy time, median batch "
            f"{median_processed_rate(batches):.0f} events/s",
            sink_rows=self.sink_rows(),
            produced=produced_over(self.kafka, kafka_read_span(progress, batches), how),
            latency=self.window_latency(start, end),
        )

    def count_events(self, start: float, end: float) -> EventCount | None:
        """The rows the micro-batches that finished in the window read, from the driver's progress: the
        profiler's REST count by the same rule, for hosts where no driver runs (coordinator demo --hosts)."""
        from profiler.capture.format import EventCount

        batches = batches_finished_between(self._run().progress(), start, end)
        if not batches:
            return None
        detail = f"rows read by the {len(batches)} micro-batches that finished in the window (the driver's progress)"
        return EventCount(sum(b.input_rows for b in batches), "spark-progress", detail, start, end)


# A continuous query reading Kafka has caught up when it is less than this many seconds of events behind.
CAUGHT_UP_S = 2.0
# RateStreamContinuousPartitionReader waits (1000 / rows per second per partition).toLong ms per row:
# 0 ms, i.e. no throttle at all, above 1000 rows/s per partition.
RATE_STEP_LIMIT = 1000


class _SparkOffsetsLogYsb(_SparkYsb):
    """A Spark query that reports no usable progress and whose events come from its checkpoint's
    offsets log: Continuous Processing's epochs, Real-time Mode's long-running batches. Its sink
    keeps the window in Redis; reading Kafka, it is ready once it has caught up with the topic."""

    unit_name = "epochs"  # what one offsets/<N> file is (also the resolution at each end of the window)
    mode_name = "continuous"

    def wait_ready(self, timeout: float) -> None:
        """The first windows in Redis; reading Kafka, then until the query has caught up with the
        topic: the records produced while its first epochs compiled their code wait in the topic, and
        the epochs that drain them are start-up, not the steady state the demo profiles."""
        deadline = time.monotonic() + timeout
        super().wait_ready(timeout)
        if self.kafka is None:
            return
        lag: float | None = None
        while time.monotonic() < deadline:
            self.check_running()
            epochs = self._run().epochs()
            lag = self.kafka.lag(epochs[-1].rows, epochs[-1].committed_at) if epochs else None
            if lag is not None and lag <= CAUGHT_UP_S * self.options.rate:
                return
            time.sleep(1.0)
        behind = f"{lag:.0f}" if lag is not None else "an unknown number of"
        raise SparkClusterError(
            f"the {self.mode_name} query is {behind} records behind the "
            f"Kafka topic after {timeout:.0f} s; lower --rate or raise --ready-timeout; read {self.log_dir}"
        )

    def count_events(self, start: float, end: float) -> EventCount | None:
        from profiler.capture.format import EventCount

        counted = epoch_rows_between(self._run().epochs(), start, end)
        if counted is None:
            return None
        rows, epochs = counted
        what = "records the Kafka source read" if self.kafka is not None else "rows the rate source produced"
        seconds = f"{self.options.trigger_seconds:g} s"
        detail = (
            f"{what} in the {epochs} {self.unit_name} committed inside the window (offsets/<N> "
            f"of the query's checkpoint, placed by the time the driver wrote them); a {self.mode_name} query "
            f"reports no usable progress; resolution: one of its {self.unit_name} ({seconds}) at each end of the window"
        )
        return EventCount(rows, "spark-offsets-log", detail, start, end)

    def throughput_note(self) -> str:
        """A clause added to the window's throughput ("" by default)."""
        return ""

    def window(self, start: float, end: float) -> WindowResult:
        all_epochs = self._run().epochs()
        counted = epoch_rows_between(all_epochs, start, end)
        rows, epochs = counted if counted is not None else (None, 0)
        rate = f"{rows / (end - start):.0f} events/s" if rows is not None and end > start else f"no {self.unit_name}"
        how = (
            f"the span of the {self.unit_name} counted (from the commit of the last one before the window to "
            "the last inside)"
        )
        produced = produced_over(self.kafka, epoch_span(all_epochs, start, end), how)
        throughput = f"throughput {rate}{self.throughput_note()}"
        latency = self.window_latency(start, end)
        return WindowResult(epochs, self.unit_name, rows, throughput, self.sink_rows(), produced, latency)


class SparkContinuousYsb(_SparkOffsetsLogYsb):
    """Spark Continuous Processing, 1 s epochs; Spark has no window here: the sink keeps it in Redis."""

    spe = "spark-continuous-processing"
    profile = "application_profiles/spark_continuous.txt"
    events_source = "the query's offsets log (rows its source produced or read in the epochs of the window)"
    continuous = True

    def throughput_note(self) -> str:
        if self.kafka is None and self.options.rate / self.options.partitions > RATE_STEP_LIMIT:
            # Spark's continuous rate reader sleeps (1000 / rows per s per partition) ms per row, an integer.
            return (
                f" (unthrottled: above {RATE_STEP_LIMIT} rows/s per partition Spark's continuous rate source "
                "does not wait between rows, so this is the query's maximum, not --rate)"
            )
        return ""


# Real-time Mode's shortest batch (spark.sql.streaming.realTimeMode.minBatchDuration's default, 5,000 ms):
# a shorter trigger is refused with INVALID_STREAMING_REAL_TIME_MODE_TRIGGER_INTERVAL.
REALTIME_MIN_BATCH_S = 5.0


class SparkRealTimeYsb(_SparkOffsetsLogYsb):
    """Spark Real-time Mode (Spark 4.1+, trigger(realTime=...)): batches of at least 5 s run as
    long-running tasks that process each Kafka record as it arrives. It refuses aggregations (no
    stateful window) and sinks off its allowlist, so the window is kept as on CP, in a foreach writer
    over the Redis sink's window cache; the join stays Spark's broadcast hash join (allowlisted)."""

    spe = "spark-real-time-mode"
    profile = "application_profiles/spark_realtime.txt"
    events_source = "the query's offsets log (records its Kafka source read in the batches of the window)"
    realtime = True
    unit_name = "batches"
    mode_name = "real-time"

    def __init__(self, options: YsbOptions, log_dir: Path) -> None:
        super().__init__(replace(options, trigger_seconds=max(options.trigger_seconds, REALTIME_MIN_BATCH_S)), log_dir)

    def count_events(self, start: float, end: float) -> EventCount | None:
        """The window's events from the offsets log, prorated: a batch of 5 s or more is too coarse for
        whole batches at each end of a short window (the profiler's own count from the REST API, one batch
        at each end, is off by a batch), so the batches' mean rate over whole batch cycles around the window,
        times its length. Its error: where the window's ends fall against the gaps between batches."""
        from profiler.capture.format import EventCount

        epochs = self._run().epochs()
        prorated = prorated_rows(epochs, start, end)
        if prorated is None:
            return None
        rows, rate, batches = prorated
        gaps = batch_gaps(epochs, self.options.trigger_seconds)
        gap = statistics.median(gaps) if gaps else self.options.trigger_seconds
        detail = (
            f"records the Kafka source read over the {batches} batches committed inside the window and the one "
            "before (offsets/<N> of the query's checkpoint, placed by the time the driver wrote them), at their "
            f"mean rate of {rate:.0f} records/s times the window's {end - start:.1f} s; uncertainty: the rate times "
            f"the median time of a batch cycle in which no task reads ({gap:.2f} s), at each end"
        )
        return EventCount(
            round(rows), "spark-offsets-log", detail, start, end, method="batch offsets prorated to the window",
            uncertainty=rate * gap * 2**0.5,
        )


def epoch_span(epochs: list[EpochOffset], start: float, end: float) -> tuple[float, float] | None:
    """From the commit of the last epoch before ``start`` to that of the last one inside [start, end]:
    the span epoch_rows_between counts."""
    before = [e.committed_at for e in epochs if e.committed_at <= start]
    inside = [e.committed_at for e in epochs if start < e.committed_at <= end]
    return (before[-1], inside[-1]) if before and inside else None


class FlinkYsb(FlinkYsbEngine):
    """Flink 2.3 standalone, the YSB job in Java (coordinator/workloads/ysb/flink.py); the profiler counts the
    events from the JobManager's REST API, the job's own count (its Redis windows) backs it up."""

    def __init__(self, options: YsbOptions, log_dir: Path) -> None:
        super().__init__(options, log_dir)
        self._job: tuple[float, float, JobWindow] | None = None

    def restart_query(self, rate: int) -> None:
        """Cancel the job and submit it again at ``rate`` events/s to the same TaskManagers."""
        if self.ysb is not None:
            ysb, self.ysb = self.ysb, None
            ysb.stop()
        self.options = replace(self.options, rate=rate)
        self._job = None
        if self.kafka is not None:
            self.kafka.restart_producer(rate)
        self.ysb = YsbFlinkRun(self.cluster, self.options).start()

    def _job_window(self, start: float, end: float) -> JobWindow:
        if self._job is None or self._job[:2] != (start, end):
            self._job = (start, end, self.job_window(start, end))
        return self._job[2]

    def window(self, start: float, end: float) -> WindowResult:
        job = self._job_window(start, end)
        rate = job.events / (end - start) if end > start else 0.0
        how = "the window itself (the job reads the topic as records arrive; the profiler's count is the window's)"
        return WindowResult(
            job.windows, "10 s windows", job.events, f"throughput {rate:.0f} events/s by the job's own count",
            job.sink_rows, produced_over(self.kafka, (start, end), how), job.latency,
        )

    def count_events(self, start: float, end: float) -> EventCount | None:
        from profiler.capture.format import EventCount

        job = self._job_window(start, end)
        detail = (
            "the job's own count: the views in its Redis windows times three (every third generated event is a "
            "view, in the Kafka producer's events as in the generator's), the "
            "windows at the ends by their overlap with the window"
        )
        return EventCount(job.events, "ysb-redis-windows", detail, start, end)


ENGINES: dict[str, Callable[[YsbOptions, Path], YsbEngine]] = {
    "spark-str": SparkStructuredYsb,
    "spark-cp": SparkContinuousYsb,
    "spark-rtm": SparkRealTimeYsb,
    "flink": FlinkYsb,
}
DEFAULT_ENGINE = "spark-str"
