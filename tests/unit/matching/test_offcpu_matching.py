"""Off-CPU matching (docs/offcpu.md, "Which task a blocked stack goes to"): frames that only say how a
thread waits are passed over, so blocked time goes to the task the thread waited for.

tests/data/offcpu/flink_ysb.offcpu.folded: REAL, trimmed. `coordinator demo --spe flink --duration 20
--rate 5000 --off-cpu` (Flink 2.3, OpenJDK 17, 2026-11-26), both TaskManagers' pids/<pid>/offcpu.folded,
the first line of each (thread kind, cause), as written. tests/data/offcpu/spark_ysb.offcpu.folded: the
same from `coordinator demo --spe spark-str --duration 20 --rate 5000 --off-cpu` (Spark 4, two executors).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from coordinator.report.flame import StackClassifications
from profiler.capture.offcpu import OffCpuEntry, read_offcpu
from profiler.matching.appprofile import load_profile, parse_profile
from profiler.matching.matcher import Matcher, match_offcpu

ROOT = Path(__file__).resolve().parents[3]
FLINK_OFFCPU = ROOT / "tests" / "data" / "offcpu" / "flink_ysb.offcpu.folded"
SPARK_OFFCPU = ROOT / "tests" / "data" / "offcpu" / "spark_ysb.offcpu.folded"
PROFILES = ROOT / "application_profiles"

# The real blocked stacks' tails (the Flink capture's): how a Java thread parks, sleeps or waits.
PARK_TAIL = (
    "jdk.internal.misc.Unsafe::park;__futex_abstimed_wait_common;entry_SYSCALL_64_after_hwframe_[k];"
    "do_syscall_64_[k];__x64_sys_futex_[k];do_futex_[k];futex_wait_[k];__futex_wait_[k];futex_do_wait_[k];"
    "schedule_[k];__schedule_[k];__traceiter_sched_switch_[k]"
)
POLL_TAIL = (
    "__GI___poll;entry_SYSCALL_64_after_hwframe_[k];do_syscall_64_[k];__x64_sys_poll_[k];do_sys_poll_[k];"
    "poll_schedule_timeout.constprop.0_[k];schedule_hrtimeout_range_clock_[k];schedule_[k];__schedule_[k]"
)


def _task(matcher: Matcher, stack: str) -> str:
    return matcher.result_names[matcher.classify_offcpu_mask(stack)[0]]


def test_waiting_mark_parses_round_trips_and_is_optional() -> None:
    profile = parse_profile("Wait [waiting]: futex_wait, Unsafe::park\nKafka: KafkaConsumer\nIdle [waiting]: x\n")
    assert profile.task_names == ("Wait", "Kafka", "Idle")
    assert profile.waiting_task_names == ("Wait", "Idle")
    assert parse_profile(profile.format()) == profile
    # unmarked profiles parse as before; a bracket elsewhere stays part of the name
    assert parse_profile("Wait: futex_wait\n").waiting_task_names == ()
    assert parse_profile("Wait[waiting]: futex_wait\n").task_names == ("Wait[waiting]",)


def test_shipped_profiles_mark_their_wait_task() -> None:
    assert load_profile(PROFILES / "flink.txt").waiting_task_names == ("Wait",)
    assert load_profile(PROFILES / "spark_structured_streaming.txt").waiting_task_names == ("Wait",)
    assert load_profile(PROFILES / "spark_continuous.txt").waiting_task_names == ("Wait",)
    assert load_profile(PROFILES / "jvm_generic.txt").waiting_task_names == ("Waiting/parking",)


def test_on_cpu_matching_ignores_the_mark() -> None:
    marked = Matcher(load_profile(PROFILES / "flink.txt"))
    unmarked = Matcher(parse_profile(load_profile(PROFILES / "flink.txt").format().replace(" [waiting]", "")))
    for entry in read_offcpu(FLINK_OFFCPU):
        assert marked.classify_mask(entry.stack) == unmarked.classify_mask(entry.stack)


def test_real_flink_blocked_time_goes_to_the_threads_tasks_not_to_wait() -> None:
    # GIVEN the real blocked stacks of a Flink YSB run and the shipped Flink profile
    matcher = Matcher(load_profile(PROFILES / "flink.txt"))
    entries = read_offcpu(FLINK_OFFCPU)
    # WHEN they are matched by the on-CPU rule, Wait takes nearly all; by the off-CPU rule, the threads' tasks
    on_cpu: Counter[str] = Counter()
    for entry in entries:
        on_cpu[matcher.match(entry.stack)] += entry.blocked_ns
    assert on_cpu["Wait"] > 0.99 * sum(on_cpu.values())
    by_thread = {(e.stack.split(";")[0], e.cause): _task(matcher, e.stack) for e in entries}
    assert by_thread["flink-pekko.rem", "park"] == "ClusterCommunication"
    assert by_thread["Flink Netty Cli", "net"] == "ClusterCommunication"
    assert by_thread["OutputFlusher f", "sleep"] == "ClusterCommunication"
    assert by_thread["CompletableFutu", "park"] == "Kafka/Source"
    assert by_thread["G1 Service", "lock"] == "GC"
    assert by_thread["GC Thread#1", "lock"] == "GC"
    assert by_thread["C1 CompilerThre", "lock"] == "JIT compiler"
    assert by_thread["Source: YSB gen", "park"] == "Other"  # the chain's task thread, waiting for its mailbox
    assert by_thread["CampaignProcess", "net"] == "Other"  # a poll whose Java frames were not walked
    # threads no task names keep the waiting task: idle is idle
    assert by_thread["System Time Tri", "park"] == "Wait"
    assert by_thread["Log4j2-TF-3-Sch", "park"] == "Wait"
    split = match_offcpu(matcher, entries)
    total = sum(sum(causes.values()) for causes in split.values())
    assert sum(split["Wait"].values()) < 0.25 * total
    assert sum(sum(c.values()) for c in split.values()) == sum(e.blocked_ns for e in entries)


def test_real_spark_blocked_time_goes_to_the_threads_tasks_not_to_wait() -> None:
    matcher = Matcher(load_profile(PROFILES / "spark_structured_streaming.txt"))
    entries = read_offcpu(SPARK_OFFCPU)
    assert sum(e.blocked_ns for e in entries if matcher.match(e.stack) == "Wait") > 0.9 * sum(
        e.blocked_ns for e in entries
    )
    by_thread = {(e.stack.split(";")[0], e.cause): _task(matcher, e.stack) for e in entries}
    assert by_thread["block-manager-s", "park"] == "ClusterCommunication"
    assert by_thread["shuffle-client-", "net"] == "ClusterCommunication"
    assert by_thread["RemoteBlock-tem", "wait"] == "ClusterCommunication"
    assert by_thread["G1 Main Marker", "lock"] == "GC"
    assert by_thread["Executor task l", "lock"] == "Other"  # the task runner: its Java frames were not walked
    assert by_thread["executor-kill-m", "park"] == "Wait"  # named by no task
    split = match_offcpu(matcher, entries)
    assert sum(split["Wait"].values()) < 0.1 * sum(sum(c.values()) for c in split.values())


@pytest.mark.parametrize(
    ("stack", "task"),
    [
        # a Kafka poll's wait: the consumer frames decide, not the park below them
        ("Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer::poll;"
         "org.apache.kafka.clients.consumer.internals.ConsumerNetworkClient::poll;"
         "java.util.concurrent.locks.LockSupport::parkNanos;" + PARK_TAIL, "Kafka/Source"),
        # a shuffle fetch waiting for its blocks
        ("Executor task l;org.apache.spark.executor.Executor$TaskRunner::run;"
         "org.apache.spark.storage.ShuffleBlockFetcherIterator::next;"
         "java.util.concurrent.LinkedBlockingQueue::take;" + PARK_TAIL, "ClusterCommunication"),
        # an executor pool thread between tasks: the task runner plumbing (Other) is all that names it
        ("Executor task l;java.util.concurrent.ThreadPoolExecutor::getTask;" + PARK_TAIL, "Other"),
        # a thread no task names, parked: stays with the waiting task
        ("pool-3-thread-1;java.util.concurrent.ThreadPoolExecutor::getTask;" + PARK_TAIL, "Wait"),
        # a Redis sink's socket poll
        ("Executor task l;redis.clients.jedis.Connection::getOne;" + POLL_TAIL, "Sink"),
        # no frame at all matches: unmatched, as on the CPU
        ("some-thread;" + POLL_TAIL, "unmatched"),
    ],
)
def test_a_spark_wait_goes_to_the_task_it_waited_for(stack: str, task: str) -> None:
    matcher = Matcher(load_profile(PROFILES / "spark_structured_streaming.txt"))
    assert _task(matcher, stack) == task
    assert matcher.decide_offcpu(stack.split(";"))[0] == task


def test_unmarked_profile_still_passes_over_kernel_frames_and_blocking_natives() -> None:
    # GIVEN a profile whose waiting task is not marked: kernel frames and the JVM's blocking natives are
    # still passed over, its own waiting patterns (a user frame) are not
    matcher = Matcher(parse_profile("Wait: futex_wait, Unsafe::park, TaskMailboxImpl::take\nNet: Netty\n"))
    assert _task(matcher, "Flink Netty Ser;" + PARK_TAIL) == "Net"
    assert _task(matcher, "Flink Netty Ser;x.TaskMailboxImpl::take;" + PARK_TAIL) == "Wait"
    assert _task(matcher, "other;" + PARK_TAIL) == "Wait"  # nothing else: the on-CPU rule decides
    marked = Matcher(parse_profile("Wait [waiting]: futex_wait, Unsafe::park, TaskMailboxImpl::take\nNet: Netty\n"))
    assert _task(marked, "Flink Netty Ser;x.TaskMailboxImpl::take;" + PARK_TAIL) == "Net"


def test_kernel_frame_patterns_decide_only_when_nothing_else_does() -> None:
    matcher = Matcher(parse_profile("Disk: io_schedule\nApp: com.example\n"))
    assert _task(matcher, "t;com.example.Reader::read;io_schedule_[k];schedule_[k]") == "App"
    assert _task(matcher, "t;read;io_schedule_[k];schedule_[k]") == "Disk"


def test_decide_offcpu_names_the_deciding_frame_and_colours_the_offcpu_graphs() -> None:
    matcher = Matcher(load_profile(PROFILES / "flink.txt"))
    stack = "flink-pekko.rem;" + PARK_TAIL
    frames = stack.split(";")
    assert matcher.decide_offcpu(frames) == ("ClusterCommunication", 0)
    assert matcher.decide(frames)[0] == "Wait"  # the on-CPU rule, for samples, is unchanged
    names = (*matcher.task_names, "unmatched")
    assert StackClassifications(matcher, names, off_cpu=True).classify(stack) == (
        names.index("ClusterCommunication"), 0,
    )
    assert StackClassifications(matcher, names).classify(stack)[0] == names.index("Wait")
    only_wait = "x;" + PARK_TAIL
    assert matcher.decide_offcpu(only_wait.split(";")) == matcher.decide(only_wait.split(";"))


def test_match_offcpu_sums_causes_per_task() -> None:
    matcher = Matcher(load_profile(PROFILES / "flink.txt"))
    entries = [
        OffCpuEntry("park", "flink-pekko.rem;" + PARK_TAIL, 5, 1),
        OffCpuEntry("lock", "flink-pekko.rem;" + PARK_TAIL, 7, 1),
        OffCpuEntry("park", "nobody;" + PARK_TAIL, 11, 1),
    ]
    assert match_offcpu(matcher, entries) == {
        "ClusterCommunication": Counter({"park": 5, "lock": 7}), "Wait": Counter({"park": 11}),
    }


def test_a_socket_reads_jdk_frames_never_decide_when_a_task_frame_sits_above_them() -> None:
    # GIVEN the walker's whole stack of a thread blocked in a loopback read inside a task's method, and a
    # profile whose other task names the JDK's socket classes
    matcher = Matcher(parse_profile("Fetch: Worker::waitSocket\nSockets: NioSocketImpl, SocketInputStream\n"))
    stack = (
        "waitsplit-worker-0;java.lang.Thread::run;com.example.WaitSplit$Worker::waitSocket [i];"
        "java.net.Socket$SocketInputStream::read;sun.nio.ch.NioSocketImpl::read;sun.nio.ch.NioSocketImpl::implRead;"
        "sun.nio.ch.NioSocketImpl::timedRead;sun.nio.ch.NioSocketImpl::park;sun.nio.ch.Net::poll;"
        "Java_sun_nio_ch_Net_poll;" + POLL_TAIL
    )
    # THEN the method above the read decides; without it the read's frames decide as for a sample
    assert _task(matcher, stack) == "Fetch"
    assert _task(matcher, stack.replace("com.example.WaitSplit$Worker::waitSocket [i];", "")) == "Sockets"
