"""Pure parts of the YSB steady-state work: JIT share and heap readings, the error line of a failed
app's log, and the demo keeping a failed workload's logs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coordinator.commands.demo import keep_logs, log_files, with_kept_logs
from coordinator.workloads.processes import first_error_line
from coordinator.workloads.sparkcluster import SparkClusterError
from coordinator.workloads.ysb import jvmstats
from coordinator.workloads.ysb.campaigns import ad_campaign_mapping, ad_id, campaign_id
from coordinator.workloads.ysb.spark import (
    YsbOptions,
    _spark_conf,
    continuous_checkpoint_conf,
    epoch_rows_between,
    parse_epoch_offsets,
    read_epoch_offsets,
)

STAT = "4242 (C2 CompilerThre) S 1 2 3 4 5 6 7 8 9 10 1500 250 0 0 20 0 1 0 100 0 0"


def test_task_stat_reads_comm_with_spaces_and_cpu_ticks() -> None:
    assert jvmstats.parse_task_stat(STAT) == ("C2 CompilerThre", 1750.0)
    # a thread name may itself hold parentheses
    comm, ticks = jvmstats.parse_task_stat(STAT.replace("(C2 CompilerThre)", "(a (b) c)"))
    assert comm == "a (b) c" and ticks == 1750.0
    assert jvmstats.is_compiler_thread("C1 CompilerThre")
    assert not jvmstats.is_compiler_thread("Executor task l")


def test_thread_cpu_splits_compiler_threads(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(STAT.replace("C2 CompilerThre", "java").replace("1500 250", "900 0"))
    for tid, name, ticks in ((1, "java", 300), (2, "C2 CompilerThre", 100), (3, "C1 CompilerThre", 50)):
        task = tmp_path / "77" / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "stat").write_text(STAT.replace("C2 CompilerThre", name).replace("1500 250", f"{ticks} 0"))
    cpu = jvmstats.thread_cpu(77, proc=tmp_path)
    assert cpu.compiler == {2: 100 / jvmstats.CLOCK_TICKS, 3: 50 / jvmstats.CLOCK_TICKS}
    # the process total includes threads that have exited (its own stat, not the sum of live threads)
    assert cpu.total_seconds == pytest.approx(900 / jvmstats.CLOCK_TICKS)


def test_jit_share_is_compiler_cpu_over_process_cpu_between_readings() -> None:
    before = jvmstats.ThreadCpu({10: 4.0, 11: 6.0}, 100.0)
    # thread 11 retired, thread 12 started: 0.5 s on 10, 0.5 s on 12, nothing known for 11
    after = jvmstats.ThreadCpu({10: 4.5, 12: 0.5}, 120.0)
    assert jvmstats.compiler_seconds_between(before, after) == pytest.approx(1.0)
    assert jvmstats.jit_share(before, after) == pytest.approx(0.05)
    assert jvmstats.jit_share(after, after) is None


def test_jstat_columns_and_heap_in_use() -> None:
    text = (
        " S0C    S1C    S0U    S1U      EC       EU        OC         OU       MC     MU    CCSC   CCSU   YGC  "
        "   YGCT  FGC    FGCT  CGC    CGCT     GCT\n"
        "1024.0 1024.0  0.0   512.0  8192.0   2048.0   20480.0    10240.0  4480.0 4100.0 512.0  400.0   12  "
        "  0.050   1      0.020   -          -    0.070\n"
    )
    gc = jvmstats.parse_jstat(text)
    assert gc["FGC"] == 1 and gc["CGC"] == 0.0
    assert jvmstats.heap_used_mb(gc) == pytest.approx((512 + 2048 + 10240) / 1024)
    with pytest.raises(ValueError):
        jvmstats.parse_jstat("12345 not found\n")


def test_ids_are_uuid_shaped_and_encode_the_campaign() -> None:
    mapping = ad_campaign_mapping(campaigns=300, ads_per_campaign=10)
    assert len({m.ad_id for m in mapping}) == 3000
    assert mapping[2999] == type(mapping[0])(ad_id(299, 9, 10), campaign_id(299))
    assert ad_id(299, 9, 10) == "0000012b-0009-4000-8000-000000000bb7"
    assert all(len(m.ad_id) == 36 and len(m.campaign_id) == 36 for m in mapping)


def test_first_error_line_names_the_cause_not_the_shutdown(tmp_path: Path) -> None:
    err = tmp_path / "app.err"
    err.write_text(
        "26/11/23 INFO SparkContext: Running Spark\n"
        "26/11/23 ERROR Executor: Exception in task 0.0\n"
        "java.lang.OutOfMemoryError: Java heap space\n"
        "\tat org.apache.spark.broadcast.TorrentBroadcast$.blockifyObject(TorrentBroadcast.scala:365)\n"
        "26/11/23 ERROR SparkUncaughtExceptionHandler: Uncaught exception in thread\n"
        "org.apache.spark.SparkException: Job aborted\n"
    )
    out = tmp_path / "app.out"
    out.write_text("Traceback (most recent call last):\nTypeError: build_ysb() takes 5 arguments\n")
    assert first_error_line([err, out]) == "java.lang.OutOfMemoryError: Java heap space"
    assert first_error_line([tmp_path / "missing", out]) == "TypeError: build_ysb() takes 5 arguments"
    assert first_error_line([tmp_path / "missing"]) is None


def test_failed_workload_logs_are_kept_and_named(tmp_path: Path) -> None:
    # GIVEN a cluster's log directory with logs, an executor's stderr, a checkpoint and a jar
    logs = tmp_path / "scratch" / "workload"
    for name, text in {
        "master.log": "m", "app1-ysb.err": "java.lang.OutOfMemoryError: Java heap space", "app1-ysb.out": "PROGRESS",
        "worker1/app-1/0/stderr": "e", "worker1/app-1/0/ysb-sink.jar": "jar",
        "ysb-abc/checkpoint/offsets/0": "x", "local/blockmgr-1/00/shuffle_0": "x",
    }.items():
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text(text)
    assert [p.relative_to(logs).as_posix() for p in log_files(logs)] == [
        "app1-ysb.err", "app1-ysb.out", "master.log", "worker1/app-1/0/stderr",
    ]
    # WHEN the demo keeps them after the app failed
    kept = keep_logs(logs, tmp_path / "run" / "workload")
    error = SparkClusterError(f"{logs / 'app1-ysb.err'}: the YSB app exited with code 1 while running: OOM")
    named = with_kept_logs(error, logs, kept)
    # THEN the message names the kept copy, which exists, with the same exit code
    path = Path(str(named).split(":")[0])
    assert path == kept / "app1-ysb.err" and path.read_text().startswith("java.lang.OutOfMemoryError")
    assert isinstance(named, SparkClusterError) and named.exit_code == error.exit_code
    other = with_kept_logs(SparkClusterError("profiling failed"), logs, kept)
    assert str(other).endswith(f"the workload's logs are in {kept}")
    # AND only the progress output is kept when asked for .out files (a successful run)
    assert [p.name for p in log_files(keep_logs(logs, tmp_path / "ok", suffix=".out"))] == ["app1-ysb.out"]


def test_rate_offsets_count_rows_of_all_partitions() -> None:
    # each partition starts at its number and steps by the number of partitions per row
    text = 'v1\n{"batchWatermarkMs":0,"conf":{}}\n{"1":{"value":21,"runTimeMs":5},"0":{"value":40,"runTimeMs":5}}\n'
    assert parse_epoch_offsets(text, partitions=2) == 10 + 20


def test_kafka_offsets_of_a_continuous_epoch_are_the_records_read_so_far() -> None:
    # Spark's continuous Kafka reader: the next offset per partition of the topic
    text = 'v1\n{"batchWatermarkMs":0,"conf":{}}\n{"ysb":{"1":1200,"0":1350}}\n'
    assert parse_epoch_offsets(text, partitions=2) == 2550
    with pytest.raises((ValueError, TypeError, AttributeError)):
        parse_epoch_offsets('v1\n{}\n{"ysb":["0"]}\n', partitions=2)


def test_continuous_events_come_from_the_epochs_inside_the_window(tmp_path: Path) -> None:
    # GIVEN a checkpoint with epochs 1..4 (epoch 4 not committed yet) written at t = 100, 101, 102, 103
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for epoch, value in ((1, 2000), (2, 4000), (3, 6000), (4, 8000)):
        path = checkpoint / "offsets" / str(epoch)
        offsets = {"0": {"value": value, "runTimeMs": 1}, "1": {"value": value + 1, "runTimeMs": 1}}
        path.write_text(f"v1\n{{}}\n{json.dumps(offsets)}\n")
        os.utime(path, (100.0 + epoch - 1, 100.0 + epoch - 1))
        (checkpoint / "offsets" / f".{epoch}.crc").write_bytes(b"\x98")
        if epoch < 4:
            (checkpoint / "commits" / str(epoch)).write_text("v1\n{}\n")
    epochs = read_epoch_offsets(checkpoint, partitions=2)
    assert [(e.epoch, e.rows) for e in epochs] == [(1, 2000), (2, 4000), (3, 6000)]
    # WHEN the window is (100.5, 103]: THEN epochs 2 and 3 ended inside it, 4000 rows after epoch 1
    assert epoch_rows_between(epochs, 100.5, 103.0) == (4000, 2)
    assert epoch_rows_between(epochs, 99.0, 103.0) is None  # no epoch before the window
    assert epoch_rows_between(epochs, 102.5, 103.0) is None  # none inside


def test_a_continuous_checkpoint_keeps_the_epoch_before_a_long_window() -> None:
    # Spark keeps 100 epochs by default: a 900 s window of 1 s epochs would lose the one before it
    kept = int(continuous_checkpoint_conf(1.0)["spark.sql.streaming.minBatchesToRetain"])
    assert kept >= 2 * (900 + 900)  # --warmup 900 --duration 900, twice over
    assert int(continuous_checkpoint_conf(0.5)["spark.sql.streaming.minBatchesToRetain"]) == 2 * kept
    assert int(continuous_checkpoint_conf(1e6)["spark.sql.streaming.minBatchesToRetain"]) == 100
    # a micro-batch query keeps Spark's default: its state store would keep as many versions of its state
    assert "spark.sql.streaming.minBatchesToRetain" not in _spark_conf(YsbOptions())


def test_demo_engine_is_a_choice_list() -> None:
    import argparse

    from coordinator.commands.demo import DemoCommand
    from coordinator.workloads.ysb.engines import DEFAULT_ENGINE, ENGINES

    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    assert parser.parse_args([]).spe == [DEFAULT_ENGINE] == ["spark-str"]
    assert parser.parse_args(["--spe", "spark-cp"]).spe == ["spark-cp"]
    assert {"spark-str", "spark-cp"} <= set(ENGINES)
    assert {ENGINES[name].profile for name in ENGINES} == {
        "application_profiles/spark_structured_streaming.txt", "application_profiles/spark_continuous.txt",
        "application_profiles/spark_realtime.txt", "application_profiles/flink.txt",
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--spe", "storm"])


def test_process_cpu_is_user_plus_system_of_its_stat(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(STAT.replace("C2 CompilerThre", "java"))
    assert jvmstats.process_cpu_seconds(77, proc=tmp_path) == 1750 / jvmstats.CLOCK_TICKS
    assert jvmstats.process_cpu_seconds(78, proc=tmp_path) is None  # exited


def test_cpu_warmup_waits_for_the_least_run_process() -> None:
    assert jvmstats.cpu_short_of({1: 70.0, 2: 40.0}, 60.0) == 20.0
    assert jvmstats.cpu_short_of({1: 70.0, 2: 60.0}, 60.0) == 0.0
    # an executor that exited does not hold the warm-up back; with none running, all of it is lacking
    assert jvmstats.cpu_short_of({1: 70.0, 2: None}, 60.0) == 0.0
    assert jvmstats.cpu_short_of({2: None}, 60.0) == 60.0
    assert jvmstats.cpu_short_of({}, 0.0) == 0.0


class _Engine:
    """An engine whose two executors gain 10 CPU-seconds per wait."""

    def __init__(self, proc: Path) -> None:
        self.proc, self.waits = proc, 0

    def workload_pids(self) -> list[int]:
        return [11, 12]

    def wait_processing(self, seconds: float) -> None:
        self.waits += 1
        for pid, base in ((11, 30), (12, 0)):
            stat = STAT.replace("C2 CompilerThre", "java").replace("1500 250", f"{(base + 10 * self.waits) * 100} 0")
            (self.proc / str(pid)).mkdir(exist_ok=True)
            (self.proc / str(pid) / "stat").write_text(stat)


def test_demo_cpu_warmup_ends_when_every_executor_reached_the_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coordinator.commands import demo

    monkeypatch.setattr(jvmstats, "CLOCK_TICKS", 100)
    real = jvmstats.process_cpu_seconds
    monkeypatch.setattr(jvmstats, "process_cpu_seconds", lambda pid: real(pid, proc=tmp_path))
    engine = _Engine(tmp_path)
    said: list[str] = []
    demo.warm_up_cpu(engine, 45.0, said.append, every=0.0)  # type: ignore[arg-type]
    assert engine.waits == 5  # executor 12 reaches 45 CPU-seconds only at the fifth wait (50)
    assert said[-1].startswith("demo: every executor has used 45 CPU-seconds")
    demo.warm_up_cpu(engine, 0.0, said.append)  # type: ignore[arg-type]
    assert engine.waits == 5
