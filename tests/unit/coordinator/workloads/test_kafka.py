"""The Kafka pieces without a broker: the producer's report lines, the window's produced records, topic
names, the broker's configuration, the Maven pom, and the demo's --source checks."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.commands.demo import bootstrap_servers
from coordinator.workloads.kafka import (
    LocalKafkaBroker,
    Produced,
    _pom,
    parse_produced,
    produced_between,
    topic_name,
)
from coordinator.workloads.ysb.spark import YsbOptions, check_source
from profiler.errors import ConfigError


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


def test_check_source_allows_kafka_only_where_an_engine_reads_it() -> None:
    assert YsbOptions().source == "generator"
    for spe in ("spark-str", "spark-cp", "flink"):
        assert check_source("generator", spe) == "generator"
    assert check_source("kafka", "spark-str") == "kafka"
    for spe in ("spark-cp", "flink"):
        with pytest.raises(ConfigError, match=f"--source kafka --spe {spe}"):
            check_source("kafka", spe)
    with pytest.raises(ConfigError, match="unknown source"):
        check_source("pulsar", "spark-str")


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


def test_demo_parses_source_and_refuses_kafka_on_other_engines_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(["demo", "--source", "kafka", "--spe", "flink", "--out", str(out)])
    assert code == ConfigError.exit_code
    assert "--source kafka --spe flink" in capsys.readouterr().err
    assert not out.exists()  # nothing was made
    with pytest.raises(SystemExit):
        main(["demo", "--source", "pulsar"])


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
