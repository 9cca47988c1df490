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

from profiler.appprofile import ApplicationProfile, load_profile
from profiler.folded import read_folded
from profiler.matcher import Matcher, match_stacks

DATA = Path(__file__).resolve().parent.parent / "data"
PROFILES = sorted((Path(__file__).resolve().parent.parent.parent / "application_profiles").glob("*.txt"))
RECORDED = ["spark_executor_real.folded", "spark_executor_synthetic.folded"]


def straightforward_match(profile: ApplicationProfile, stack: str) -> str:
    """Algorithm 1 written out plainly: walk frames leaf first; in each frame try the tasks in
    profile order and their patterns in order; literal = substring with '/' read as '.'."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for task in profile.tasks:
            for pattern in task.patterns:
                if pattern.regex:
                    if re.search(pattern.text, frame):
                        return task.name
                elif pattern.text.replace("/", ".") in frame.replace("/", "."):
                    return task.name
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
    assigned = {stack: straightforward_match(profile, stack) for stack in counts}
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
        "Enrich": 57,
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
