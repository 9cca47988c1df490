"""draft-profile names Kafka sources on both engines: the consumer's fetch under the engine's reader is a
task, turning a record into the engine's value is another, parsing the value stays the query's own.
Stacks from real `coordinator demo --source kafka` captures (tests/data/kafka/README.md)."""

from __future__ import annotations

from pathlib import Path

from coordinator.analysis.draft import draft_profile, kafka_lines
from coordinator.analysis.flinkdraft import draft_flink_profile
from coordinator.analysis.stages import SparkIndex
from profiler.capture.format import VertexWindow
from profiler.matching.matcher import Matcher, match_stacks

DATA = Path(__file__).resolve().parents[3] / "data" / "kafka"
FETCH = "Kafka source (consumer fetch)"
DESERIALIZE = "Kafka record deserialization"
SOURCE_CHAIN = "Source: YSB Kafka -> DeserializeBolt -> EventFilterBolt -> ProjectionBolt -> RedisJoinBolt -> " \
    "EnrichBolt -> EventTime"
VERTICES = [
    VertexWindow("j", "ysb", "v1", SOURCE_CHAIN, 2, True),
    VertexWindow("j", "ysb", "v2", "CampaignProcessor -> RedisResultSink: Writer", 2, False),
]


def _stacks(name: str) -> dict[str, int]:
    stacks: dict[str, int] = {}
    for line in (DATA / name).read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def _task_of(matcher: Matcher, stack: str) -> str:
    result = match_stacks(matcher, {stack: 1})
    return next(task for task, samples in result.task_samples.items() if samples)


def _task_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_flink_draft_names_the_kafka_fetch_and_keeps_the_query_apart() -> None:
    # GIVEN a Flink YSB job's stacks reading Kafka (KafkaSource, its SplitFetcher thread)
    stacks = _stacks("flink_kafka_ysb.folded")
    # WHEN a profile is drafted from them and the job's two vertices
    draft = draft_flink_profile(stacks, VERTICES, "runs/flink-kafka")
    shares = {task: samples for task, samples, _share in draft.shares}
    lines = _task_lines(draft.text)
    # THEN the Kafka tasks come first, the source operator no longer claims the Kafka reader's frames
    assert lines[0].startswith(f"{DESERIALIZE}: ") and lines[1].startswith(f"{FETCH}: ")
    source = next(line for line in lines if line.startswith("Source - YSB Kafka: "))
    assert "org.apache.flink.connector.kafka.source" not in source
    assert "Source\\ Data\\ Fetcher" not in next(line for line in lines if line.startswith("Other threads"))
    # AND the fetcher thread's samples are the fetch, but for its hand-over of records to the task's
    # mailbox (Flink's runtime); the stacks that reach the job's own functions are theirs
    matcher = Matcher(draft.profile)
    fetcher = {s: n for s, n in stacks.items() if s.startswith("Source Data Fetcher for ")}
    assert sum(fetcher.values()) > 0.2 * sum(stacks.values())
    assert all(_task_of(matcher, s) == FETCH for s in fetcher if "tasks.mailbox" not in s)
    assert sum(n for s, n in fetcher.items() if _task_of(matcher, s) == FETCH) >= 0.9 * sum(fetcher.values())
    user = [s for s in stacks if "ysb.YsbFlink$" in s]
    assert user and not any(_task_of(matcher, s) in (FETCH, DESERIALIZE) for s in user)
    assert "DeserializeBolt" in {_task_of(matcher, s) for s in user}
    assert shares[FETCH] >= 0.9 * sum(fetcher.values())
    assert draft.unmatched_share < 0.05


def test_spark_draft_names_the_kafka_fetch_and_the_record_conversion() -> None:
    # GIVEN Spark Continuous Processing's Kafka reader stacks (KafkaContinuousPartitionReader)
    stacks = _stacks("spark_cp_kafka_ysb.folded")
    # WHEN a profile is drafted
    draft = draft_profile(stacks, SparkIndex(), "runs/cp-kafka")
    shares = {task: samples for task, samples, _share in draft.shares}
    matcher = Matcher(draft.profile)
    # THEN the consumer's fetch is a task and the largest one, the record-to-row conversion another
    converting = [s for s in stacks if "KafkaRecordToRowConverter" in s.rsplit(";kafka010", 1)[-1]
                  and "org.apache.kafka." not in s.split("KafkaRecordToRowConverter", 1)[1]]
    assert converting and all(_task_of(matcher, s) == DESERIALIZE for s in converting)
    consumer = [s for s in stacks if "org.apache.kafka.clients" in s and "KafkaRecordToRowConverter" not in s]
    assert consumer and all(_task_of(matcher, s) == FETCH for s in consumer)
    assert shares[FETCH] == max(shares.values()) and shares[DESERIALIZE] > 0
    assert draft.unmatched_share < 0.05


def test_no_kafka_task_without_kafka_frames() -> None:
    # GIVEN a file source's SplitFetcher thread (FLIP-27, as Kafka's) and a generator: no Kafka frames
    frames = [
        "Source Data Fetcher for Source: files",
        "org.apache.flink.connector.base.source.reader.fetcher.SplitFetcher::run",
        "org.apache.flink.connector.file.src.impl.FileSourceSplitReader::fetch",
        "org.apache.spark.sql.execution.streaming.sources.RatePerMicroBatchStream::createReaderFactory",
    ]
    # THEN no Kafka task is drafted
    assert kafka_lines(frames) == []


def test_a_frame_both_kafka_tasks_match_is_deserialization() -> None:
    # GIVEN Kafka's own value Deserializer under the consumer's fetch (a frame the fetch's pattern matches too)
    stack = (
        "Executor task launch worker for task 0.0;org.apache.spark.sql.kafka010.KafkaDataConsumer::get;"
        "org.apache.kafka.clients.consumer.internals.CompletedFetch::parseRecord;"
        "org.apache.kafka.common.serialization.StringDeserializer::deserialize"
    )
    draft = draft_profile({stack: 7}, SparkIndex(), "runs/x")
    # THEN it is deserialization, listed before the fetch
    assert _task_of(Matcher(draft.profile), stack) == DESERIALIZE
    assert _task_lines(draft.text)[0].startswith(f"{DESERIALIZE}: ")
