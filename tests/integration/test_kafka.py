"""A real Kafka broker (KRaft, one JVM) for the whole module: the producer's acknowledged records are
what the topic's end offsets say, a profiled `coordinator demo --source kafka` on each engine (Spark
Structured Streaming, Spark Continuous Processing, Spark Real-time Mode, Flink) reads the topic, its
Kafka task holds Kafka consumer frames and it read what was produced, the broker counted as role broker
(--roles), and the broker stops leaving nothing behind. One broker serves every test (the demo uses it
with --kafka-bootstrap)."""

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
from typing import Any

import psutil
import pytest

from coordinator.workloads.kafka import BROKER_MAIN_CLASS, LocalKafkaBroker, YsbProducer

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


# Per engine: its Kafka reader's package (under which Kafka's consumer runs), the generator's frames
# that must not be there, a rate this 2-core machine, shared with other work, keeps up with, the
# window in seconds and the sampling frequency. spark-cp's is 10 s at 199 Hz: its consumer frames held
# 185 of 201 and 192 of 208 Kafka-task samples at 30 s and 99 Hz (10 s at 199 Hz expects ~130, as 20 s at
# 99 Hz did; the bound is a quarter), and its read-vs-produced tolerance is mostly two epochs of records
# (4,000) against measured gaps of 1,149 and 190 records, end effects that do not shrink with the window
# (1 % of 20,000 records adds 200). Flink's is 15 s: its count is the job's views times three, exact
# since the producer makes every third event a view (-0.002 % at 30 s, -0.06 % at 15 s; with random
# types it carried a ~0.46 % standard error and failed CI once at +1.29 %), spark-str's stays 30 s (its
# consumer share, 20/44 to 30/65, is 2-3 standard errors above the quarter at 30 s). spark-rtm's is 20 s
# too (its consumer frames held 118 of 127 Kafka-task samples in a 20 s window; read against produced +0.6 %).
ENGINE_KAFKA = {
    "spark-str": ("org.apache.spark.sql.kafka010", ("RateStreamMicroBatch", "RatePerMicroBatch"), 3000, 30, 99),
    "spark-cp": ("org.apache.spark.sql.kafka010.KafkaContinuous", ("RateStreamContinuous",), 2000, 10, 199),
    "spark-rtm": ("org.apache.spark.sql.kafka010.KafkaBatchPartitionReader", ("RateStream",), 2000, 20, 99),
    "flink": ("org.apache.flink.connector.kafka.source", ("DataGeneratorSource", "EventGenerator"), 3000, 15, 99),
}


# the engines whose demo also runs with --off-cpu (issue 50: blocked time per task in the report)
OFF_CPU_ENGINES = ("flink", "spark-str")


@pytest.mark.parametrize("spe", sorted(ENGINE_KAFKA))
def test_demo_reads_kafka_and_profiles_the_consumer(broker: LocalKafkaBroker, tmp_path: Path, spe: str) -> None:
    # GIVEN the module's broker; WHEN a 10-30 s profiled demo reads YSB from a topic of its own
    reader, generator_frames, rate, window_s, frequency = ENGINE_KAFKA[spe]
    topic = f"demo-{spe}-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "demo-kafka"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--spe", spe, "--source", "kafka",
         "--kafka-bootstrap", broker.bootstrap, "--kafka-topic", topic, "--duration", str(window_s), "--warmup", "10",
         "--rate", str(rate), "--frequency", str(frequency), "--campaigns", "100", "--out", str(out), "--quiet",
         "--roles", "workload,managing,broker", *(["--off-cpu"] if spe in OFF_CPU_ENGINES else [])],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    # THEN the Kafka task got samples, and little is unmatched
    rows = _summary_rows(out / "summary.csv")
    kafka_samples = int(rows["Kafka/Source"]["samples"])
    assert kafka_samples > 0, rows.keys()
    total = sum(int(r["samples"]) for r in rows.values())
    unmatched = int(rows["unmatched"]["samples"]) if "unmatched" in rows else 0
    assert unmatched < 0.05 * total, f"{unmatched} of {total} samples unmatched"
    # AND the Kafka task's stacks are Kafka's consumer under the engine's Kafka reader, not a generator
    folded = subprocess.run(
        [sys.executable, "-m", "coordinator", "export", str(out), "--format", "folded", "--task", "Kafka/Source",
         "--out", "-"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    consumer = sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()
                   if "org.apache.kafka.clients.consumer" in line and reader in line)
    # A quarter, not a half: at this test's 3,000 events/s and 10 s warm-up the reader's own per-batch work
    # (Spark's KafkaRecordToRowConverter generating its projection, still interpreted; FetchedDataPool) is
    # about half of the task, and Spark STR's consumer share measured 30 of 65 and 20 of 44 samples
    assert consumer >= kafka_samples / 4, folded[:3000]
    assert not any(frame in folded for frame in generator_frames), folded[:3000]
    # AND the records the engine read over a span of the window are those produced into the topic
    # over the same span, within 1 %, as the demo's line and events.json say
    done = re.search(r"demo: (\d+) .*; (\d+) window rows in the sink; (\d+) records produced into Kafka over "
                     r"the same span \(([-+]\d+\.\d) %\)", result.stdout)
    assert done, result.stdout
    (events_json,) = out.glob("hosts/*/events.json")
    counted = json.loads(events_json.read_text())
    produced, read = counted["produced"], counted["produced_read"]
    assert int(done.group(2)) > 0 and produced == int(done.group(3)) > 0, done.group(0)
    # Issue 33 asks for 1 %; Flink meets it here. Spark places its span's ends by times it records (a
    # micro-batch's trigger start, the driver's write of an epoch's offsets), not by when the end offsets
    # were taken: spark-cp is allowed its stated resolution, one epoch at each end (-1.9 % in one run at
    # load average 36), spark-str 5 % (-3.1 % in one run at load 36, with 50 s micro-batches).
    # spark-rtm places its span's ends by its batches' commits; a batch's tasks stop reading before the
    # driver writes its commit, so the records produced in between are counted at the one end and read at
    # the other: read - produced = rate x (the first end's lag - the last end's), which the demo states as its
    # count's uncertainty (the rate times the median no-read time of a batch cycle, x sqrt 2): +0.6 % in one
    # run, +0.99 % (391 records at 2,000/s, 0.2 s) in another.
    tolerance = {
        "flink": 0.01 * produced, "spark-cp": 0.01 * produced + 2 * rate * 1.0, "spark-str": 0.05 * produced,
        "spark-rtm": 0.01 * produced + (counted.get("uncertainty") or 0.0),
    }
    assert abs(read - produced) <= tolerance[spe], (done.group(0), counted["produced_detail"])
    assert counted["count"] is not None
    _check_window_latency(result.stdout, counted, spe, window_s)
    if spe == "spark-rtm":
        _check_real_time_mode(out, rows, counted, rate)
    if spe in OFF_CPU_ENGINES:
        _check_blocked_time_per_task(out, rows, spe, window_s)
    run = json.loads((out / "run.json").read_text())
    assert run["labels"]["source"] == "kafka"
    # AND the broker it was given, and only that one, is counted as role broker with its cost per event
    with open(out / "summary.csv", newline="") as handle:
        brokers = [r for r in csv.DictReader(handle) if r["role"] == "broker"]
    assert [(int(r["pid"]), r["engine"]) for r in brokers] == [(broker.pid(), "kafka")], brokers
    assert float(brokers[0]["cpu_seconds"]) > 0 and float(brokers[0]["cycles_per_event"]) > 0, brokers
    # AND the demo stopped its producer and engine, but not the broker it was given
    assert _processes_mentioning(topic) == []
    assert broker.pid() is not None


# The engines whose demo must report a latency per window here: their windows (15 s, 20 s) hold at least one
# 10 s window's end; spark-cp's 10 s window may hold none (a sampling window a few ms short), spark-str's
# 30 s window three, but the test asks it only to be plausible when present.
LATENCY_ENGINES = ("flink", "spark-rtm")


def _check_window_latency(stdout: str, counted: dict[str, Any], spe: str, window_s: int) -> None:
    """Issue 53: YSB's latency per window (a window's last update in Redis minus its end) of the windows that
    closed in the profiled window, in the demo's line and events.json, and plausible."""
    line = re.search(r"latency per 10 s window median (-?[\d.]+) s, p95 (-?[\d.]+) s, max (-?[\d.]+) s "
                     r"\(min (-?[\d.]+) s, (\d+) windows\)", stdout)
    if spe not in LATENCY_ENGINES and line is None:
        return
    assert line, stdout[-3000:]
    windows = counted["latency_windows"]
    # 100 campaigns, each with views in every 10 s window at these rates; one to three window ends inside
    assert windows == int(line.group(5)) and 100 <= windows <= 100 * (window_s // 10 + 1), (line.group(0), windows)
    median, p95, top, bottom = (counted[f"latency_{name}_ms"] / 1000 for name in ("median", "p95", "max", "min"))
    assert f"{median:.2f}" == line.group(1) and f"{top:.2f}" == line.group(3), (line.group(0), counted)
    # a window's last update comes after its end (negative only for a campaign whose last view in the window was
    # written before the window's end, by a batch that ended within its last ~0.15 s) and well within a minute
    assert 0 <= median <= p95 <= top < 60 and bottom > -2, (line.group(0), counted["latency_detail"])
    if spe == "flink":  # a window fires once the watermark, 1 s behind the newest event, passes its end
        assert bottom >= 0.9, (line.group(0), counted["latency_detail"])


def _check_blocked_time_per_task(out: Path, rows: dict[str, dict[str, str]], spe: str, window_s: int) -> None:
    """Issue 50: the report splits blocked time by the profile's tasks (the off-CPU rule), not into one Wait."""
    blocked = {task: float(r["offcpu_seconds"] or 0) for task, r in rows.items() if task != "*"}
    total = sum(blocked.values())
    assert total > 0 and blocked.get("Wait", 0) < 0.5 * total, blocked
    assert sum(1 for seconds in blocked.values() if seconds >= 1.0) >= 4 and blocked["Kafka/Source"] > 0, blocked
    page = (out / "report" / "index.html").read_text(encoding="utf-8")
    assert "where it waited" in page
    if spe == "flink":
        # the source threads wait for the broker in Kafka's poll (42 s of a 20 s window in docs/offcpu.md's run);
        # the timer threads named after the operator chain no longer decide Deserialize or Sink
        assert blocked["Kafka/Source"] >= 0.5 * window_s and "ConsumerNetworkClient::poll" in page, blocked
        assert blocked["Deserialize"] < 1.0 and blocked["Sink"] < 0.25 * window_s, blocked


def _check_real_time_mode(out: Path, rows: dict[str, dict[str, str]], counted: dict[str, Any], rate: int) -> None:
    """Spark Real-time Mode (issue 53): its scope, how much of it the profile names, and its event count."""
    # its executors are the workload, its driver (the app run with --realtime) managing
    (capture,) = out.glob("hosts/*")
    scope = json.loads((capture / "scope.json").read_text())
    executors = [p for p in scope if p["kind"] == "executor"]
    assert len(executors) == 2 and all(p["role"] == "workload" and p["engine"] == "spark" for p in executors), scope
    drivers = [p for p in scope if p["kind"] == "driver"]
    assert [p["role"] for p in drivers] == ["managing"] and "--realtime" in drivers[0]["cmdline"], drivers
    # the profile names its threads: at most 5 % unmatched (checked above), at most 10 % Other
    total = sum(int(r["samples"]) for r in rows.values())
    assert int(rows["Other"]["samples"]) <= 0.10 * total, f"{rows['Other']['samples']} of {total} samples Other"
    assert all(int(rows[task]["samples"]) > 0 for task in ("Deserialize", "Filter+Projection+Join", "Sink")), rows
    # the window's events are the offsets log's, prorated from its 5 s batches: the producer's rate times the
    # window within 1 % plus the stated uncertainty (where the window's ends fall against the batch gaps)
    assert counted["source"] == "spark-offsets-log" and counted["uncertainty"] is not None, counted
    window = counted["window_end"] - counted["window_start"]
    assert abs(counted["count"] - rate * window) <= 0.01 * rate * window + counted["uncertainty"], counted


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
