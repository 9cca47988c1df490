"""Flink operators inside a chain on TaskManagers started as in production, without
-XX:+PreserveFramePointer (issue 30): the HotSpot unwinder walks their JIT code, expands the methods C2
inlined, and `coordinator analyze --by vertex` gives each vertex's samples to its operators, leaving at
most 10 % "chain, operator unknown". Two jobs: the YSB demo's job (its functions kept out of line with
`dontinline ysb.*`, as the demo runs it), read from the session's `coordinator demo --spe flink
--no-frame-pointers` (tests/fixtures/flink.py, which test_flink reads too), and ChainJob
(tests/workloads/ChainJob.java) on the session's Flink cluster (its JVMs without frame pointers, shared
with test_flink), whose map/filter/keyed functions the JIT is free to inline."""

from __future__ import annotations

import csv
import time
from collections import Counter
from pathlib import Path

from coordinator.analysis.flinkdraft import MAILBOX_WAIT, OPERATOR_UNKNOWN
from coordinator.cli import main as coordinator_main
from coordinator.workloads.flinkcluster import LocalFlinkCluster
from coordinator.workloads.ysb.flink import PACER_SOURCE
from coordinator.workloads.ysb.javabuild import compile_jar
from profiler.capture.read import (
    read_flink_placement,
    read_flink_vertices,
    read_pid_table,
    read_sampler_stats,
    read_scope,
)
from profiler.unwind.hotspot import INLINED_MARK
from tests.fixtures.flink import TimedDemoRun, profile_flink_cluster
from tests.fixtures.jvm import without_approximate

CHAIN_JOB = Path(__file__).resolve().parents[1] / "workloads" / "ChainJob.java"
CHAIN_SOURCES = (CHAIN_JOB, PACER_SOURCE)  # its source is paced by the YSB demo's pacer, compiled in
CHAIN_CLASS = "taskprof.test.ChainJob"
MAX_UNKNOWN = 0.10  # issue 30: at most 10 % of a vertex's samples "chain, operator unknown"
WARMUP_S = 25  # C2 compiles (and inlines) the hot paths in the first seconds
# The checks below are on samples per vertex (at least 30, and the unknown share against 10 % plus its
# sampling error): a vertex's samples are the frequency times its threads' CPU-seconds, so the YSB demo's
# 30 s at 199 Hz expect what 60 s at the default 99 Hz gave (the smallest vertex measured: 48 samples, at
# load 30-40). ChainJob's source is paced (10,000 orders/s), its vertices' CPU-seconds per second steady
# once warmed up, so its 15 s at 397 Hz expect the same counts again (5,955 sample slots per CPU-second
# against 5,970) in half the window. Its profiler starts during its warm-up (--start-at), its window
# beginning where the warm-up ends.
CHAIN_WINDOW_S = 15
CHAIN_FREQUENCY = 397


def _operator_shares(run: Path, out: Path) -> dict[str, dict[str, tuple[int, float]]]:
    """Vertex → operator → (samples, share of the vertex), from `coordinator analyze --by vertex`."""
    assert coordinator_main(["analyze", str(run), "--by", "vertex", "--out", str(out)]) == 0
    with open(out / "summary.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["vertex"] and r["subtask"] == "*" and r["operator"]]
    found: dict[str, dict[str, tuple[int, float]]] = {}
    for row in rows:
        found.setdefault(row["vertex"], {})[row["operator"]] = (int(row["samples"]), float(row["share"] or 0.0))
    return found


def _check_walked_without_frame_pointers(run: Path, taskmanager_pids: list[int]) -> None:
    taskmanagers = set(taskmanager_pids)
    processes = {p.pid: p for p in read_scope(run)}
    assert len(taskmanagers) == 2 and taskmanagers <= set(processes), (taskmanagers, processes)
    for pid in taskmanagers:
        assert processes[pid].preserve_frame_pointer is False, processes[pid]
        stats = read_sampler_stats(run, pid)
        assert stats is not None and stats.hotspot_steps.get("compiled", 0) > 0, stats


def _check_vertices(shares: dict[str, dict[str, tuple[int, float]]], vertices: set[str]) -> None:
    print("issue 30 operators per vertex (samples, share):", shares)
    assert set(shares) == vertices, shares
    for vertex, by_operator in shares.items():
        total = sum(n for n, _share in by_operator.values())
        assert total >= 30, f"{vertex}: only {total} samples, too few to judge"
        unknown = by_operator.get(OPERATOR_UNKNOWN, (0, 0.0))[1]
        # the vertex's share is to be at most 10 %; its samples measure it within their sampling error, so
        # fail when the observed share is above 10 % by more than that (one-sided 99 %: a vertex of 48
        # samples shows 16.7 % about one time in ten at a true 10 %; a regression to 30 % still fails)
        bound = MAX_UNKNOWN + 2.33 * (MAX_UNKNOWN * (1 - MAX_UNKNOWN) / total) ** 0.5
        assert unknown <= bound, f"{vertex}: {unknown:.1%} chain, operator unknown (> {bound:.1%}): {by_operator}"
        operators = {name: n for name, (n, _s) in by_operator.items() if name not in (OPERATOR_UNKNOWN, MAILBOX_WAIT)}
        assert sum(operators.values()) >= 0.5 * total, by_operator


def test_ysb_operators_without_frame_pointers(flink_production_demo: TimedDemoRun, tmp_path: Path) -> None:
    # GIVEN the YSB job (20,000 events/s) on TaskManagers without -XX:+PreserveFramePointer, warmed up 25 s
    # or more from RUNNING; WHEN it is profiled and cut by vertex and operator: the session's Flink demo
    # (tests/fixtures/flink.py: its window 30 s at 199 Hz, the samples of 60 s at 99 Hz), read only
    flink_production_demo.check_succeeded()
    run = flink_production_demo.out
    (capture,) = (run / "hosts").glob("*")
    _, managers = read_flink_placement(capture)
    _check_walked_without_frame_pointers(capture, sorted(m.pid for m in managers))
    # THEN every vertex has at most 10 % of its samples "chain, operator unknown"
    vertices = {v.name for v in read_flink_vertices(capture)}
    shares = _operator_shares(run, tmp_path / "by-vertex")
    _check_vertices(shares, vertices)
    # AND the source chain's steps after the generator are found too, not only the first ones
    source = next(v for v in shares if v.startswith("Source: YSB generator"))
    assert shares[source]["DeserializeBolt"][0] > 0 and shares[source]["RedisJoinBolt"][0] > 0, shares[source]


def _chain_job(cluster: LocalFlinkCluster) -> str:
    jar = compile_jar(CHAIN_SOURCES, str(cluster.home / "lib" / "*"), "chain-job",
                      sorted(p.name for p in (cluster.home / "lib").glob("flink-dist-*.jar")))
    job_id = cluster.submit_jar(jar, CHAIN_CLASS, ["--rate", "10000", "--parallelism", "2"])
    cluster.wait_for_job_running(job_id)
    return job_id


def _inlined_user_frames(run: Path, pids: list[int]) -> Counter[str]:
    """Samples per ChainJob function frame the walker expanded from an inlined scope."""
    found: Counter[str] = Counter()
    for pid in pids:
        table = read_pid_table(run, pid)
        assert table is not None
        for stack, count in table.folded().items():
            for frame in set(stack.split(";")):
                if frame.startswith("taskprof.test.ChainJob$") and without_approximate(frame).endswith(INLINED_MARK):
                    found[frame.split("::")[0].rsplit("$", 1)[-1]] += count
    return found


def test_inlined_operators_without_frame_pointers(flink_cluster: LocalFlinkCluster, tmp_path: Path) -> None:
    # GIVEN ChainJob (Orders -> ParseOrder -> ValidOrder -> PriceOrder, keyBy, RunningTotal -> Discard),
    # no dontinline for its classes, on TaskManagers without -XX:+PreserveFramePointer, warmed up
    job_id = _chain_job(flink_cluster)
    try:
        # WHEN it is profiled (from WARMUP_S after RUNNING on) and cut by vertex and operator
        profile_flink_cluster(
            flink_cluster, tmp_path / "run", CHAIN_WINDOW_S, CHAIN_FREQUENCY, start_at=time.time() + WARMUP_S
        )
        assert flink_cluster.job(job_id).get("state") == "RUNNING"
    finally:
        flink_cluster.cancel(job_id)
    run = tmp_path / "run"
    _check_walked_without_frame_pointers(run, flink_cluster.taskmanager_pids())
    # THEN C2 inlined the job's functions and the walker expanded them from the nmethods' scopes
    inlined = _inlined_user_frames(run, flink_cluster.taskmanager_pids())
    print("issue 30 ChainJob functions seen as inlined frames (samples):", dict(inlined))
    assert {"ParseOrder", "PriceOrder", "RunningTotal"} <= set(inlined), inlined
    # AND every vertex has at most 10 % "chain, operator unknown", each function its operator's samples
    vertices = {v.name for v in read_flink_vertices(run)}
    assert vertices == {"Source: Orders -> ParseOrder -> ValidOrder -> PriceOrder", "RunningTotal -> Discard: Writer"}
    shares = _operator_shares(run, tmp_path / "by-vertex")
    _check_vertices(shares, vertices)
    for vertex, operator in (("Source: Orders -> ParseOrder -> ValidOrder -> PriceOrder", "ParseOrder"),
                             ("Source: Orders -> ParseOrder -> ValidOrder -> PriceOrder", "PriceOrder"),
                             ("RunningTotal -> Discard: Writer", "RunningTotal")):
        assert shares[vertex][operator][1] >= 0.15, shares[vertex]
