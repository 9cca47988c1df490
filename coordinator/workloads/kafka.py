"""A local Apache Kafka broker (KRaft, one combined broker/controller on free loopback ports), the jars
it and Spark's Kafka connector need (fetched from Maven Central with the ordinary Maven client, cached
like Flink), and YSB's ad event producer (a JVM of its own, outside the engines' processes).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import psutil

from coordinator.workloads.processes import (
    Lifecycle,
    ScratchLifecycle,
    free_port,
    log_tail,
    poll_until,
    spawn_logged,
    stop_all,
)
from coordinator.workloads.sparkcluster import DEFAULT_JAVA_OPTIONS, java_home
from coordinator.workloads.ysb.javabuild import cache_dir, compile_jar
from profiler.errors import CapabilityError, ConfigError, ProfilerError
from profiler.scope.spes import literal_glob

if TYPE_CHECKING:
    from coordinator.workloads.ysb.spark import YsbOptions

__all__ = [
    "BROKER_MAIN_CLASS",
    "FLINK_KAFKA_CONNECTOR",
    "KAFKA_VERSION",
    "KafkaError",
    "KafkaFeed",
    "KafkaTools",
    "LocalKafkaBroker",
    "YsbProducer",
    "flink_kafka_jars",
    "kafka_lib",
    "parse_produced",
    "produced_between",
    "spark_kafka_jars",
    "topic_name",
]

KAFKA_VERSION = "4.1.1"
BROKER_MAIN_CLASS = "kafka.Kafka"
TOOL_SOURCE = Path(__file__).resolve().parent / "ysb" / "YsbKafka.java"
TOOL_CLASS = "ysb.YsbKafka"
# log4j2 through slf4j 1.x, the logging API Kafka 4.1 is built on: without a binding it logs nothing.
_BROKER_ARTIFACTS = (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}", "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3")
# Spark's connector and what it needs beyond Spark's own jars (which already hold lz4, snappy, zstd, slf4j).
_SPARK_CONNECTOR_JARS = (
    "spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2",
)
# Flink's KafkaSource: flink-connector-kafka is released apart from Flink, its version "<connector>-<Flink>".
# Maven Central's newest, 5.0.0-2.2, is built against Flink 2.2; no release names 2.3 yet, and the
# Source API it implements (FLIP-27, flink-connector-base inside flink-dist) did not change in 2.3, so
# it runs on the Flink 2.3 we install. 4.0.x-2.0 is for Flink 2.0, the 3.x line for Flink 1.x.
FLINK_KAFKA_CONNECTOR = "5.0.0-2.2"
# What it needs beyond flink-dist (which holds flink-connector-base, slf4j and Flink's shaded jackson).
_FLINK_CONNECTOR_JARS = ("flink-connector-kafka", "kafka-clients", "lz4-java", "snappy-java", "zstd-jni")
_START_TIMEOUT_S = 120.0
_STOP_GRACE_S = 15.0
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,200}")


class KafkaError(ProfilerError):
    """The local Kafka broker did not start, a topic could not be made, or the producer failed."""

    exit_code = 10


def topic_name(text: str) -> str:
    """A Kafka topic name (letters, digits, '.', '_', '-'; at most 200 characters)."""
    if not _TOPIC.fullmatch(text) or text in (".", ".."):
        raise ConfigError(f"{text!r}: not a Kafka topic name; use letters, digits, '.', '_' and '-' (at most 200)")
    return text


def _pom(artifacts: Sequence[str]) -> str:
    deps = []
    for coordinate in artifacts:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>spe-taskprof</groupId><artifactId>jars</artifactId><version>1</version><packaging>pom</packaging>"
        f"<dependencies>{''.join(deps)}</dependencies></project>\n"
    )


def maven_jars(
    name: str, artifacts: Sequence[str], include: Sequence[str] = (), install: bool = True, say: Any = None
) -> Path:
    """``<cache>/<name>/``: the runtime jars of ``artifacts`` and their dependencies (only the artifact
    ids in ``include``, when given), copied there by ``mvn dependency:copy-dependencies`` once."""
    target = cache_dir() / name
    if target.is_dir() and any(target.glob("*.jar")):
        return target
    if not install:
        raise CapabilityError(f"{target}: no jars there; run scripts/setup.sh")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise CapabilityError("no mvn on PATH; install Maven (Debian: apt-get install maven) or run scripts/setup.sh")
    if say is not None:
        say(f"fetching {', '.join(artifacts)} with Maven into {target} (once)")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "lib").mkdir(parents=True)
    (partial / "pom.xml").write_text(_pom(artifacts))
    command = [mvn, "-B", "-q", "-f", str(partial / "pom.xml"), "dependency:copy-dependencies",
               f"-DoutputDirectory={partial / 'lib'}", "-DincludeScope=runtime"]
    if include:
        command.append(f"-DincludeArtifactIds={','.join(include)}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0 or not any((partial / "lib").glob("*.jar")):
        shutil.rmtree(partial, ignore_errors=True)
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line] or ["no jars copied"]
        raise CapabilityError(f"mvn could not fetch {', '.join(artifacts)}: {errors[0][:300]}; run scripts/setup.sh")
    shutil.rmtree(target, ignore_errors=True)
    (partial / "lib").replace(target)  # another installer may have won the race: both are complete copies
    shutil.rmtree(partial, ignore_errors=True)
    return target


def kafka_lib(install: bool = True, say: Any = None) -> Path:
    """The directory of the broker's jars (Apache Kafka's own and its dependencies)."""
    return maven_jars(f"kafka-{KAFKA_VERSION}", _BROKER_ARTIFACTS, install=install, say=say)


def spark_version() -> str:
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError as exc:
        raise CapabilityError("pyspark is not installed in this Python; run scripts/setup.sh") from exc


def spark_kafka_jars(install: bool = True, say: Any = None) -> list[Path]:
    """Spark's Kafka connector of the installed pyspark's exact version, with what it adds to Spark."""
    version = spark_version()
    directory = maven_jars(
        f"spark-sql-kafka-{version}", [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"],
        include=_SPARK_CONNECTOR_JARS, install=install, say=say,
    )
    return sorted(directory.glob("*.jar"))


def flink_kafka_jars(install: bool = True, say: Any = None) -> list[Path]:
    """Flink's Kafka connector (FLINK_KAFKA_CONNECTOR) and the jars it needs beyond Flink's own."""
    directory = maven_jars(
        f"flink-connector-kafka-{FLINK_KAFKA_CONNECTOR}",
        [f"org.apache.flink:flink-connector-kafka:{FLINK_KAFKA_CONNECTOR}"],
        include=_FLINK_CONNECTOR_JARS, install=install, say=say,
    )
    return sorted(directory.glob("*.jar"))


def tool_jar(lib: Path) -> Path:
    """YsbKafka.java compiled against the broker's kafka-clients (cached by source and version)."""
    clients = sorted(p.name for p in lib.glob("kafka-clients-*.jar"))
    return compile_jar([TOOL_SOURCE], str(lib / "*"), "ysb-kafka", clients)


_LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def java_argv(lib: Path, heap: str, main_class: str, *args: str, classpath: str = "", options: str = "") -> list[str]:
    """``java`` running ``main_class`` of ``lib``'s jars (or ``classpath``) with a heap of ``heap``."""
    return [str(java_home() / "bin" / "java"), f"-Xmx{heap}", *options.split(),
            "-cp", classpath or str(lib / "*"), main_class, *args]


def java_env() -> dict[str, str]:
    """Our environment without the variables Kafka's scripts or the JVM would read from it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "JAVA_TOOL_OPTIONS"))}
    env["JAVA_HOME"] = str(java_home())
    return env


@dataclass(frozen=True)
class KafkaTools:
    """YsbKafka.java's commands against the broker(s) at ``bootstrap`` (ours or any reachable one)."""

    bootstrap: str
    lib: Path

    def classpath(self) -> str:
        return f"{tool_jar(self.lib)}{os.pathsep}{self.lib / '*'}"

    def argv(self, command: str, *args: str, heap: str = "256m") -> list[str]:
        return java_argv(self.lib, heap, TOOL_CLASS, command, self.bootstrap, *args, classpath=self.classpath())

    def run(self, command: str, *args: str, timeout: float = 120.0) -> str:
        """One admin command; its stdout."""
        result = subprocess.run(
            self.argv(command, *args), capture_output=True, text=True, env=java_env(), timeout=timeout
        )
        if result.returncode != 0:
            tail = [line for line in result.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            raise KafkaError(f"{self.bootstrap}: Kafka {command} {' '.join(args)} failed: {tail[0][:300]}")
        return result.stdout

    def create_topic(self, topic: str, partitions: int) -> None:
        self.run("create-topic", topic_name(topic), str(partitions))

    def end_offsets(self, topic: str) -> int:
        """The sum of the topic's end offsets over its partitions: every record it ever took."""
        match = re.search(r"^END_OFFSETS (\d+)$", self.run("end-offsets", topic_name(topic)), re.MULTILINE)
        if match is None:
            raise KafkaError(f"{self.bootstrap}: no END_OFFSETS line for topic {topic}")
        return int(match.group(1))


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (what kafka-storage random-uuid prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


MAX_CONFIG_PATH = 1024  # known_spes.txt lines are at most 4096 characters (profiler/scope/spes.py)


def broker_config(bootstrap: str) -> str | None:
    """The properties file of the Kafka broker that listens on ``bootstrap`` on this host (the argument
    after kafka.Kafka on its command line), None when no local process listens there or it is no
    broker started that way. Its command line is read, nothing else."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0") or not port.isdigit():
        return None
    try:
        connections = psutil.net_connections("tcp")
    except psutil.Error:
        return None
    for connection in connections:
        if connection.status != psutil.CONN_LISTEN or connection.laddr.port != int(port) or not connection.pid:
            continue
        try:
            cmdline = psutil.Process(connection.pid).cmdline()
        except psutil.Error:
            return None
        if BROKER_MAIN_CLASS in cmdline[:-1]:
            return cmdline[cmdline.index(BROKER_MAIN_CLASS) + 1]
        return None
    return None


def broker_known_spes(config: str | None) -> str:
    """The known_spes.txt line that selects only the broker started with ``config`` (role broker:
    in the scope with --roles ...,broker), or nothing without one. The file's name comes from another
    process's command line: one that known_spes.txt could not hold on a line gives no line."""
    if not config or len(config) > MAX_CONFIG_PATH:
        return ""
    return f"kafka  broker  broker  {BROKER_MAIN_CLASS}  arg={literal_glob(config)}\n"


@dataclass
class LocalKafkaBroker(ScratchLifecycle):
    """Context manager: one Kafka broker and KRaft controller in one JVM on 127.0.0.1.

    Two free loopback ports (clients, controller); the log and data in ``tmp_dir`` (``log_dir``, or a
    temporary directory kept when start-up failed or KAFKA_LOCAL_KEEP_LOGS is set). The JVM runs in
    its own process group, SIGTERM'd when we die (processes.die_with_parent); ``stop()`` kills it.
    Each partition keeps at most ``retention_bytes`` (a long demo's topic must not fill the disk).
    """

    not_started: ClassVar[type[Exception]] = KafkaError

    log_dir: Path | None = None
    heap: str = "512m"
    java_options: str = DEFAULT_JAVA_OPTIONS
    start_timeout: float = _START_TIMEOUT_S
    retention_bytes: int = 512 * 1024 * 1024

    port: int = field(init=False, default=0)
    controller_port: int = field(init=False, default=0)
    process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _lib: Path | None = field(init=False, default=None)
    _keep_logs: bool = field(init=False, default=False)

    @property
    def lib(self) -> Path:
        if self._lib is None:
            self._lib = kafka_lib()
        return self._lib

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.tmp_dir / "kafka-broker.out"

    def server_properties(self) -> dict[str, str]:
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.tmp_dir / "data"),
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.bytes": str(self.retention_bytes),
            "log.segment.bytes": str(min(self.retention_bytes, 64 * 1024 * 1024)),
            "log.retention.check.interval.ms": "30000",
        }

    def _java(self, main_class: str, *args: str) -> list[str]:
        log4j = f"-Dlog4j2.configurationFile={self.tmp_dir / 'log4j2.properties'}"
        return java_argv(self.lib, self.heap, main_class, *args, options=f"{self.java_options} {log4j}")

    def tools(self) -> KafkaTools:
        return KafkaTools(self.bootstrap, self.lib)

    def start(self) -> LocalKafkaBroker:
        if self.process is not None:
            return self
        self._lib = self._lib or kafka_lib()  # before any scratch directory: a missing jar is one error line
        self.make_scratch(self.log_dir, "kafka-local-")
        self.port, self.controller_port = free_port(), free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        config = self.config_path
        config.write_text("".join(f"{key}={value}\n" for key, value in self.server_properties().items()))
        (self.tmp_dir / "log4j2.properties").write_text(_LOG4J2)
        atexit.register(self.stop)
        try:
            self._format(config)
            self.process = spawn_logged(
                self._java(BROKER_MAIN_CLASS, str(config)), self.log_path, java_env(), self.tmp_dir
            )
            poll_until(self._started, self.start_timeout, self._start_timed_out, self.check_running)
        except BaseException:
            self._keep_logs = True
            self.stop()
            raise
        return self

    def _format(self, config: Path) -> None:
        """The KRaft metadata log of a one-node quorum (kafka-storage.sh format --standalone)."""
        argv = self._java("kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config), "--standalone")
        with open(self.tmp_dir / "kafka-format.out", "wb") as log:
            result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=java_env(), timeout=120)
        if result.returncode != 0:
            raise KafkaError(
                f"{self.tmp_dir / 'kafka-format.out'}: formatting the broker's storage failed "
                f"(exit {result.returncode}): {log_tail(self.tmp_dir / 'kafka-format.out')}"
            )

    def _started(self) -> bool | None:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if "Kafka Server started" not in text:
            return None
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return None

    def _start_timed_out(self) -> KafkaError:
        return KafkaError(f"{self.log_path}: Kafka broker not started after {self.start_timeout:.0f} s; read the log")

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise KafkaError(
                f"{self.log_path}: the Kafka broker exited with code {self.process.returncode}: "
                f"{log_tail(self.log_path)}"
            )

    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    @property
    def config_path(self) -> Path:
        return self.tmp_dir / "server.properties"

    def stop(self) -> None:
        """Kill the broker's process group and wait for it. Idempotent."""
        if self.process is not None:
            process, self.process = self.process, None
            stop_all([process], [process.pid] if process.poll() is None else [], _STOP_GRACE_S)
        keep = self._keep_logs or bool(os.environ.get("KAFKA_LOCAL_KEEP_LOGS"))
        self.release_scratch(keep)


@dataclass(frozen=True)
class Produced:
    """One PRODUCED line of the producer: records the broker acknowledged by ``at`` (unix seconds)."""

    at: float
    acknowledged: int
    failed: int


_PRODUCED = re.compile(r"^PRODUCED (\d+) (\d+) failed (\d+)$", re.MULTILINE)


def parse_produced(text: str) -> list[Produced]:
    """The producer's PRODUCED lines, in order."""
    return [Produced(int(ms) / 1000.0, int(acked), int(failed)) for acked, ms, failed in _PRODUCED.findall(text)]


def acknowledged_at(lines: Sequence[Produced], moment: float) -> float | None:
    """Records acknowledged by ``moment`` (unix seconds), interpolated between the two reports around it
    (one a second); None when the reports do not cover it."""
    for before, after in zip(lines, lines[1:]):
        if before.at <= moment <= after.at:
            span = after.at - before.at
            share = (moment - before.at) / span if span > 0 else 1.0
            return before.acknowledged + share * (after.acknowledged - before.acknowledged)
    return None


def produced_between(lines: Sequence[Produced], start: float, end: float) -> int | None:
    """Records acknowledged between ``start`` and ``end`` (unix seconds), each end interpolated between
    the two reports around it; None when the reports do not cover both ends."""
    first, last = acknowledged_at(lines, start), acknowledged_at(lines, end)
    return None if first is None or last is None else round(last - first)


@dataclass
class YsbProducer(Lifecycle):
    """Context manager: YSB's ad events written into ``topic`` at ``rate`` per second by a JVM of its own
    (YsbKafka.java; a separate process, so its CPU is never an executor's), until stop()."""

    tools: KafkaTools
    topic: str
    rate: int
    log_dir: Path
    campaigns: int = 100
    ads_per_campaign: int = 10
    process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    log_path: Path = field(init=False, default=Path("kafka-producer.out"))  # set by start()

    def start(self) -> YsbProducer:
        if self.process is not None:
            return self
        if self.rate < 1 or self.campaigns < 1 or self.ads_per_campaign < 1:
            raise ConfigError(f"YsbProducer: rate {self.rate}, campaigns and ads per campaign must be at least 1")
        argv = self.tools.argv(
            "produce", topic_name(self.topic), str(self.rate), str(self.campaigns), str(self.ads_per_campaign)
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"kafka-producer-{self.topic}.out"
        self.process = spawn_logged(argv, self.log_path, java_env(), self.log_dir)
        atexit.register(self.stop)
        try:
            poll_until(lambda: True if self.reports() else None, 60.0, self._timed_out, self.check_running)
        except BaseException:
            self.stop()
            raise
        return self

    def _timed_out(self) -> KafkaError:
        return KafkaError(f"{self.log_path}: the producer acknowledged nothing in 60 s: {log_tail(self.log_path)}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def reports(self) -> list[Produced]:
        return parse_produced(self.output())

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise KafkaError(
                f"{self.log_path}: the Kafka producer exited with code {self.process.returncode}: "
                f"{log_tail(self.log_path)}"
            )

    def stop(self) -> None:
        """SIGTERM: the producer flushes, prints its last count and exits; killed after a grace period."""
        if self.process is not None:
            process, self.process = self.process, None
            stop_all([process], [process.pid] if process.poll() is None else [], _STOP_GRACE_S)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)

    def acknowledged(self) -> int:
        """Records the broker acknowledged so far (all of them once stopped)."""
        lines = self.reports()
        return lines[-1].acknowledged if lines else 0


class KafkaFeed(Lifecycle):
    """YSB's events through Kafka for one engine's demo: the broker (a local one unless ``bootstrap``
    names a running one), the topic (``partitions`` of them; it must not exist yet) and the producer
    at ``rate``; stop() stops the producer and the broker it started, each even when one failed."""

    def __init__(
        self, topic: str, partitions: int, rate: int, log_dir: Path, campaigns: int, ads_per_campaign: int,
        bootstrap: str = "",
    ) -> None:
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.log_dir, self.campaigns, self.ads_per_campaign = log_dir, campaigns, ads_per_campaign
        self._bootstrap = bootstrap
        self.broker: LocalKafkaBroker | None = None
        self.tools: KafkaTools | None = None
        self.producer: YsbProducer | None = None

    @classmethod
    def for_options(cls, options: YsbOptions, log_dir: Path) -> KafkaFeed | None:
        """The feed of a demo's ``--source kafka`` (not started; its logs in ``log_dir``/kafka); None
        for the generator."""
        if options.source != "kafka":
            return None
        return cls(
            options.kafka_topic, options.partitions, options.rate, log_dir / "kafka", options.campaigns,
            options.ads_per_campaign, bootstrap=options.kafka_bootstrap,
        )

    @property
    def bootstrap(self) -> str:
        if self.tools is None:
            raise KafkaError("KafkaFeed: not started; call start() or use it as a context manager")
        return self.tools.bootstrap

    def start(self, produce: bool = True) -> KafkaFeed:
        """The broker (or the given one's tools) and the topic; with ``produce`` also the producer,
        else start_producer() does (a query submitted between the two starts beside the producer)."""
        try:
            if self._bootstrap:
                self.tools = KafkaTools(self._bootstrap, kafka_lib())
            else:
                self.broker = LocalKafkaBroker(log_dir=self.log_dir).start()
                self.tools = self.broker.tools()
            self.tools.create_topic(self.topic, self.partitions)
            if produce:
                self._start_producer()
        except BaseException:
            self.stop()
            raise
        return self

    def start_producer(self) -> None:
        """The producer, after start(produce=False); stops everything when it fails."""
        try:
            self._start_producer()
        except BaseException:
            self.stop()
            raise

    def _start_producer(self) -> None:
        assert self.tools is not None
        self.producer = YsbProducer(
            self.tools, self.topic, self.rate, self.log_dir, self.campaigns, self.ads_per_campaign
        ).start()

    def restart_producer(self, rate: int) -> None:
        """The producer again at ``rate`` events/s (a campaign's next level), into the same topic."""
        if self.producer is not None:
            producer, self.producer = self.producer, None
            producer.stop()
        self.rate = rate
        self._start_producer()

    def describe(self) -> str:
        return f"Kafka {self.bootstrap}, topic {self.topic}"

    def known_spes(self) -> str:
        """The line that puts this feed's broker in a profile's scope with --roles ...,broker: the one
        it started, else the one listening on its bootstrap address on this host, if any."""
        if self.broker is not None:
            return broker_known_spes(str(self.broker.config_path))
        return broker_known_spes(broker_config(self.bootstrap))

    def check_running(self) -> None:
        if self.producer is not None:
            self.producer.check_running()
        if self.broker is not None:
            self.broker.check_running()

    def lag(self, read: int, at: float) -> float | None:
        """Records produced by ``at`` that a consumer which had read ``read`` records of the topic (the
        sum of its offsets; the topic is new) had not read yet; None without the producer's reports."""
        produced = acknowledged_at(self.producer.reports(), at) if self.producer is not None else None
        return None if produced is None else produced - read

    def produced_between(self, start: float, end: float) -> int | None:
        """Records the broker acknowledged to the producer in [start, end] (None: its reports do not
        cover both ends)."""
        return produced_between(self.producer.reports(), start, end) if self.producer is not None else None

    def stop(self) -> None:
        try:
            if self.producer is not None:
                producer, self.producer = self.producer, None
                producer.stop()
        finally:
            if self.broker is not None:
                broker, self.broker = self.broker, None
                broker.stop()
