"""A drafted application profile for a Spark run: tasks named after the query's physical operators
(whole-stage-codegen stages from the SQL plan, and the operators Spark runs outside generated code),
patterns taken from the frames the captured stacks really contain, and the shares the draft gives.

Pure: stacks (folded counts), the run's SparkIndex and the matcher in, profile text and shares out.
The draft is for the user to edit (docs/matching.md); ``coordinator draft-profile`` prints it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator.analysis.stages import SparkIndex
from profiler.capture.folded import FRAME_SEPARATOR
from profiler.capture.format import UNMATCHED
from profiler.engines.sparkplan import codegen_stage_of
from profiler.matching.appprofile import ApplicationProfile, parse_profile
from profiler.matching.matcher import Matcher, candidate_patterns, match_stacks

# Operators Spark runs outside generated code, and the runtime around them: (task name, plan operators
# that make it relevant, frame patterns). Order is the profile's in-frame priority. A family enters the
# draft only with samples in the stacks; its plan operators name it when the plan has them.
FAMILIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("JSON parse/format (from_json, to_json)", ("Project",),
     ("org.apache.spark.sql.catalyst.json", "com.fasterxml.jackson", "JsonToStructs", "StructsToJson")),
    ("Reflection calls (reflect())", ("Project",), ("CallMethodViaReflection",)),
    # before Scan: Spark's foreach writer (Real-time Mode's sink) lives in Scan's package streaming.sources
    ("Sink (WriteToDataSourceV2)", ("WriteToDataSourceV2", "WriteToContinuousDataSource"),
     ("DataWritingSparkTask", "ContinuousWriteRDD", "WriteToDataSourceV2Exec", "ForeachDataWriter",
      "RealTimeRowWriter")),
    ("Scan (source)", ("MicroBatchScan", "ContinuousScan", "RealTimeStreamScan", "BatchScan", "Scan"),
     ("org.apache.spark.sql.execution.datasources.v2.DataSourceRDD", "ContinuousDataSourceRDD",
      "ContinuousQueuedDataReader", "org.apache.spark.sql.execution.datasources.v2.LowLatencyReader",
      "org.apache.spark.sql.execution.streaming.sources",
      "org.apache.spark.sql.execution.streaming.continuous.RateStream")),
    ("State store (StateStoreRestore/Save)", ("StateStoreRestore", "StateStoreSave"),
     ("org.apache.spark.sql.execution.streaming.state", "org.apache.spark.sql.execution.streaming.StateStore")),
    ("Exchange (shuffle)", ("Exchange",),
     ("org.apache.spark.shuffle", "ShuffleBlockFetcherIterator", "org.apache.spark.storage.ShuffleBlockFetcher",
      "org.apache.spark.sql.execution.UnsafeRowSerializer", "org.apache.spark.storage.DiskBlockObjectWriter")),
    ("Broadcast (BroadcastExchange)", ("BroadcastExchange",), ("org.apache.spark.broadcast", "TorrentBroadcast")),
    ("Task (de)serialization", (),
     ("java.io.ObjectInputStream", "java.io.ObjectOutputStream", "org.apache.spark.serializer")),
    ("Network (Spark RPC, block transfer)", (),
     ("org.apache.spark.network", "io.netty", "org.apache.spark.rpc")),
    ("Task runtime (Spark)", (),
     ("org.apache.spark.executor.Executor$TaskRunner", "org.apache.spark.scheduler.Task::run",
      "org.apache.spark.scheduler.ResultTask", "org.apache.spark.scheduler.ShuffleMapTask",
      "org.apache.spark.rdd.RDD::", "org.apache.spark.util.CompletionIterator")),
    ("GC", (), ("GC Thread", "G1 ", "re:^G1", "VM Thread", "ParallelGC", "SerialHeap", "re:^GC ")),
    ("JIT compiler", (), ("C1 CompilerThre", "C2 CompilerThre", "re:^Compile::", "CompileBroker")),
)
# Reading from Kafka, on either engine (real consumer stacks: docs/demo.md "Kafka"), as the paper's Kafka
# task: the consumer's fetch (KafkaConsumer.poll, Fetcher, NetworkClient, Selector) under the engine's
# reader (Spark's kafka010 KafkaDataConsumer and partition readers; Flink's KafkaSourceReader,
# KafkaPartitionSplitReader on its SplitFetcher thread "Source Data Fetcher for <chain>"). Turning a
# record's bytes into the engine's value is kept apart, listed first: a frame both lines match (Kafka's
# Deserializer classes) is deserialization. Parsing the value (JSON) is the query's own, leafier task.
KAFKA_TASKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Kafka record deserialization",
     ("org.apache.kafka.common.serialization", "org.apache.flink.connector.kafka.source.reader.deserializer",
      "org.apache.flink.api.common.serialization", "org.apache.spark.sql.kafka010.KafkaRecordToRowConverter")),
    ("Kafka source (consumer fetch)",
     ("org.apache.kafka.", "org.apache.spark.sql.kafka010", "org.apache.flink.connector.kafka.source",
      "org.apache.flink.connector.base.source.reader.fetcher", "re:^Source Data Fetcher for",
      "re:^kafka-coordinator-heartbeat-thread")),
)
# Frames that say the stacks read Kafka at all (a SplitFetcher alone may serve a file source)
KAFKA_MARKERS = ("org.apache.kafka.", "org.apache.spark.sql.kafka010", "org.apache.flink.connector.kafka")
CODEGEN_TASK = "Codegen {n} ({operators})"  # never ": " inside a task name: it ends the name
OTHER_TASK = "Other threads"
OTHER_MIN_SHARE = 0.002  # a thread kind joins "Other threads" once it holds 0.2 % of the samples


@dataclass(frozen=True)
class Draft:
    """The drafted profile and what it gives on the stacks it was drafted from."""

    text: str
    profile: ApplicationProfile
    shares: tuple[tuple[str, int, float], ...]  # (task, samples, share), profile order then unmatched
    candidates: tuple[tuple[str, int], ...]  # leaf frames of the unmatched stacks with the most samples
    samples: int

    @property
    def unmatched_share(self) -> float:
        return next((share for task, _s, share in self.shares if task == UNMATCHED), 0.0)


def _frames(stacks: Mapping[str, int]) -> Counter[str]:
    """Every distinct frame with the samples of the stacks it occurs in (once per stack)."""
    seen: Counter[str] = Counter()
    for stack, count in stacks.items():
        for frame in set(stack.split(FRAME_SEPARATOR)):
            seen[frame] += count
    return seen


def _escape(pattern: str) -> str:
    return pattern.replace(",", "\\,")


def _codegen_lines(frames: Mapping[str, int], index: SparkIndex) -> list[str]:
    stages = sorted({n for frame in frames if (n := codegen_stage_of(frame)) is not None})
    lines = []
    for n in stages:
        operators = index.codegen.get(n, ())
        name = CODEGEN_TASK.format(n=n, operators=" + ".join(operators) if operators else "operators unknown")
        lines.append(f"{name}: re:GeneratedIteratorForCodegenStage{n}(?!\\d)")
    return lines


def _family_lines(frames: Mapping[str, int], plan_operators: set[str]) -> list[str]:
    lines = []
    for name, operators, patterns in FAMILIES:
        present = [p for p in patterns if any(_pattern_hits(p, frame) for frame in frames)]
        if not present:
            continue
        named = [op for op in operators if op in plan_operators]
        title = f"{name} [plan {' + '.join(named)}]" if named and operators != ("Project",) else name
        lines.append(f"{title}: {', '.join(_escape(p) for p in present)}")
    return lines


def kafka_lines(frames: Iterable[str]) -> list[str]:
    """The Kafka tasks (KAFKA_TASKS) with the patterns the frames hold, when the stacks read Kafka."""
    frames = list(frames)
    if not any(marker in frame.replace("/", ".") for frame in frames for marker in KAFKA_MARKERS):
        return []
    lines = []
    for name, patterns in KAFKA_TASKS:
        present = [p for p in patterns if any(_pattern_hits(p, frame) for frame in frames)]
        if present:
            lines.append(f"{name}: {', '.join(_escape(p) for p in present)}")
    return lines


def _pattern_hits(pattern: str, frame: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], frame) is not None
    return pattern in frame or pattern.replace("/", ".") in frame.replace("/", ".")


def _other_line(stacks: Mapping[str, int], profile_lines: Sequence[str]) -> str | None:
    """Thread kinds of the stacks the tasks so far leave unmatched, each above OTHER_MIN_SHARE."""
    if not profile_lines:
        return None
    matcher = Matcher(parse_profile("\n".join(profile_lines) + "\n", "<draft>"))
    unmatched = match_stacks(matcher, stacks).unmatched
    total = sum(stacks.values())
    roots: Counter[str] = Counter()
    for stack, count in unmatched.items():
        roots[stack.split(FRAME_SEPARATOR, 1)[0]] += count
    by_kind: Counter[str] = Counter()
    for root, count in roots.items():
        by_kind[_kind_pattern(root)] += count  # pool threads differ only by their numbers
    kinds = [kind for kind, count in by_kind.most_common() if total and count / total >= OTHER_MIN_SHARE]
    if not kinds:
        return None
    return f"{OTHER_TASK}: " + ", ".join(_escape(f"re:^{kind}$") for kind in kinds)


_REGEX_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _kind_pattern(thread_name: str) -> str:
    """A regular expression for a thread name with its ids generalised: numbers (``pool-39`` →
    ``pool-\\d+``) and UUIDs (a streaming query's run id)."""

    def numbers(part: str) -> str:
        return "\\d+".join(_REGEX_SPECIAL.sub(r"\\\1", piece) for piece in re.split(r"\d+", part))

    return "[0-9a-f-]{36}".join(numbers(part) for part in _UUID.split(thread_name))


def draft_profile(stacks: Mapping[str, int], index: SparkIndex, source: str = "") -> Draft:
    """Draft a profile from the stacks of a run's workload processes and its Spark plans."""
    frames = _frames(stacks)
    lines = _family_lines(frames, set(index.plan_operators))
    # JSON and reflection work runs inside generated code: list them first so that leaf-first and
    # in-frame priority keep them apart; codegen stages come next, the runtime families after them.
    early = [line for line in lines if line.startswith(("JSON", "Reflection"))]
    late = [line for line in lines if line not in early]
    task_lines = early + kafka_lines(frames) + _codegen_lines(frames, index) + late
    other = _other_line(stacks, task_lines)
    if other is not None:
        task_lines.append(other)
    header = [
        f"# Drafted by `coordinator draft-profile` from {source or 'a run'}: edit names and patterns freely.",
        "# Codegen N tasks: Spark's whole-stage code generation fused these plan operators into one generated",
        "# method (GeneratedIteratorForCodegenStage<N>); they cannot be split further from the stacks.",
    ]
    text = "\n".join(header + task_lines) + "\n"
    result = match_stacks(Matcher(parse_profile(text, "<draft>")), stacks)
    # a family whose frames are present but never decide (a deeper task always wins) is left out
    empty = {task for task, count in result.task_samples.items() if not count and task != UNMATCHED}
    if empty:
        task_lines = [line for line in task_lines if line.split(": ", 1)[0] not in empty]
        text = "\n".join(header + task_lines) + "\n"
        result = match_stacks(Matcher(parse_profile(text, "<draft>")), stacks)
    profile = parse_profile(text, "<draft>")
    total = sum(result.task_samples.values())
    shares = tuple((task, n, n / total if total else 0.0) for task, n in result.task_samples.items())
    candidates = tuple(candidate_patterns(result.unmatched, 10))
    return Draft(text, profile, shares, candidates, total)
