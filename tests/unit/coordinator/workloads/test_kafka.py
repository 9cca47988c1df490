"""The Kafka pieces without a broker: the producer's report lines, the window's produced records, topic
names, the broker's configuration, the Maven pom, and the demo's --source checks."""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.commands._demo_counts import produced_clause
from coordinator.commands.demo import bootstrap_servers
from coordinator.workloads.kafka import (
    KafkaFeed,
    KafkaTools,
    LocalKafkaBroker,
    Produced,
    YsbProducer,
    _pom,
    broker_config,
    broker_known_spes,
    parse_produced,
    produced_between,
    topic_name,
)
from coordinator.workloads.processes import free_port
from coordinator.workloads.ysb.engines import SourceCount, produced_over
from coordinator.workloads.ysb.javabuild import bundle_jars
from coordinator.workloads.ysb.spark import (
    BatchProgress,
    YsbOptions,
    batches_finished_between,
    check_source,
    kafka_read_span,
)
from profiler.errors import ConfigError
from profiler.scope.spes import classify, parse_known_spes


def test_parse_produced_reads_only_whole_report_lines() -> None:
    text = "\n".join(
        [
            "PRODUCING ysb 1000",
            "PRODUCED 10 1700000000000 failed 0",
            "[2026] WARN something PRODUCED 5 1 failed 0",
            "PRODUCED x 1700000001000 failed 0",
            "PRODUCED 1010 1700000001000 failed 2",
            "PRODUCED 2010 1700000002000 failed 2",
        ]
    )
    assert parse_produced(text) == [
        Produced(1700000000.0, 10, 0),
        Produced(1700000001.0, 1010, 2),
        Produced(1700000002.0, 2010, 2),
    ]


def test_produced_between_interpolates_each_end() -> None:
    lines = [Produced(100.0, 0, 0), Produced(101.0, 1000, 0), Produced(102.0, 3000, 0)]
    assert produced_between(lines, 100.0, 102.0) == 3000
    assert produced_between(lines, 100.5, 101.5) == 1500  # 500 .. 2000
    assert produced_between(lines, 99.0, 101.0) is None  # the start is before the first report
    assert produced_between(lines, 100.0, 102.5) is None
    assert produced_between([], 1.0, 2.0) is None


@pytest.mark.parametrize("name", ["ysb", "ysb-events.v2_x", "a" * 200])
def test_topic_names_kafka_accepts(name: str) -> None:
    assert topic_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "ysb events", "ysb/x", "a" * 201, "ysb\n", "ü"])
def test_topic_names_kafka_refuses_are_one_error(name: str) -> None:
    with pytest.raises(ConfigError, match="not a Kafka topic name"):
        topic_name(name)


def test_check_source_allows_both_sources_on_every_engine_but_real_time_mode() -> None:
    assert YsbOptions().source == "generator"
    for spe in ("spark-str", "spark-cp", "flink"):
        assert check_source("generator", spe) == "generator"
        assert check_source("kafka", spe) == "kafka"
    with pytest.raises(ConfigError, match="unknown source"):
        check_source("pulsar", "spark-str")
    # Spark's rate sources do not support Real-time Mode (INPUT_STREAM_NOT_SUPPORTED)
    assert check_source("kafka", "spark-rtm") == "kafka"
    with pytest.raises(ConfigError, match="add --source kafka"):
        check_source("generator", "spark-rtm")


def test_broker_config_is_one_kraft_node_on_loopback(tmp_path: Path) -> None:
    broker = LocalKafkaBroker(log_dir=tmp_path, retention_bytes=1 << 20)
    broker._tmp, broker.port, broker.controller_port = tmp_path, 19092, 19093
    config = broker.server_properties()
    assert config["process.roles"] == "broker,controller"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert config["log.dirs"] == str(tmp_path / "data")
    assert config["auto.create.topics.enable"] == "false"
    assert int(config["log.segment.bytes"]) <= int(config["log.retention.bytes"]) == 1 << 20
    assert broker.bootstrap == "127.0.0.1:19092"


def test_pom_names_each_artifact() -> None:
    root = ET.fromstring(_pom(["org.apache.kafka:kafka_2.13:4.1.1", "g:a:1"]))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    found = [
        tuple(d.findtext(f"m:{tag}", namespaces=ns) for tag in ("groupId", "artifactId", "version"))
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    ]
    assert found == [("org.apache.kafka", "kafka_2.13", "4.1.1"), ("g", "a", "1")]


def test_demo_parses_source_and_topic_before_starting(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for argv in (["--source", "pulsar"], ["--source", "kafka", "--spe", "flink", "--kafka-topic", "ysb events"]):
        with pytest.raises(SystemExit):
            main(["demo", *argv, "--out", str(out)])
        assert not out.exists()  # nothing was made


def test_bootstrap_servers_are_host_port_lists() -> None:
    assert bootstrap_servers("127.0.0.1:9092") == "127.0.0.1:9092"
    assert bootstrap_servers("a:1, b:65535") == "a:1,b:65535"
    assert bootstrap_servers("[::1]:9092") == "[::1]:9092"
    for bad in ("", "host", ":9092", "host:", "host:0", "host:65536", "host:x", "a b:1", "a:1,"):
        with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
            bootstrap_servers(bad)


def test_demo_refuses_a_broker_without_the_kafka_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--kafka-bootstrap", "127.0.0.1:9092", "--out", str(tmp_path / "run")])
    assert code == ConfigError.exit_code
    assert "only with --source kafka" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_ready_reading_kafka_waits_for_the_backlog_to_drain() -> None:
    from coordinator.workloads.ysb.app import is_ready

    assert not is_ready(0, 10_000, None) and is_ready(1, 10_000, None)  # the generator: the first rows
    kafka = ("127.0.0.1:9092", "ysb")
    assert not is_ready(0, 10_000, kafka)
    assert not is_ready(450_000, 10_000, kafka)  # the events of the first batch's compile time
    assert is_ready(12_000, 10_000, kafka) and is_ready(30_000, 10_000, kafka)


def _progress(batch: int, began: float, rows: int, trigger_ms: int) -> BatchProgress:
    stamp = datetime.fromtimestamp(began, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return BatchProgress(batch, stamp, rows, 0.0, 0.0, trigger_ms)


def test_micro_batches_of_the_window_read_what_was_produced_from_their_predecessors_start() -> None:
    # GIVEN batches 4..8 beginning every 2 s from t=100, each taking 1.5 s (batch 5 has no timestamp)
    batches = [_progress(b, 100.0 + 2 * (b - 4), 1000, 1500) for b in range(4, 9)]
    # WHEN the window is [103, 107.6]: batches 5 (finished 103.5), 6 (105.5) and 7 (107.5) finished in it
    inside = batches_finished_between(batches, 103.0, 107.6)
    # THEN they are placed by their finish time, and their records were produced from batch 4's start
    # (the end offsets batch 5 found) to batch 7's start
    assert [b.batch for b in inside] == [5, 6, 7]
    assert kafka_read_span(batches, inside) == (100.0, 106.0)
    assert kafka_read_span(batches, inside[1:]) == (102.0, 106.0)
    assert kafka_read_span(batches[1:], inside) is None  # batch 4's start is unknown
    assert kafka_read_span(batches, []) is None


def _feed_with_reports(tmp_path: Path, text: str) -> KafkaFeed:
    feed = KafkaFeed("ysb", 2, 1000, tmp_path, 10, 10, bootstrap="127.0.0.1:9092")
    producer = YsbProducer(KafkaTools("127.0.0.1:9092", tmp_path), "ysb", 1000, tmp_path)
    producer.log_path = tmp_path / "producer.out"
    producer.log_path.write_text(text)
    feed.producer = producer
    return feed


def test_produced_over_a_span_interpolates_the_producers_reports(tmp_path: Path) -> None:
    feed = _feed_with_reports(tmp_path, "PRODUCED 0 100000 failed 0\nPRODUCED 1000 101000 failed 0\n"
                                        "PRODUCED 3000 102000 failed 0\n")
    produced = produced_over(feed, (100.5, 101.5), "a test span")
    assert produced is not None and produced.records == 2000 - 500  # 1000 + half of 2000, less half of 1000
    assert (produced.span_start, produced.span_end) == (100.5, 101.5) and "a test span" in produced.detail
    assert produced_over(feed, (99.0, 101.0), "") is None  # the reports do not cover the start
    assert produced_over(feed, None, "") is None
    assert produced_over(None, (100.5, 101.5), "") is None  # the generator: nothing produced


def test_demo_line_compares_the_engines_count_with_the_records_produced() -> None:
    produced = SourceCount(200_000, 1.0, 2.0, "")
    assert produced_clause(201_000, produced) == "; 200000 records produced into Kafka over the same span (+0.5 %)"
    assert produced_clause(None, produced) == "; 200000 records produced into Kafka over the same span"
    assert produced_clause(5, None) == ""


def test_a_bundled_jar_carries_its_classes_and_every_jars_services(tmp_path: Path) -> None:
    # GIVEN two library jars with a class each, a shared service file, a signature and a manifest
    libs = []
    for name in ("a", "b"):
        jar = tmp_path / f"{name}.jar"
        with zipfile.ZipFile(jar, "w") as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            archive.writestr(f"META-INF/{name.upper()}.SF", "signed")
            archive.writestr("META-INF/services/x.Factory", f"{name}.Impl\n")
            archive.writestr(f"{name}/Impl.class", name)
            archive.writestr("shared/Same.class", name)
            archive.writestr("module-info.class", name)
        libs.append(jar)
    # WHEN they are bundled into a jar
    target = tmp_path / "uber.jar"
    with zipfile.ZipFile(target, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
        bundle_jars(archive, libs)
    # THEN it has both classes once (the first jar's copy wins), both providers, and no foreign metadata
    with zipfile.ZipFile(target) as archive:
        names = archive.namelist()
        assert sorted(names) == sorted(
            ["META-INF/MANIFEST.MF", "a/Impl.class", "b/Impl.class", "shared/Same.class", "META-INF/services/x.Factory"]
        )
        assert archive.read("shared/Same.class") == b"a"
        assert archive.read("META-INF/services/x.Factory") == b"a.Impl\nb.Impl\n"


def test_a_brokers_known_spes_line_selects_it_by_its_properties_file(tmp_path: Path) -> None:
    # GIVEN a process listening on loopback whose command line is a broker's (kafka.Kafka FILE)
    config = tmp_path / "kafka [1]" / "server.properties"
    script = (
        "import socket,sys,time\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script, "kafka.Kafka", str(config)], stdout=subprocess.PIPE,
                          text=True) as listener:
        try:
            assert listener.stdout is not None
            port = int(listener.stdout.readline())
            # WHEN the demo asks which broker listens on its bootstrap address
            found = broker_config(f"127.0.0.1:{port},127.0.0.1:1")
            other = broker_config(f"127.0.0.1:{free_port()}")
        finally:
            listener.kill()
    # THEN it is that file; a free port or a remote host has none and gives no line
    assert found == str(config)
    assert other is None and broker_config("kafka.example.com:9092") is None and broker_known_spes(None) == ""
    assert broker_known_spes("") == "" and broker_known_spes("/" + "x" * 5000) == ""
    # AND the line parses as role broker and picks that broker, not another one
    (kind,) = parse_known_spes(broker_known_spes(found), "demo-known-spes")
    assert (kind.engine, kind.role) == ("kafka", "broker")
    assert classify(("java", "-cp", "libs/*", "kafka.Kafka", str(config)), (kind,)) == kind
    assert classify(("java", "-cp", "libs/*", "kafka.Kafka", str(tmp_path / "server.properties")), (kind,)) is None


def test_demo_and_profile_take_roles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("demo", "profile"):
        with pytest.raises(SystemExit):
            main([command, "--roles", "workload,brokers", "--duration", "1", "--out", str(tmp_path / "run")])
        assert "unknown role 'brokers'" in capsys.readouterr().err
        assert not (tmp_path / "run").exists()
