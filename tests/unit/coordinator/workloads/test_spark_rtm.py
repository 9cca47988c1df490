"""`coordinator demo --spe spark-rtm`: YSB on Spark's Real-time Mode, its trigger, query, app arguments
and event count (docs/demo.md, "Spark Real-time Mode")."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from coordinator.workloads.ysb import spark as ysb_spark
from coordinator.workloads.ysb.engines import ENGINES, REALTIME_MIN_BATCH_S, SparkRealTimeYsb
from coordinator.workloads.ysb.pipeline import SinkSpec, realtime_trigger, start_realtime_query
from coordinator.workloads.ysb.spark import YsbOptions, YsbRun
from profiler.errors import ConfigError


def test_spark_rtm_is_an_engine_with_its_own_profile_and_label() -> None:
    assert ENGINES["spark-rtm"] is SparkRealTimeYsb
    assert SparkRealTimeYsb.spe == "spark-real-time-mode"
    assert SparkRealTimeYsb.profile == "application_profiles/spark_realtime.txt"
    assert (Path(__file__).resolve().parents[4] / SparkRealTimeYsb.profile).is_file()


@pytest.mark.parametrize(("seconds", "text"), [(5.0, "5 seconds"), (30, "30 seconds"), (5.5, "5500 milliseconds")])
def test_the_real_time_trigger_is_whole_seconds_or_milliseconds(seconds: float, text: str) -> None:
    assert realtime_trigger(seconds) == text


def test_the_engine_runs_batches_no_shorter_than_spark_allows(tmp_path: Path) -> None:
    # Spark refuses a realTime trigger under spark.sql.streaming.realTimeMode.minBatchDuration (5,000 ms)
    short = SparkRealTimeYsb(YsbOptions(source="kafka", trigger_seconds=1.0), tmp_path)
    assert short.options.trigger_seconds == REALTIME_MIN_BATCH_S == 5.0
    assert SparkRealTimeYsb(YsbOptions(source="kafka", trigger_seconds=20.0), tmp_path).options.trigger_seconds == 20.0


class _Writer:
    """DataStreamWriter's chain as start_realtime_query uses it, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._jwrite = self

    def option(self, key: str, value: str) -> _Writer:
        self.calls.append(("option", (key, value)))
        return self

    def queryName(self, name: str) -> _Writer:
        self.calls.append(("queryName", name))
        return self

    def outputMode(self, mode: str) -> _Writer:
        self.calls.append(("outputMode", mode))
        return self

    def trigger(self, **kwargs: str) -> _Writer:
        self.calls.append(("trigger", kwargs))
        return self

    def foreach(self, writer: object) -> _Writer:
        self.calls.append(("foreach", writer))
        return self

    def start(self) -> str:
        self.calls.append(("start", None))
        return "query"


class _SinkClass:
    made: list[tuple[object, ...]] = []

    @classmethod
    def windowForeachWriter(cls, *args: object) -> str:
        cls.made.append(args)
        return "jvm-writer"


def test_the_real_time_query_writes_update_mode_into_the_jvm_window_writer() -> None:
    # GIVEN a session whose JVM holds the sink jar's class, and the YSB rows
    writer = _Writer()
    rows = type("Rows", (), {"writeStream": writer})()
    jvm = type("Jvm", (), {"ysb.RedisSink": _SinkClass})()
    spark = type("Spark", (), {"sparkContext": type("Sc", (), {"_jvm": jvm})()})()
    # WHEN the real-time query starts with 5 s batches
    query = start_realtime_query(spark, rows, SinkSpec("redis", redis_port=6390), "/ck", 5.0)  # type: ignore[arg-type]
    # THEN update mode (the only one RTM takes), the realTime trigger, and the window sink's JVM foreach writer
    assert query == "query"
    assert ("outputMode", "update") in writer.calls and ("trigger", {"realTime": "5 seconds"}) in writer.calls
    assert ("foreach", "jvm-writer") in writer.calls and writer.calls[-1] == ("start", None)
    assert ("option", ("checkpointLocation", "/ck")) in writer.calls
    assert _SinkClass.made[-1] == ("127.0.0.1", 6390, "ysb:", 10_000)
    with pytest.raises(ValueError, match="Redis"):
        start_realtime_query(spark, rows, SinkSpec("file", path="/out"), "/ck", 5.0)  # type: ignore[arg-type]


def test_the_app_takes_one_trigger_mode() -> None:
    from coordinator.workloads.ysb.app import main

    with pytest.raises(SystemExit):
        main(["--continuous", "--realtime", "--checkpoint", "/ck", "--redis-port", "6379"])


class _Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_dir = tmp_path
        self.spark_home = tmp_path
        self.submitted: list[tuple[list[str], dict[str, str]]] = []

    def submit(self, app: Path, args: list[str], conf: dict[str, str], name: str, env: dict[str, str]) -> str:
        self.submitted.append((args, conf))
        return "app"

    def stop_app(self, app: object) -> None:
        pass


class _Redis:
    port = 6391

    def start(self) -> _Redis:
        return self

    def stop(self) -> None:
        pass


def test_the_real_time_run_submits_realtime_with_a_long_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the sink's redis-server, its jar and the Kafka jars stood in for
    monkeypatch.setattr(ysb_spark, "RedisServer", _Redis)
    monkeypatch.setattr(ysb_spark, "store_ad_campaigns", lambda redis, mapping: None)
    monkeypatch.setattr(ysb_spark, "build_sink_jar", lambda spark_home: tmp_path / "sink.jar")
    monkeypatch.setattr("coordinator.workloads.kafka.spark_kafka_jars", lambda: [tmp_path / "kafka.jar"])
    cluster = _Cluster(tmp_path)
    options = YsbOptions(source="kafka", trigger_seconds=5.0, sink="redis")
    # WHEN a real-time run starts reading a broker
    run = YsbRun(cluster, options, realtime=True, kafka_bootstrap="127.0.0.1:9092")  # type: ignore[arg-type]
    run.start()
    try:
        ((args, conf),) = cluster.submitted
        # THEN the app runs Real-time Mode on Kafka with 5 s batches, never continuous
        assert "--realtime" in args and "--continuous" not in args
        assert args[args.index("--trigger") + 1] == "5.0"
        assert args[args.index("--kafka-bootstrap") + 1] == "127.0.0.1:9092"
        # AND keeps its batches' offsets for hours (the window's events are counted from them)
        assert int(conf["spark.sql.streaming.minBatchesToRetain"]) >= 2 * 1800 // 5
        assert "executor-log4j2.properties" in conf["spark.executor.extraJavaOptions"]
    finally:
        run.stop()


def test_the_real_time_run_refuses_the_file_sink(tmp_path: Path) -> None:
    cluster = _Cluster(tmp_path)
    with pytest.raises(ConfigError, match="Real-time Mode"):
        YsbRun(cluster, YsbOptions(source="kafka", sink="file"), realtime=True).start()  # type: ignore[arg-type]
    assert cluster.submitted == []


def _checkpoint(tmp_path: Path, batches: list[tuple[int, float, int]]) -> Path:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch, at, records in batches:
        path = checkpoint / "offsets" / str(batch)
        path.write_text(f'v1\n{{}}\n{json.dumps({"ysb": {"0": records // 2, "1": records - records // 2}})}\n')
        os.utime(path, (at, at))
        (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")
    return checkpoint


def test_the_windows_events_are_the_kafka_records_of_its_batches_prorated(tmp_path: Path) -> None:
    # GIVEN a real-time query whose 5 s batches (6 s cycles: 1 s without a reading task) committed at
    # t = 100, 106, 112, 118 having read 10k, 22k, 34k, 46k records: 2,000 records/s over whole cycles
    engine = SparkRealTimeYsb(YsbOptions(source="kafka"), tmp_path)
    run = YsbRun(_Cluster(tmp_path), engine.options, realtime=True)  # type: ignore[arg-type]
    run._work = tmp_path
    _checkpoint(tmp_path, [(0, 100.0, 10_000), (1, 106.0, 22_000), (2, 112.0, 34_000), (3, 118.0, 46_000)])
    engine.ysb = run
    # WHEN the 16 s window is (102, 118]: batches 1..3 ended in it, 36k records from t = 100 to 118
    counted = engine.count_events(102.0, 118.0)
    # THEN its events are their rate times the window, 32k, not 36k (whole batches) nor the REST API's
    assert counted is not None and counted.count == 32_000
    assert "3 batches" in counted.detail and "2000 records/s" in counted.detail
    # AND the uncertainty is the rate times the measured 1 s without reading, at both ends
    assert counted.uncertainty == pytest.approx(2000 * 1.0 * 2**0.5)
    assert engine.count_events(90.0, 118.0) is None  # no batch before the window
    run._work = None


def test_a_closer_count_from_the_query_replaces_the_profilers() -> None:
    from coordinator.commands._demo_counts import _closer
    from profiler.capture.format import EventCount

    rest = EventCount(52_812, "spark-rest:x", uncertainty=13_203.0)
    offsets = EventCount(40_000, "spark-offsets-log", uncertainty=2_800.0)
    assert _closer(offsets, rest) and not _closer(rest, offsets)
    assert _closer(offsets, EventCount(None, "spark-rest:x"))  # the profiler could not count (CP)
    assert not _closer(EventCount(40_000, "spark-offsets-log"), rest)  # no stated uncertainty: keep the profiler's


REPO = Path(__file__).resolve().parents[4]
RTM_STACKS = REPO / "tests" / "data" / "kafka" / "spark_rtm_kafka_ysb.folded"


def _rtm_stacks() -> dict[str, int]:
    stacks: dict[str, int] = {}
    for line in RTM_STACKS.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def _leaf_kind(stack: str) -> str:
    """The task a Real-time Mode stack's frames say it is, by the leaf-most marker (the test's own reading)."""
    markers = (
        ("RespConnection", "Sink"), ("WindowCache", "Window"), ("com.fasterxml.jackson", "Deserialize"),
        ("JacksonParser", "Deserialize"), ("org.apache.kafka.", "Kafka/Source"),
        ("KafkaRecordToRowConverter", "Kafka/Source"), ("LowLatencyReader", "Kafka/Source"),
        ("GeneratedIteratorForCodegenStage", "Filter+Projection+Join"), ("WholeStageCodegen", "Filter+Projection+Join"),
        ("BufferedRowIterator", "Filter+Projection+Join"), ("ForeachDataWriter", "Sink"),
        ("org.apache.spark.broadcast", "ClusterCommunication"), ("java.io.ObjectInputStream", "ClusterCommunication"),
    )
    frames = stack.split(";")
    for frame in reversed(frames):
        for marker, task in markers:
            if marker in frame:
                return task
    return ""


def test_the_shipped_profile_names_every_real_time_stack() -> None:
    from profiler.matching.appprofile import load_profile
    from profiler.matching.matcher import Matcher, match_stacks

    # GIVEN stacks of a real `demo --spe spark-rtm --source kafka` run (tests/data/kafka/README.md)
    stacks = _rtm_stacks()
    matcher = Matcher(load_profile(REPO / SparkRealTimeYsb.profile))
    result = match_stacks(matcher, stacks)
    # THEN nothing is unmatched, little is Other
    assert result.task_samples["unmatched"] == 0, result.unmatched
    assert result.task_samples["Other"] <= 0.25 * result.total_samples  # a selection rich in task start-up
    # AND every query stack goes to the task its leaf-most marker names: the RTM reader wrapper and the
    # consumer to Kafka/Source, the window cache to Window, Redis and the foreach writer to Sink
    kinds = {"Kafka/Source", "Deserialize", "Filter+Projection+Join", "Window", "Sink", "ClusterCommunication"}
    seen = set()
    for stack in stacks:
        expected = _leaf_kind(stack)
        if expected:
            got = match_stacks(matcher, {stack: 1}).task_samples
            assert got[expected] == 1, (expected, {t: n for t, n in got.items() if n}, stack[-400:])
            seen.add(expected)
    assert seen == kinds


def test_draft_profile_puts_the_foreach_writer_in_the_sink_and_names_the_real_time_scan() -> None:
    from coordinator.analysis.draft import draft_profile
    from coordinator.analysis.stages import SparkIndex
    from profiler.matching.matcher import Matcher, match_stacks

    stacks = _rtm_stacks()
    index = SparkIndex(plan_operators=frozenset({"RealTimeStreamScan", "WriteToDataSourceV2", "Project"}))
    draft = draft_profile(stacks, index, "runs/rtm")
    matcher = Matcher(draft.profile)
    # the foreach writer's own frames (its loop, Row conversion), nothing of the query below them
    writer = [s for s in stacks if _leaf_kind(s) == "Sink" and "RespConnection" not in s]
    sink = "Sink (WriteToDataSourceV2) [plan WriteToDataSourceV2]"
    assert writer and all(match_stacks(matcher, {s: 1}).task_samples[sink] == 1 for s in writer)
    assert "Scan (source) [plan RealTimeStreamScan]:" in draft.text  # Real-time Mode's scan operator, named
    assert draft.unmatched_share < 0.05
