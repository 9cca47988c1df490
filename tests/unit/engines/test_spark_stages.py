"""Spark task context: thread names → stages, the driver's REST payloads (recorded from the demo's
Spark 4.3 driver in tests/data/spark_rest) → stage/job/batch and codegen operators, stage rows,
codegen frame names and the drafted profile."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from coordinator.analysis.draft import draft_profile
from coordinator.analysis.offcpucut import context_offcpu
from coordinator.analysis.stages import (
    PidStages,
    SparkIndex,
    annotate_codegen_frames,
    spark_index,
    stage_lines,
    stage_offcpu,
    stage_rows,
    stage_task_counts,
)
from profiler.capture.format import UNMATCHED
from profiler.capture.offcpu import OffCpuEntry
from profiler.engines.sparkplan import SparkPlan, codegen_operators, codegen_stage_of, parse_task_thread, plan_operators
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher

REST = Path(__file__).resolve().parents[2] / "data" / "spark_rest"
GEN = "org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage{}::processNext"
TASK_ROOT = "Executor task launch worker"


def _load(name: str) -> Any:
    return json.loads((REST / name).read_text(encoding="utf-8"))


def recorded_plan() -> dict[str, Any]:
    plan = SparkPlan("http://127.0.0.1:4040", "app-1", {}, {}, {})
    todo = plan.read_listing(_load("stages.json"), _load("jobs.json"), _load("sql.json"))
    assert 1 in todo
    plan.executions[1]["codegen"] = codegen_operators(_load("sql_1.json"))
    plan.executions[1]["operators"] = plan_operators(_load("sql_1.json"))
    return {"format_version": 1, "plans": [plan.to_json()], "notes": []}


def test_task_thread_names_give_stage_and_tid() -> None:
    task = parse_task_thread("Executor task launch worker for task 3.0 in stage 12.1 (TID 56)")
    assert task is not None and (task.stage, task.stage_attempt, task.partition, task.tid) == (12, 1, 3, 56)
    assert task.stage_label == "12.1"
    assert parse_task_thread("Executor task launch worker-0") is None
    assert codegen_stage_of(GEN.format(12)) == 12 and codegen_stage_of("Foo::bar") is None


def test_codegen_operators_from_the_plan_graph_and_from_plan_text() -> None:
    assert plan_operators(_load("sql_1.json"))[:3] == ["Range", "Filter", "Project"]  # inputs first
    operators = codegen_operators(_load("sql_1.json"))
    assert operators[2] == ["Project", "BroadcastHashJoin"]
    assert operators[4] == ["Filter", "Project", "HashAggregate"]
    text = {"planDescription": "*(1) Project [a]\n+- *(1) Filter (x)\n   +- *(2) HashAggregate(keys=[])"}
    assert codegen_operators(text) == {1: ["Project", "Filter"], 2: ["HashAggregate"]}


def test_recorded_rest_payloads_join_stage_to_job_execution_and_batch() -> None:
    index = spark_index([recorded_plan()])
    assert index.reachable
    stage = index.stage(0)
    assert (stage.job, stage.execution, stage.batch, stage.query) == (0, 1, 0, "ysb")
    assert index.operators(2) == ("Project", "BroadcastHashJoin")
    assert index.operators(2, stage_id=0) == ("Project", "BroadcastHashJoin")
    names = annotate_codegen_frames([GEN.format(2), "java.lang.Thread::run"], index)
    assert names == [GEN.format(2) + " [codegen stage 2: Project, BroadcastHashJoin]", "java.lang.Thread::run"]


def test_no_rest_api_leaves_stage_ids_and_says_why() -> None:
    index = spark_index([{"format_version": 1, "plans": [], "notes": ["no Spark driver REST API answered"]}])
    assert not index.reachable and index.notes == ("no Spark driver REST API answered",)
    assert index.stage(7).job is None
    assert annotate_codegen_frames([GEN.format(2)], index) == [GEN.format(2)]


def test_stage_rows_cut_each_executor_by_stage_and_sum_cycles_by_samples() -> None:
    # GIVEN two executors whose task threads ran stage 0 (two tasks) and stage 1
    contexts = Counter({
        ("Executor task launch worker for task 0.0 in stage 0.0 (TID 1)", f"{TASK_ROOT};{GEN.format(2)}"): 6,
        ("Executor task launch worker for task 1.0 in stage 0.0 (TID 2)", f"{TASK_ROOT};json"): 2,
        ("Executor task launch worker for task 0.0 in stage 1.0 (TID 3)", f"{TASK_ROOT};state"): 4,
    })
    tasks = {f"{TASK_ROOT};{GEN.format(2)}": "Join", f"{TASK_ROOT};json": "Deserialize", f"{TASK_ROOT};state": "Window"}
    by_context: dict[str, Counter[str]] = {}
    for (context, stack), count in contexts.items():
        by_context.setdefault(context, Counter())[tasks[stack]] += count
    counts = stage_task_counts(by_context)
    assert counts == {"0.0": Counter({"Join": 6, "Deserialize": 2}), "1.0": Counter({"Window": 4})}
    pids = [PidStages(20, 2000.0, 2.0, True, counts), PidStages(10, None, None, None, {"0.0": Counter({"Join": 2})})]
    # WHEN the rows are made with the driver's view
    rows = stage_rows("run1", ["Deserialize", "Join", "Window", UNMATCHED], pids, spark_index([recorded_plan()]))
    by_key = {(r["stage"], r["task"]): r for r in rows}
    # THEN shares are of the stage's samples, cycles each PID's split by its samples
    assert by_key[("0.0", "Join")]["samples"] == 8 and by_key[("0.0", "Join")]["share"] == 0.8
    assert by_key[("0.0", "Join")]["cycles"] == 600.0  # 6/20 of 2000; the second PID has no cycles
    assert by_key[("0.0", "*")]["samples"] == 10 and by_key[("0.0", "*")]["job"] == 0
    assert by_key[("0.0", "*")]["batch"] == 0 and by_key[("1.0", "*")]["job"] is None
    lines = stage_lines({k: str(v) if v is not None else "" for k, v in r.items()} for r in rows)
    assert [line.stage for line in lines] == ["0.0", "1.0"]
    assert lines[0].top_tasks == (("Join", 0.8), ("Deserialize", 0.2)) and lines[0].query == "ysb"


def test_a_drafted_profile_names_codegen_stages_by_their_operators_and_leaves_little_unmatched() -> None:
    stacks = Counter({
        f"{TASK_ROOT};org.apache.spark.executor.Executor$TaskRunner::run;{GEN.format(2)}": 50,
        f"{TASK_ROOT};org.apache.spark.executor.Executor$TaskRunner::run;{GEN.format(2)};"
        "org.apache.spark.sql.catalyst.json.JacksonParser::parse": 20,
        f"{TASK_ROOT};org.apache.spark.executor.Executor$TaskRunner::run;"
        "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider::put": 10,
        f"{TASK_ROOT};org.apache.spark.executor.Executor$TaskRunner::run;java.util.HashMap::get": 5,
        "GC Thread#0;G1ParScanThreadState::trim_queue": 8,
        "dispatcher-event-loop-1;java.lang.Object::wait": 7,
    })
    draft = draft_profile(stacks, spark_index([recorded_plan()]), "test")
    shares = {task: share for task, _n, share in draft.shares}
    assert "Codegen 2 (Project + BroadcastHashJoin)" in shares
    assert shares["JSON parse/format (from_json, to_json)"] == 0.2
    assert "State store (StateStoreRestore/Save) [plan StateStoreRestore + StateStoreSave]" in shares
    assert all(n > 0 for task, n, _s in draft.shares if task != UNMATCHED)  # every task gets samples
    assert draft.unmatched_share < 0.10
    assert draft.profile.task_names[0].startswith("JSON")


def test_a_draft_without_a_plan_still_separates_codegen_stages() -> None:
    stacks = Counter({f"{TASK_ROOT};{GEN.format(1)}": 3, f"{TASK_ROOT};{GEN.format(11)}": 2})
    draft = draft_profile(stacks, SparkIndex())
    shares = {task: n for task, n, _s in draft.shares}
    assert shares == {"Codegen 1 (operators unknown)": 3, "Codegen 11 (operators unknown)": 2, UNMATCHED: 0}


def _driver(pid: int) -> Any:
    from profiler.capture.format import ProcessInfo

    return ProcessInfo(pid, "managing", "spark", "driver", "root", "java org.apache.spark.deploy.SparkSubmit", 0.0, 0.0)


def test_collector_without_a_reachable_rest_api_says_why_and_never_fails() -> None:
    import os

    from profiler.engines.sparkplan import SparkPlanCollector

    # GIVEN a Spark driver (this very process: it listens on no port) and a fetch that is never reached
    collector = SparkPlanCollector(fetch=lambda url: (_ for _ in ()).throw(AssertionError(url)), poll_seconds=60)
    collector.start([_driver(os.getpid())])
    # WHEN the window ends
    payload = collector.finish()
    # THEN spark.json holds no plan and one line saying why
    assert payload is not None and payload["plans"] == []
    assert "no Spark driver REST API answered" in payload["notes"][0] and str(os.getpid()) in payload["notes"][0]
    # AND without any Spark driver in the scope there is no spark.json at all
    assert SparkPlanCollector(poll_seconds=60).finish() is None


def test_collector_reads_stages_jobs_and_plans_from_the_rest_api(monkeypatch: Any) -> None:
    import profiler.engines.sparkplan as sparkplan

    base = "http://127.0.0.1:4040/api/v1/applications/app-1"
    answers = {
        f"{base}/stages": _load("stages.json"),
        f"{base}/jobs": _load("jobs.json"),
        f"{base}/sql?details=false&planDescription=false&offset=0&length=1000000": _load("sql.json"),
        f"{base}/sql/0?details=true&planDescription=true": _load("sql_1.json"),
        f"{base}/sql/1?details=true&planDescription=true": _load("sql_1.json"),
    }
    monkeypatch.setattr(sparkplan, "discover_spark", lambda process, fetch, *rest: ("http://127.0.0.1:4040", "app-1"))
    collector = sparkplan.SparkPlanCollector(fetch=answers.__getitem__, poll_seconds=60)
    collector.start([_driver(1)])
    payload = collector.finish()
    assert payload is not None and payload["notes"] == []
    index = spark_index([payload])
    assert index.stage(0).batch == 0 and index.operators(4) == ("Filter", "Project", "HashAggregate")
    assert {"MicroBatchScan", "Exchange", "WriteToDataSourceV2"} <= index.plan_operators


def test_stage_rows_carry_the_task_threads_blocked_time_by_stage_task_and_cause() -> None:
    # GIVEN blocked time of three task threads (stages 0.0 and 2.0, the latter never sampled on a CPU)
    # and of a thread that ran no Spark task, one executor measured off-CPU, one not
    matcher = Matcher(parse_profile("Fetch: ShuffleBlockFetcherIterator\nJoin: HashJoin\n"))
    entries = [
        OffCpuEntry("park", f"{TASK_ROOT};ShuffleBlockFetcherIterator::next;Unsafe::park", 3_000_000_000, 5,
                    "Executor task launch worker for task 0.0 in stage 0.0 (TID 1)"),
        OffCpuEntry("net", f"{TASK_ROOT};HashJoin::probe;sock_read", 1_000_000_000, 2,
                    "Executor task launch worker for task 1.0 in stage 0.0 (TID 2)"),
        OffCpuEntry("sleep", f"{TASK_ROOT};Thread::sleep", 2_000_000_000, 1,
                    "Executor task launch worker for task 0.0 in stage 2.0 (TID 3)"),
        OffCpuEntry("lock", "VM Thread;futex_wait_[k]", 9_000_000_000, 1),
    ]
    blocked = stage_offcpu(context_offcpu(entries, matcher))
    pids = [
        PidStages(20, 2000.0, 2.0, True, {"0.0": Counter({"Join": 10})}, blocked),
        PidStages(10, None, None, None, {"0.0": Counter({"Join": 2})}, None),
    ]
    # WHEN the stage rows are made
    rows = stage_rows("run1", ["Fetch", "Join", UNMATCHED], pids, SparkIndex())
    by_key = {(r["stage"], r["task"]): r for r in rows}
    # THEN each stage's task rows hold their threads' blocked seconds by cause, the stage row the sum
    assert by_key[("0.0", "Fetch")]["offcpu_seconds"] == 3.0 and by_key[("0.0", "Fetch")]["offcpu_park_seconds"] == 3.0
    assert by_key[("0.0", "Join")]["offcpu_net_seconds"] == 1.0 and by_key[("0.0", "Join")]["samples"] == 12
    assert by_key[("0.0", "*")]["offcpu_seconds"] == 4.0 and by_key[("0.0", UNMATCHED)]["offcpu_seconds"] == 0.0
    assert by_key[("2.0", "*")]["offcpu_sleep_seconds"] == 2.0 and by_key[("2.0", "*")]["samples"] == 0
    # a run without --off-cpu leaves the columns empty (not measured), as the task rows do
    unmeasured = stage_rows("run1", ["Join"], [PidStages(20, None, None, None, {"0.0": Counter({"Join": 1})})],
                            SparkIndex())
    assert all(row.get("offcpu_seconds") is None for row in unmeasured)
