"""A real Kafka broker (KRaft, one JVM) for the whole module: the producer's acknowledged records are
what the topic's end offsets say, a profiled `coordinator demo --source kafka` on Spark Structured
Streaming reads the topic and its Kafka task holds Kafka consumer frames, and the broker stops
leaving nothing behind. One broker serves every test (the demo uses it with --kafka-bootstrap)."""

from __future__ import annotations

import csv
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from coordinator.workloads.kafka import BROKER_MAIN_CLASS, LocalKafkaBroker, YsbProducer
from coordinator.workloads.ysb.spark import batches_between, parse_progress

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaBroker]:
    with LocalKafkaBroker(log_dir=tmp_path_factory.mktemp("kafka")) as started:
        yield started


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append((proc.pid, " ".join(proc.info["cmdline"])[:160]))
        except psutil.Error:
            continue
    return found


def test_producer_count_is_the_topics_end_offsets(broker: LocalKafkaBroker, tmp_path: Path) -> None:
    # GIVEN a new topic of three partitions
    topic = f"count-{uuid.uuid4().hex[:8]}"
    tools = broker.tools()
    tools.create_topic(topic, 3)
    assert tools.end_offsets(topic) == 0
    # WHEN the YSB producer writes into it at 2000 events/s for about 3 s and stops
    with YsbProducer(tools, topic, 2000, tmp_path, campaigns=10) as producer:
        time.sleep(3)
        producer.check_running()
    # THEN every record it counted as acknowledged is in the topic, and only those
    last = producer.reports()[-1]
    assert last.failed == 0, producer.output()
    assert "STOPPED" in producer.output(), "the producer did not flush and stop on SIGTERM"
    assert 2000 <= last.acknowledged == tools.end_offsets(topic)
    assert _processes_mentioning(topic) == []


def _summary_rows(summary_csv: Path) -> dict[str, dict[str, str]]:
    with open(summary_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["pid"] == "*" and r["host"] == "*" and r["role"] == "workload"]
    return {r["task"]: r for r in rows}


def test_demo_reads_kafka_and_profiles_the_consumer(broker: LocalKafkaBroker, tmp_path: Path) -> None:
    # GIVEN the module's broker; WHEN a 30 s profiled spark-str demo reads YSB from a topic of its own
    topic = f"demo-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "demo-kafka"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--source", "kafka", "--kafka-bootstrap", broker.bootstrap,
         "--kafka-topic", topic, "--duration", "30", "--warmup", "10", "--rate", "3000", "--campaigns", "100",
         "--out", str(out), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    # THEN the Kafka task got samples, and little is unmatched
    rows = _summary_rows(out / "summary.csv")
    kafka_samples = int(rows["Kafka/Source"]["samples"])
    assert kafka_samples > 0, rows.keys()
    total = sum(int(r["samples"]) for r in rows.values())
    unmatched = int(rows["unmatched"]["samples"]) if "unmatched" in rows else 0
    assert unmatched < 0.05 * total, f"{unmatched} of {total} samples unmatched"
    # AND the Kafka task's stacks are Kafka's consumer under Spark's Kafka reader, not a generator
    folded = subprocess.run(
        [sys.executable, "-m", "coordinator", "export", str(out), "--format", "folded", "--task", "Kafka/Source",
         "--out", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    consumer = sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()
                   if "org.apache.kafka.clients.consumer" in line and "org.apache.spark.sql.kafka010" in line)
    assert consumer > kafka_samples / 2, folded[:3000]
    assert "RateStreamMicroBatch" not in folded and "RatePerMicroBatch" not in folded
    # AND the query processed about what the producer wrote in the window, and wrote windows
    done = re.search(
        r"demo: (\d+) micro-batches, (\d+) events .* (\d+) records produced into Kafka in the window; "
        r"(\d+) window rows in the sink", result.stdout,
    )
    assert done, result.stdout
    batches, events, produced, windows = (int(g) for g in done.groups())
    assert batches >= 1 and windows > 0 and produced > 0, done.group(0)
    # The engine counts whole micro-batches at each end of the window: that is its resolution (on a
    # machine shared with other work a batch can take most of the window).
    if batches >= 3:
        (app_out,) = (out / "workload").rglob("app*-ysb.out")
        (events_json,) = out.glob("hosts/*/events.json")
        window = json.loads(events_json.read_text())
        inside = batches_between(parse_progress(app_out.read_text()), window["window_start"], window["window_end"])
        largest = max((b.input_rows for b in inside), default=events)
        assert abs(events - produced) <= 0.05 * produced + 2 * largest, (done.group(0), largest)
    run = json.loads((out / "run.json").read_text())
    assert run["labels"]["source"] == "kafka"
    # AND the demo stopped its producer and Spark, but not the broker it was given
    assert _processes_mentioning(topic) == []
    assert broker.pid() is not None


def test_broker_stops_leaving_nothing(broker: LocalKafkaBroker) -> None:
    # GIVEN the module's running broker (the last test of the module); WHEN it is stopped
    pid, port, data = broker.pid(), broker.port, broker.tmp_dir / "data"
    assert pid is not None and psutil.Process(pid).cmdline()[-2] == BROKER_MAIN_CLASS
    assert data.is_dir()
    broker.stop()
    # THEN its JVM is gone, nothing listens on its port, and a second stop is harmless
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert _processes_mentioning(str(data)) == []
    broker.stop()
    assert broker.pid() is None
