"""Recorded captures matched with every shipped profile agree with a straightforward implementation.

tests/data/spark_executor_real.folded: a real capture. A local PySpark 4 structured streaming query
(rate source -> to_json -> from_json -> filter -> broadcast join -> withColumn -> 10 s window count
-> foreachBatch Parquet sink, local[2], -XX:+PreserveFramePointer) sampled after 60 s of warm-up
with `profile-bpfcc -a -f -p PID -F 99 20` (bcc; `-a` marks kernel frames with `_[k]`) after
`jcmd PID Compiler.perfmap`. Driver and executor share the JVM in local mode.

tests/data/spark_executor_synthetic.folded: SYNTHETIC, hand-made executor-like stacks in the same
frame spelling, one or two per task of the Spark profile, with counts chosen so every per-task
total is known by hand (the expected table below).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from profiler.capture.folded import read_folded
from profiler.matching.appprofile import ApplicationProfile, load_profile
from profiler.matching.matcher import Matcher, match_stacks

DATA = Path(__file__).resolve().parents[2] / "data"
PROFILES = sorted((Path(__file__).resolve().parents[3] / "application_profiles").glob("*.txt"))
RECORDED = ["spark_executor_real.folded", "spark_executor_synthetic.folded", "pyspark_udf_real.folded"]


def straightforward_frame_task(profile: ApplicationProfile, frame: str) -> str | None:
    """The first task, in profile order, with a pattern matching this frame; literal = substring
    with '/' read as '.'."""
    dotted = frame.replace("/", ".")
    for task in profile.tasks:
        for pattern in task.patterns:
            if pattern.regex:
                if re.search(pattern.text, frame):
                    return task.name
            elif pattern.text.replace("/", ".") in dotted:
                return task.name
    return None


def straightforward_match(profile: ApplicationProfile, stack: str, seen: dict[str, str | None] | None = None) -> str:
    """Algorithm 1 written out plainly: walk the frames leaf first; the first frame with a task
    decides. ``seen`` caches frame -> task across calls (frames repeat a lot)."""
    seen = {} if seen is None else seen
    for frame in reversed(stack.split(";")):
        if frame not in seen:
            seen[frame] = straightforward_frame_task(profile, frame)
        if seen[frame] is not None:
            return str(seen[frame])
    return "unmatched"


def straightforward_counts(
    profile: ApplicationProfile, assigned: dict[str, str], counts: dict[str, int]
) -> dict[str, int]:
    totals = {name: 0 for name in (*profile.task_names, "unmatched")}
    for stack, count in counts.items():
        totals[assigned[stack]] += count
    return totals


def test_there_are_profiles_and_data() -> None:
    assert {p.name for p in PROFILES} >= {
        "spark_structured_streaming.txt", "spark_continuous.txt", "flink.txt", "jvm_generic.txt"
    }
    for name in RECORDED:
        assert (DATA / name).stat().st_size < 2_500_000


@pytest.mark.parametrize("data_name", RECORDED)
@pytest.mark.parametrize("profile_path", PROFILES, ids=lambda p: p.stem)
def test_matcher_equals_straightforward_implementation(profile_path: Path, data_name: str) -> None:
    profile = load_profile(profile_path)
    counts = dict(read_folded(DATA / data_name))
    matcher = Matcher(profile)
    result = match_stacks(matcher, counts)
    seen: dict[str, str | None] = {}
    assigned = {stack: straightforward_match(profile, stack, seen) for stack in counts}
    assert result.task_samples == straightforward_counts(profile, assigned, counts)
    assert result.total_samples == sum(counts.values())
    # and stack by stack, including the unmatched file content
    assert {stack: matcher.match(stack) for stack in counts} == assigned
    assert result.unmatched == Counter({s: n for s, n in counts.items() if assigned[s] == "unmatched"})


def test_real_capture_is_mostly_matched_by_the_spark_profile() -> None:
    profile = load_profile(next(p for p in PROFILES if p.stem == "spark_structured_streaming"))
    result = match_stacks(Matcher(profile), read_folded(DATA / "spark_executor_real.folded"))
    assert result.total_samples > 500
    assert result.task_samples["unmatched"] / result.total_samples < 0.05
    # the pipeline's JSON parsing and the fused operators carry the executor's work
    assert result.task_samples["Deserialize"] > result.task_samples["Window"]
    assert result.task_samples["Filter+Projection+Join"] > 0
    assert result.task_samples["JIT compiler"] > 0 and result.task_samples["GC"] > 0


def test_synthetic_capture_known_answer() -> None:
    profile = load_profile(next(p for p in PROFILES if p.stem == "spark_structured_streaming"))
    result = match_stacks(Matcher(profile), read_folded(DATA / "spark_executor_synthetic.folded"))
    # worked out by hand from the stacks of the file, two or so per task
    assert result.task_samples == {
        "Kafka/Source": 260 + 55,
        "Deserialize": 410 + 37,  # 37: page-fault kernel frames below JacksonParser
        "Filter+Projection+Join": 198 + 74 + 66,  # 66: Stage2.processNext below the aggregation
        "Enrich": 0,
        "Deserialize (Python UDF)": 0,
        "Filter+Projection (Python UDF)": 0,
        "Python Serialization": 57,  # the JVM reading a Python UDF's answer from its worker: the hand-off
        "Window": 91 + 23,
        "Sink": 31 + 12,  # 12: snappy below the Parquet writer is Sink, not ClusterCommunication
        "ClusterCommunication": 45 + 28 + 17,
        "Wait": 9 + 14 + 6,  # 9: netty epoll; 6: an idle GC worker
        "GC": 42 + 5,
        "JIT compiler": 120 + 8,
        "Other": 19 + 33,
        "unmatched": 4 + 2,
    }
    assert sorted(result.unmatched.values(), reverse=True) == [4, 2]


RECORD = "org.apache.flink.streaming.runtime.streamrecord.StreamRecord"
FLINK_CHAIN = ";".join([
    "Source: Kafka S", "start_thread", "Interpreter", "void org.apache.flink.runtime.taskmanager.Task.run()",
    "void org.apache.flink.streaming.runtime.tasks.StreamTask.invoke()",
    "void org.apache.flink.streaming.runtime.tasks.mailbox.MailboxProcessor.runMailboxLoop()",
    "void org.apache.flink.connector.base.source.reader.SourceReaderBase.pollNext("
    "org.apache.flink.api.connector.source.ReaderOutput)",
    "void org.apache.flink.streaming.runtime.tasks.ChainingOutput.collect(java.lang.Object)",
    f"void org.apache.flink.streaming.api.operators.StreamFlatMap.processElement({RECORD})",
    "void flink.benchmark.AdvertisingTopologyFlinkWindows$DeserializeBolt.flatMap("
    "java.lang.String, org.apache.flink.util.Collector)",
    "void org.apache.flink.streaming.runtime.tasks.ChainingOutput.collect(java.lang.Object)",
    f"void org.apache.flink.streaming.api.operators.StreamFilter.processElement({RECORD})",
])
NETTY = "org.apache.flink.shaded.netty4.io.netty.channel.epoll"
# Spark's DSv2 write task, the frame every micro-batch sink's writer runs under (itself Sink)
DATA_WRITING = ("void org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask$.run("
                "org.apache.spark.sql.connector.write.DataWriterFactory, org.apache.spark.TaskContext, "
                "scala.collection.Iterator, int, boolean, org.apache.spark.sql.execution.metric.CustomMetrics)")


@pytest.mark.parametrize(
    "profile_name, stack, task",
    [
        # Flink operator chains nest: the innermost operator of the chain decides
        ("flink", FLINK_CHAIN, "Filter+Projection"),
        ("flink", FLINK_CHAIN + ";boolean flink.benchmark.AdvertisingTopologyFlinkWindows$EventFilterBolt.filter("
         "org.apache.flink.api.java.tuple.Tuple7)", "Filter+Projection"),
        ("flink", FLINK_CHAIN.rsplit(";", 2)[0] + ";java.lang.Object net.minidev.json.parser.JSONParser.parse("
         "java.lang.String)", "Deserialize"),
        ("flink", "Window(Tumblin;start_thread;void org.apache.flink.streaming.runtime.operators.windowing."
         f"WindowOperator.processElement({RECORD});"
         "void org.apache.flink.runtime.state.heap.CopyOnWriteStateMap.put(java.lang.Object, java.lang.Object)",
         "Window"),
        ("flink", f"Flink Netty Ser;start_thread;void {NETTY}.EpollEventLoop.run();"
         f"int {NETTY}.Native.epollWait0(int, long, int, int, int, int);"
         "epoll_wait;do_epoll_wait_[k];ep_poll_[k]", "Wait"),
        ("flink", f"Sink: Redis (1;void org.apache.flink.streaming.api.operators.StreamSink.processElement({RECORD});"
         "java.lang.Long redis.clients.jedis.Jedis.hset(java.lang.String, java.lang.String, java.lang.String);"
         "tcp_sendmsg_[k]", "Sink"),
        # continuous processing: the reader thread is the source, the epoch RPC is communication
        ("spark_continuous", "continuous-read;start_thread;Interpreter;void org.apache.spark.sql.execution.streaming."
         "continuous.ContinuousQueuedDataReader$DataReaderThread.run();"
         "boolean org.apache.spark.sql.execution.streaming.sources.RateStreamContinuousPartitionReader.next()",
         "Kafka/Source"),
        ("spark_continuous", "Executor task l;Interpreter;void org.apache.spark.sql.execution.streaming.continuous."
         "EpochCoordinatorRef.ask(java.lang.Object)", "ClusterCommunication"),
        # Java frames as captures spell them (frames.java_frame_name): pkg.Class::method
        ("spark_continuous", "Executor task l;Interpreter;java.util.concurrent.ArrayBlockingQueue::poll", "Wait"),
        # generic JVM
        ("jvm_generic", "main;Interpreter;Interpreter", "Interpreter"),
        ("jvm_generic", "VM Thread;start_thread;VMThread::run();SafepointSynchronize::begin()", "Safepoints"),
        ("jvm_generic", "VM Thread;start_thread;VMThread::run();VM_G1CollectForAllocation::doit()", "GC"),
        ("jvm_generic", "main;void sun.nio.ch.FileChannelImpl.read(java.nio.ByteBuffer);read;vfs_read_[k]",
         "Native I/O"),
        ("jvm_generic", "main;Lio/netty/channel/nio/NioEventLoop:::run", "Netty"),
        ("jvm_generic", "main;void jdk.internal.misc.Unsafe.park(boolean, long);Unsafe_Park;futex_wait_[k]",
         "Waiting/parking"),
        ("jvm_generic", "C2 CompilerThre;start_thread;Compile::Code_Gen()", "JIT"),
        # Spark micro-batch: aggregation methods of generated code are Window, its other methods are not
        ("spark_structured_streaming", "Executor task l;void org.apache.spark.sql.catalyst.expressions.GeneratedClass$"
         "GeneratedIteratorForCodegenStage7.hashAgg_doAggregateWithKeys_0$()", "Window"),
        ("spark_structured_streaming", "Executor task l;void org.apache.spark.sql.catalyst.expressions.GeneratedClass$"
         "GeneratedIteratorForCodegenStage7.processNext()", "Filter+Projection+Join"),
        ("spark_structured_streaming", "Executor task l;Lorg/apache/spark/sql/catalyst/expressions/GeneratedClass$"
         "GeneratedIteratorForCodegenStage12:::project_doConsume_0$", "Filter+Projection+Join"),
        ("spark_structured_streaming", "Executor task l;Lorg/apache/spark/sql/catalyst/json/JacksonParser:::parse",
         "Deserialize"),
        ("spark_structured_streaming", "Executor task l;Interpreter;Interpreter", "Other"),
        # the window kept by the sink (demo --spark-window sink): its cache is Window, its Redis round
        # trips Sink, as in Continuous Processing (spark_continuous.txt)
        ("spark_structured_streaming", f"Executor task l;{DATA_WRITING};void ysb.RedisSink$WindowCacheWriter.write("
         "org.apache.spark.sql.catalyst.InternalRow);java.lang.Object java.util.HashMap.computeIfAbsent("
         "java.lang.Object, java.util.function.Function)", "Window"),
        ("spark_structured_streaming", f"Executor task l;{DATA_WRITING};org.apache.spark.sql.connector.write."
         "WriterCommitMessage ysb.RedisSink$WindowCacheWriter.commit();java.lang.Object ysb.RespConnection.call("
         "java.util.List);int java.net.SocketInputStream.read(byte[], int, int);tcp_recvmsg_[k]", "Sink"),
        ("spark_continuous", "Executor task l;void ysb.RedisSink$WindowCacheWriter.write("
         "org.apache.spark.sql.catalyst.InternalRow)", "Window"),
        ("spark_structured_streaming", "kworker/0:1;worker_thread_[k]", "unmatched"),
    ],
)
def test_shipped_profiles_on_typical_stacks(profile_name: str, stack: str, task: str) -> None:
    profile = load_profile(next(p for p in PROFILES if p.stem == profile_name))
    assert Matcher(profile).match(stack) == task
    assert straightforward_match(profile, stack) == task


@pytest.mark.parametrize("profile_path", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("recorded", RECORDED)
def test_report_colours_as_the_summary_classifies(profile_path: Path, recorded: str) -> None:
    # The report colours flamegraphs with Matcher.decide; summary.csv counts with classify_mask.
    matcher = Matcher(load_profile(profile_path))
    for stack in read_folded(DATA / recorded):
        task, decider = matcher.decide(stack.split(";"))
        assert task == matcher.match(stack), stack
        assert decider == matcher.explain(stack).frame_index, stack


PYTHON_FRAME = re.compile(r"^\S+ \(\S+:\d+\)$")  # module.qualname (file:line), docs/python-frames.md
UDF_TASKS = {"parse_event": "Deserialize (Python UDF)", "is_view": "Filter+Projection (Python UDF)",
             "project": "Filter+Projection (Python UDF)", "view_of": "Filter+Projection (Python UDF)"}  # fmt: skip


def _innermost_udf(stack: str) -> str | None:
    """The task of the innermost pyudfs function on a stack (coordinator/workloads/ysb/pyudfs.py), if any."""
    for frame in reversed(stack.split(";")):
        for function, task in UDF_TASKS.items():
            if frame.startswith(f"pyudfs.{function} (pyudfs.py:"):
                return task
    return None


def test_pyspark_udf_capture_names_the_python_tasks() -> None:
    # GIVEN coordinator demo --udf python's capture (tests/data/pyspark_udf_real.folded: PySpark 4.2, the venv's
    # CPython 3.11.7; every sample of the executors' four Python workers, and the executors' JVM samples that
    # hold a frame of Spark's Python runner, EvaluatePython or the pickler)
    profile = load_profile(next(p for p in PROFILES if p.stem == "spark_structured_streaming"))
    matcher = Matcher(profile)
    counts = dict(read_folded(DATA / "pyspark_udf_real.folded"))
    workers = {stack: n for stack, n in counts.items() if stack.split(";")[0].startswith("python")}
    jvm = {stack: n for stack, n in counts.items() if stack not in workers}
    assert sum(workers.values()) == 42 and sum(jvm.values()) == 27
    # WHEN the shipped Spark profile matches them
    tasks = {stack: matcher.match(stack) for stack in counts}
    # THEN a sample under the UDF is the task of its innermost pyudfs function, whatever lies leafward (json,
    # the allocator)
    by_udf = Counter({task: 0 for task in set(UDF_TASKS.values())})
    for stack, n in workers.items():
        if (task := _innermost_udf(stack)) is not None:
            assert tasks[stack] == task, stack
            by_udf[task] += n
    assert by_udf == {"Deserialize (Python UDF)": 5, "Filter+Projection (Python UDF)": 3}  # the run's summary.csv
    # AND the worker's side of the hand-off (PySpark's serializers, its per-row loop) is Python Serialization
    handoff = [s for s in workers if _innermost_udf(s) is None and "serializers.BatchedSerializer" in s]
    assert handoff and all(tasks[s] == "Python Serialization" for s in handoff)
    # AND every worker sample is named: the daemon's and CPython's cyclic GC by their frames, the samples
    # the walker took before the worker's preparation (the process name only) Other
    assert all(tasks[s] != "unmatched" for s in workers), [s for s in workers if tasks[s] == "unmatched"]
    assert all(tasks[s] == "Other" for s in workers if not any(PYTHON_FRAME.match(f) for f in s.split(";"))
               and "gc_collect_main" not in s)  # fmt: skip
    # AND on the JVM side the pickler and EvaluatePython are the hand-off too, unless a more specific frame
    # lies leafward (the generated projection of the UDF's answer is Filter+Projection+Join)
    pickled = [s for s in jvm if "net.razorvine.pickle" in s or "EvaluatePython" in s]
    assert pickled and all(tasks[s] == "Python Serialization" for s in pickled)
    jvm_tasks: Counter[str] = Counter()
    for stack, n in jvm.items():
        jvm_tasks[tasks[stack]] += n
    assert jvm_tasks["Python Serialization"] >= 0.5 * sum(jvm.values()), jvm_tasks
