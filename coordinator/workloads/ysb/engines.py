"""The stream processing engines `coordinator demo --spe` can run YSB on, behind one small interface.

An engine starts its local cluster and the YSB query, says when the query processes events, names its
processes (known_spes), its application profile and where the profiler counts its events, and stops
everything. Adding an engine means one class here and one entry in ENGINES (Flink's lives in
coordinator/workloads/ysb/flink.py, with its cluster in coordinator/workloads/flinkcluster.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from coordinator.workloads.processes import Lifecycle, free_port
from coordinator.workloads.sparkcluster import LocalSparkCluster
from coordinator.workloads.ysb.flink import FlinkYsbEngine, JobWindow, YsbFlinkRun
from coordinator.workloads.ysb.query import QueryEngine
from coordinator.workloads.ysb.spark import (
    BatchProgress,
    YsbOptions,
    YsbRun,
    batches_between,
    epoch_rows_between,
)

if TYPE_CHECKING:
    from coordinator.workloads.kafka import KafkaTools, LocalKafkaBroker, YsbProducer
    from profiler.capture.format import EventCount


@dataclass(frozen=True)
class WindowResult:
    """What the query itself reports for the profiling window (printed by the demo)."""

    units: int  # micro-batches or epochs that finished in the window
    unit_name: str
    events: int | None  # input events the query reports for the window (None: it reports none)
    throughput: str  # one human-readable clause
    sink_rows: int


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
    def known_spes(self) -> str: ...
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


def spark_known_spes(master_port: int, driver_port: int) -> str:
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


class _SparkYsb(QueryEngine[YsbRun], Lifecycle):
    """YSB on a LocalSparkCluster; the subclasses pick the trigger (micro-batch or continuous)."""

    spe = ""
    profile = ""
    events_source = ""
    continuous = False

    def __init__(self, options: YsbOptions, log_dir: Path) -> None:
        self.options = options
        self.log_dir = log_dir
        self.driver_port = free_port()
        self.cluster = LocalSparkCluster(
            worker_cores=options.executors * options.executor_cores,
            worker_memory=f"{options.executors}g",
            log_dir=log_dir,
        )
        self.ysb: YsbRun | None = None
        self.broker: LocalKafkaBroker | None = None
        self.kafka: KafkaTools | None = None
        self.producer: YsbProducer | None = None

    def start(self) -> None:
        try:
            self.cluster.start()
            if self.options.source == "kafka":
                self._start_kafka()
            self.ysb = self._new_run()
            self.ysb.start()
        except BaseException:
            self.stop()
            raise

    def _new_run(self) -> YsbRun:
        bootstrap = self.kafka.bootstrap if self.kafka is not None else ""
        return YsbRun(
            self.cluster, self.options, driver_port=self.driver_port, continuous=self.continuous,
            kafka_bootstrap=bootstrap,
        )

    def _start_kafka(self) -> None:
        """The broker (a local one unless the options name one), the topic (one partition per generator
        partition) and the producer at --rate."""
        from coordinator.workloads.kafka import KafkaTools, LocalKafkaBroker, kafka_lib

        if self.options.kafka_bootstrap:
            self.kafka = KafkaTools(self.options.kafka_bootstrap, kafka_lib())
        else:
            self.broker = LocalKafkaBroker(log_dir=self.log_dir / "kafka").start()
            self.kafka = self.broker.tools()
        self.kafka.create_topic(self.options.kafka_topic, self.options.partitions)
        self._start_producer()

    def _start_producer(self) -> None:
        from coordinator.workloads.kafka import YsbProducer

        assert self.kafka is not None
        options = self.options
        self.producer = YsbProducer(
            self.kafka, options.kafka_topic, options.rate, self.log_dir / "kafka", options.campaigns,
            options.ads_per_campaign,
        ).start()

    def describe(self) -> str:
        kafka = f"; Kafka {self.kafka.bootstrap}, topic {self.options.kafka_topic}" if self.kafka is not None else ""
        return f"Spark master {self.cluster.master_url}{kafka}"

    def check_running(self) -> None:
        if self.producer is not None:
            self.producer.check_running()
        if self.broker is not None:
            self.broker.check_running()
        super().check_running()

    def restart_query(self, rate: int) -> None:
        """Stop the query and start it again at ``rate`` events/s on the same running cluster (a
        campaign's next level). Spark's executors belong to the application: they are new JVMs."""
        if self.ysb is not None:
            ysb, self.ysb = self.ysb, None
            ysb.stop()
        self.options = replace(self.options, rate=rate)
        self.driver_port = free_port()
        if self.producer is not None:
            producer, self.producer = self.producer, None
            producer.stop()
            self._start_producer()
        self.ysb = self._new_run()
        self.ysb.start()

    def known_spes(self) -> str:
        return spark_known_spes(self.cluster.master_port, self.driver_port)

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

    def count_events(self, start: float, end: float) -> EventCount | None:
        """The window's events from the query itself, for when the profiler cannot count them (None:
        the profiler's own count stands)."""
        return None

    def produced_between(self, start: float, end: float) -> int | None:
        """Records the Kafka producer had acknowledged in [start, end] (None without Kafka)."""
        from coordinator.workloads.kafka import produced_between

        return produced_between(self.producer.reports(), start, end) if self.producer is not None else None

    def stop(self) -> None:
        """The query, then the producer, the broker and the cluster; each step even when one before failed."""
        try:
            if self.ysb is not None:
                ysb, self.ysb = self.ysb, None
                ysb.stop()
        finally:
            try:
                if self.producer is not None:
                    producer, self.producer = self.producer, None
                    producer.stop()
            finally:
                try:
                    if self.broker is not None:
                        broker, self.broker = self.broker, None
                        broker.stop()
                finally:
                    self.cluster.stop()


class SparkStructuredYsb(_SparkYsb):
    """Spark Structured Streaming, 1 s micro-batches, the stateful 10 s window inside Spark."""

    spe = "spark-structured-streaming"
    profile = "application_profiles/spark_structured_streaming.txt"
    events_source = "the driver's SQL REST API (rows its micro-batches read; Spark UI on a free loopback port)"

    def window(self, start: float, end: float) -> WindowResult:
        from coordinator.workloads.ysb.spark import median_processed_rate, sustained_throughput

        batches: list[BatchProgress] = batches_between(self._run().progress(), start, end)
        produced = self.produced_between(start, end)
        kafka = "" if produced is None else f"; {produced} records produced into Kafka in the window"
        return WindowResult(
            units=len(batches),
            unit_name="micro-batches",
            events=sum(b.input_rows for b in batches),
            throughput=f"throughput {sustained_throughput(batches):.0f} events/s of busy time, median batch "
            f"{median_processed_rate(batches):.0f} events/s{kafka}",
            sink_rows=self.sink_rows(),
        )


# RateStreamContinuousPartitionReader waits (1000 / rows per second per partition).toLong ms per row:
# 0 ms, i.e. no throttle at all, above 1000 rows/s per partition.
RATE_STEP_LIMIT = 1000


class SparkContinuousYsb(_SparkYsb):
    """Spark Continuous Processing, 1 s epochs; Spark has no window here: the sink keeps it in Redis."""

    spe = "spark-continuous-processing"
    profile = "application_profiles/spark_continuous.txt"
    events_source = "the query's offsets log (rows the rate source produced in the epochs of the window)"
    continuous = True

    def count_events(self, start: float, end: float) -> EventCount | None:
        from profiler.capture.format import EventCount

        counted = epoch_rows_between(self._run().epochs(), start, end)
        if counted is None:
            return None
        rows, epochs = counted
        detail = (
            f"rows the rate source produced in the {epochs} epochs committed inside the window (offsets/<epoch> "
            "of the query's checkpoint, placed by the time the driver wrote them); a continuous query runs no "
            "micro-batches and reports no progress; resolution: one epoch (1 s) at each end of the window"
        )
        return EventCount(rows, "spark-offsets-log", detail, start, end)

    def window(self, start: float, end: float) -> WindowResult:
        counted = epoch_rows_between(self._run().epochs(), start, end)
        rows, epochs = counted if counted is not None else (None, 0)
        rate = f"{rows / (end - start):.0f} events/s" if rows is not None and end > start else "no epochs"
        if self.options.rate / self.options.partitions > RATE_STEP_LIMIT:
            # Spark's continuous rate reader sleeps (1000 / rows per s per partition) ms per row, an integer.
            rate += (
                f" (unthrottled: above {RATE_STEP_LIMIT} rows/s per partition Spark's continuous rate source "
                "does not wait between rows, so this is the query's maximum, not --rate)"
            )
        return WindowResult(epochs, "epochs", rows, f"throughput {rate}", self.sink_rows())


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
        self.ysb = YsbFlinkRun(self.cluster, self.options).start()

    def _job_window(self, start: float, end: float) -> JobWindow:
        if self._job is None or self._job[:2] != (start, end):
            self._job = (start, end, self.job_window(start, end))
        return self._job[2]

    def window(self, start: float, end: float) -> WindowResult:
        job = self._job_window(start, end)
        rate = job.events / (end - start) if end > start else 0.0
        return WindowResult(
            job.windows, "10 s windows", job.events, f"throughput {rate:.0f} events/s by the job's own count",
            job.sink_rows,
        )

    def count_events(self, start: float, end: float) -> EventCount | None:
        from profiler.capture.format import EventCount

        job = self._job_window(start, end)
        detail = (
            "the job's own count: the views in its Redis windows times three (every third generated event is a "
            "view), the windows at the ends by their overlap with the window"
        )
        return EventCount(job.events, "ysb-redis-windows", detail, start, end)


ENGINES: dict[str, Callable[[YsbOptions, Path], YsbEngine]] = {
    "spark-str": SparkStructuredYsb,
    "spark-cp": SparkContinuousYsb,
    "flink": FlinkYsb,
}
DEFAULT_ENGINE = "spark-str"
