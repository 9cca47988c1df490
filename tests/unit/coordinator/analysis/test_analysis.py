"""Pure pieces of the analysis pipeline (no Spark): row math, host and cluster totals, labels,
run comparison and CSV text, on crafted inputs with known answers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from coordinator.analysis import compare, inputs
from coordinator.analysis import rows as summary_rows
from coordinator.analysis.inputs import PidTaskCounts
from coordinator.analysis.rows import TaskTotals
from profiler.capture import format as capture
from profiler.capture.format import EventCount
from profiler.errors import ConfigError
from tests.fixtures.captures import (
    KNOWN_PROFILE,
    TINY_DRIVER,
    TINY_PID_100,
    TINY_PID_200,
    PidSpec,
    write_capture,
    write_run_dir,
)

TASKS = ("Kafka", "Deserialize", "GC", "unmatched")


def _tiny(tmp_path: Path) -> inputs.RunInput:
    run_dir = write_run_dir(
        tmp_path / "tiny",
        "tiny",
        {"h1": [TINY_DRIVER, TINY_PID_100, TINY_PID_200]},
        labels={"load": "10k", "engine": "spark"},
        events={"h1": 1000},
    )
    (run,) = inputs.read_inputs([run_dir])
    return run


def _counts(run: inputs.RunInput) -> dict[int, PidTaskCounts]:
    """What the Spark job returns for tiny_run, written out by hand."""
    keys = {p.process.pid: p.key for p in run.pids}
    return {
        keys[100]: PidTaskCounts({"Kafka": 60, "Deserialize": 30, "GC": 10}, {"Deserialize": 10}),
        keys[200]: PidTaskCounts({"Kafka": 25, "unmatched": 75}),
    }


def _find(rows: list[dict], host: str, pid: object, task: str) -> dict:
    (row,) = [r for r in rows if r["host"] == host and r["pid"] == pid and r["task"] == task]
    return row


def test_read_inputs_types_the_run(tmp_path: Path) -> None:
    run = _tiny(tmp_path)
    assert run.run == "tiny"
    assert run.labels == {"load": "10k", "engine": "spark"}
    assert [h.host for h in run.hosts] == ["h1"]
    assert sorted(p.process.pid for p in run.pids) == [50, 100, 200]
    by_pid = {p.process.pid: p for p in run.pids}
    assert by_pid[50].stacks is None  # managing: never sampled
    assert by_pid[100].stacks is not None and by_pid[100].stacks.is_file()
    assert by_pid[100].counters is not None and by_pid[100].counters.cycles == 1.0e9
    assert run.events == 1000
    assert len({p.key for p in run.pids}) == 3


def test_three_stacks_give_exact_shares_and_cycles(tmp_path: Path) -> None:
    # GIVEN pid 100 with 60/30/10 samples in Kafka/Deserialize/GC and 1e9 cycles
    run = _tiny(tmp_path)
    rows = summary_rows.run_rows(run, TASKS, _counts(run))
    # THEN shares are the sample fractions and cycles share × PID cycles, exactly
    kafka = _find(rows, "h1", 100, "Kafka")
    assert (kafka["samples"], kafka["share"], kafka["cycles"]) == (60, 0.6, 0.6e9)
    assert kafka["cpu_seconds"] == pytest.approx(0.3)
    deser = _find(rows, "h1", 100, "Deserialize")
    assert (deser["samples"], deser["share"], deser["cycles"], deser["multi_task_samples"]) == (30, 0.3, 0.3e9, 10)
    gc = _find(rows, "h1", 100, "GC")
    assert (gc["samples"], gc["cycles"]) == (10, 0.1e9)
    assert _find(rows, "h1", 100, "unmatched")["samples"] == 0
    total = _find(rows, "h1", 100, "*")
    assert (total["samples"], total["cycles"], total["ipc"], total["bytes_sent"]) == (100, 1.0e9, 2.0, 1000)
    assert total["cycles_per_event"] == 1.0e6  # 1e9 cycles / 1000 events
    assert total["bytes_per_event"] == 3.0  # (1000 + 2000) bytes / 1000 events
    assert kafka["bytes_sent"] is None  # bytes only on the totals rows


def test_cluster_rows_sum_cycles_and_pool_samples(tmp_path: Path) -> None:
    run = _tiny(tmp_path)
    rows = summary_rows.run_rows(run, TASKS, _counts(run))
    kafka = _find(rows, "*", "*", "Kafka")
    # 60 + 25 samples of 200; cycles 0.6e9 + 0.25 × 4e8
    assert kafka["samples"] == 85
    assert kafka["share"] == 85 / 200
    assert kafka["cycles"] == pytest.approx(0.7e9)
    unmatched = _find(rows, "*", "*", "unmatched")
    assert (unmatched["samples"], unmatched["cycles"]) == (75, pytest.approx(3.0e8))
    total = _find(rows, "*", "*", "*")
    # The managing driver (1e8 cycles) is not part of the workload totals.
    assert (total["samples"], total["cycles"], total["share"]) == (200, pytest.approx(1.4e9), 1.0)
    assert total["ipc"] == 2.0  # only pid 100 measured instructions
    assert total["bytes_sent"] == 1000
    # Host rows equal the cluster rows for a one-host run, and task rows add up to the total.
    assert _find(rows, "h1", "*", "Kafka")["cycles"] == kafka["cycles"]
    task_cycles = sum(r["cycles"] for r in rows if r["host"] == "*" and r["task"] != "*")
    assert task_cycles == pytest.approx(total["cycles"])
    assert _find(rows, "h1", 50, "*")["samples"] is None


def test_group_rows_over_hosts_with_estimated_and_missing_cycles() -> None:
    def pid_row(host: str, pid: int, task: str, samples: int, cycles: float | None, estimated: bool) -> dict:
        return {
            "run": "r",
            "host": host,
            "pid": pid,
            "role": "workload",
            "engine": "flink",
            "task": task,
            "samples": samples,
            "cycles": cycles,
            "cycles_estimated": estimated if cycles is not None else None,
        }

    rows = [
        pid_row("a", 1, "T", 30, 300.0, False),
        pid_row("a", 1, "unmatched", 10, 100.0, False),
        pid_row("a", 1, "*", 40, 400.0, False),
        pid_row("b", 2, "T", 10, None, False),  # no counters on this PID
        pid_row("b", 2, "unmatched", 50, None, False),
        pid_row("b", 2, "*", 60, None, False),
        pid_row("c", 3, "T", 0, 0.0, True),
        pid_row("c", 3, "unmatched", 0, 0.0, True),
        pid_row("c", 3, "*", 0, 0.0, True),
    ]
    out = summary_rows.group_rows("r", "*", ("T", "unmatched"), rows, events=None, host_state=None)
    t = next(r for r in out if r["task"] == "T")
    assert (t["samples"], t["share"], t["cycles"], t["cycles_estimated"]) == (40, 0.4, 300.0, True)
    assert t["engine"] == "flink"
    assert t["cycles_per_event"] is None and t["events"] is None
    total = out[-1]
    assert (total["task"], total["samples"], total["cycles"]) == ("*", 100, 400.0)


def test_group_rows_without_measured_cycles_stay_empty() -> None:
    rows = [
        {"run": "r", "host": "a", "pid": 1, "role": "workload", "task": t, "samples": s, "cycles": None}
        for t, s in (("T", 5), ("unmatched", 5), ("*", 10))
    ]
    out = summary_rows.group_rows("r", "a", ("T", "unmatched"), rows, events=10, host_state="ok")
    assert all(r["cycles"] is None and r["cycles_per_event"] is None for r in out)
    assert out[0]["share"] == 0.5


def test_run_events_takes_the_largest_count_never_the_sum() -> None:
    counts = [EventCount(1000, "spark-rest"), EventCount(None, "none"), None, EventCount(1000, "spark-rest")]
    assert inputs.run_events(counts) == 1000
    assert inputs.run_events([None, EventCount(None, "none")]) is None


def test_failed_host_is_listed_with_its_state(tmp_path: Path) -> None:
    run_dir = write_run_dir(
        tmp_path / "r", "r", {"h1": [TINY_PID_200]}, failed_hosts={"h9": "unreachable: connection refused"}
    )
    (run,) = inputs.read_inputs([run_dir])
    rows = summary_rows.run_rows(run, TASKS, {})
    failed = _find(rows, "h9", "*", "*")
    assert failed["host_state"] == "failed" and failed["samples"] is None
    assert _find(rows, "h1", "*", "*")["host_state"] == "ok"
    # no counts from Spark for pid 200 -> zero samples, share unknown
    assert _find(rows, "h1", 200, "Kafka")["share"] is None


def test_bare_capture_is_a_one_host_run(tmp_path: Path) -> None:
    capture_dir = write_capture(tmp_path / "cap", "node7", [PidSpec(9, {"a;b": 1}, cycles=1.0)])
    (run,) = inputs.read_inputs([capture_dir])
    assert run.run == "cap" and [h.host for h in run.hosts] == ["node7"]
    assert run.profile_copies == (capture_dir / "application_profile.txt",)


def test_inputs_reject_unknown_directories_and_duplicate_run_ids(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a run directory"):
        inputs.read_inputs([tmp_path])
    a = write_run_dir(tmp_path / "a", "same", {"h": [TINY_PID_200]})
    b = write_run_dir(tmp_path / "b", "same", {"h": [TINY_PID_200]})
    with pytest.raises(ConfigError, match="also the run id"):
        inputs.read_inputs([a, b])


def test_profile_resolution(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", "a", {"h": [TINY_PID_200]})
    b = write_run_dir(tmp_path / "b", "b", {"h": [TINY_PID_200]}, profile_text="Other: x\n")
    runs = inputs.read_inputs([a, b])
    with pytest.raises(ConfigError, match="different application profiles"):
        inputs.resolve_profile_text(runs, None)
    text, source = inputs.resolve_profile_text(runs[:1], None)
    assert text == KNOWN_PROFILE and source.endswith("a/application_profile.txt")
    edited = tmp_path / "p.txt"
    edited.write_text("X: y\n")
    assert inputs.resolve_profile_text(runs, edited) == ("X: y\n", str(edited))


def test_label_columns_never_shadow_fixed_columns() -> None:
    run = inputs.RunInput("r", Path("."), {"engine": "flink", "load": "1", "label_x": "2"}, (), ())
    assert summary_rows.label_columns([run]) == {"engine": "label_engine", "label_x": "label_label_x", "load": "load"}


def test_summary_csv_is_deterministic_and_labelled(tmp_path: Path) -> None:
    run = _tiny(tmp_path)
    rows = summary_rows.run_rows(run, TASKS, _counts(run))
    columns = summary_rows.label_columns([run])
    text = summary_rows.format_summary(rows, columns)
    assert text == summary_rows.format_summary(summary_rows.run_rows(run, TASKS, _counts(run)), columns)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0])[: len(summary_rows.SUMMARY_COLUMNS)] == list(summary_rows.SUMMARY_COLUMNS)
    assert {r["label_engine"] for r in parsed} == {"spark"} and {r["load"] for r in parsed} == {"10k"}
    first = parsed[0]
    assert (first["host"], first["pid"], first["task"]) == ("*", "*", "Kafka")
    assert first["share"] == "0.425" and first["cycles"] == "700000000" and first["cycles_estimated"] == "0"


def test_task_file_names_are_safe_and_unique() -> None:
    names = summary_rows.task_file_names(["Filter+Projection+Join", "JIT compiler", "a/b", "a b", "..", "A_B"])
    assert names["Filter+Projection+Join"] == "Filter+Projection+Join.folded"
    assert names["JIT compiler"] == "JIT_compiler.folded"
    assert names["a/b"] == "a_b.folded" and names["a b"] == "a_b_2.folded"
    assert names[".."] == "task.folded"
    assert names["A_B"] == "A_B_3.folded"  # case-insensitive file systems
    assert len(set(names.values())) == len(names)


def test_compare_flags_a_large_share_difference_only() -> None:
    # A: 3000/10000 in T; B: 3600/10000 -> z ≈ 9, significant; U: 1000 vs 1010 -> not significant
    a = {
        "T": TaskTotals(3000, 10000, 3.0e9, 0.3),
        "U": TaskTotals(1000, 10000, 1.0e9, 0.1),
        "*": TaskTotals(10000, 10000, 1.0e10, 1.0),
    }
    b = {
        "T": TaskTotals(3600, 10000, 4.5e9, 0.36),
        "U": TaskTotals(1010, 10000, 1.2e9, 0.101),
        "New": TaskTotals(5, 10000, 1.0e6, 0.0005),
        "*": TaskTotals(10000, 10000, 1.2e10, 1.0),
    }
    rows = {r["task"]: r for r in compare.compare_runs(a, b)}
    assert list(rows) == ["T", "U", "New", "*"]
    t = rows["T"]
    assert t["significant"] is True and t["z"] > 8
    assert t["cycles_delta"] == 1.5e9 and t["cycles_relative_delta"] == 0.5
    assert t["share_delta"] == pytest.approx(0.06)
    assert rows["U"]["significant"] is False and rows["U"]["p_value"] > 0.5
    assert rows["New"]["samples_a"] == 0 and rows["New"]["cycles_a"] is None and rows["New"]["cycles_delta"] is None
    assert rows["*"]["z"] is None
    text = compare.format_compare_table(list(rows.values()), "A", "B")
    assert "T " in text and "+50.0%" in text
    csv_text = compare.format_compare_csv(list(rows.values()))
    assert csv_text.splitlines()[0] == ",".join(compare.COMPARE_COLUMNS)


def test_cluster_totals_from_summary_rows(tmp_path: Path) -> None:
    run = _tiny(tmp_path)
    text = summary_rows.format_summary(summary_rows.run_rows(run, TASKS, _counts(run)), {})
    path = tmp_path / "summary.csv"
    path.write_text(text)
    totals = summary_rows.cluster_totals(summary_rows.read_summary(path))
    assert totals["Kafka"] == TaskTotals(85, 200, 7.0e8, 0.425)
    assert totals["*"].samples == 200
    with pytest.raises(ConfigError, match="2 runs"):
        summary_rows.cluster_totals([{"host": "*", "pid": "*", "run": "a"}, {"host": "*", "pid": "*", "run": "b"}])


def test_command_argument_types() -> None:
    import argparse

    from coordinator.commands.analyze import label, master_url
    from coordinator.commands.compare import probability

    for good in ("local", "local[*]", "local[2]", "local[4,3]", "spark://head:7077", "yarn", "k8s://https://k:6443"):
        assert master_url(good) == good
    for bad in ("foo", "local[0]", "local[x]", "spark:/head", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            master_url(bad)
    assert label("load=50k") == ("load", "50k") and label("engine=") == ("engine", "")
    for bad in ("noequals", "=v", "9key=v", "a b=c"):
        with pytest.raises(argparse.ArgumentTypeError):
            label(bad)
    assert probability("0.01") == 0.01
    for bad in ("1.5", "1", "0", "nan", "x"):  # an open interval: bounded(..., exclusive=True)
        with pytest.raises(argparse.ArgumentTypeError):
            probability(bad)
    from coordinator.commands.report import max_stacks
    from coordinator.commands.serve import port_number

    assert max_stacks("0") == 0 and port_number("0") == 0 and port_number("65535") == 65535
    for parse, bad, said in ((max_stacks, "-1", "must be >= 0"), (port_number, "65536", "between 0 and 65535")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse(bad)


def test_commands_are_discovered_with_examples_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.cli import main

    for command in ("analyze", "compare"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "examples:" in capsys.readouterr().out


def test_summary_rows_carry_the_event_count_method_and_uncertainty(tmp_path: Path) -> None:
    # GIVEN a run whose host counted its events from Flink's REST API with an uncertainty
    run_dir = write_run_dir(tmp_path / "flink", "flink", {"h1": [TINY_DRIVER, TINY_PID_100, TINY_PID_200]})
    capture.write_events(run_dir / "hosts" / "h1", EventCount(
        600_000, "flink-rest:http://127.0.0.1:8081", "detail", method="interpolated between metric-cache refreshes",
        uncertainty=1250.0))
    (run,) = inputs.read_inputs([run_dir])
    # WHEN its summary rows are made; THEN every row with events states how they were counted
    rows = summary_rows.run_rows(run, TASKS, _counts(run))
    total = _find(rows, "*", "*", "*")
    assert (total["events"], total["events_uncertainty"], total["events_method"]) == (
        600_000, 1250.0, "interpolated between metric-cache refreshes")
    assert {r["events_uncertainty"] for r in rows if r["events"] is not None} == {1250.0}
    assert "events_uncertainty,events_method" in summary_rows.format_summary(rows, {})


def test_offcpu_time_reaches_summary_rows_by_task_and_sums_over_pids(tmp_path: Path) -> None:
    from profiler.capture.offcpu import OffCpuEntry
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    # GIVEN pid 100 blocked 3 s polling Kafka (net) and 1 s in GC threads (lock); pid 200 ran without --off-cpu
    run = _tiny(tmp_path)
    capture_dir = run.hosts[0].capture_dir
    assert capture_dir is not None
    poll = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;ep_poll_[k]"
    capture.write_offcpu(capture_dir, 100, [
        OffCpuEntry("net", poll, 3_000_000_000, 30), OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 10**9, 5)
    ])  # fmt: skip
    (run,) = inputs.read_inputs([tmp_path / "tiny"])
    # WHEN the summary rows are computed with the analysis profile
    rows = summary_rows.run_rows(run, TASKS, _counts(run), Matcher(parse_profile(KNOWN_PROFILE)))
    # THEN each task carries its blocked seconds by cause; a PID without the file stays "not measured"
    kafka = _find(rows, "h1", 100, "Kafka")
    assert (kafka["offcpu_seconds"], kafka["offcpu_net_seconds"], kafka["offcpu_lock_seconds"]) == (3.0, 3.0, 0.0)
    assert _find(rows, "h1", 100, "GC")["offcpu_lock_seconds"] == 1.0
    assert _find(rows, "h1", 100, "*")["offcpu_seconds"] == 4.0
    assert _find(rows, "h1", 200, "*")["offcpu_seconds"] is None
    assert _find(rows, "*", "*", "Kafka")["offcpu_seconds"] == 3.0
    assert _find(rows, "*", "*", "*")["offcpu_seconds"] == 4.0
    # AND the CSV has the columns; without a matcher nothing is invented
    assert "offcpu_net_seconds" in summary_rows.SUMMARY_COLUMNS
    assert _find(summary_rows.run_rows(run, TASKS, _counts(run)), "h1", 100, "*")["offcpu_seconds"] is None


def test_offcpu_threads_are_counted_once_per_task_and_per_process(tmp_path: Path) -> None:
    from profiler.capture.offcpu import OFFCPU_THREADS_FILE, OffCpuEntry
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    # GIVEN pid 100 whose threads 11 and 12 polled Kafka, thread 11 also blocked on a lock under Kafka, and
    # thread 13 waited in GC; pid 200 whose thread 11 (another process: another thread) polled Kafka
    run = _tiny(tmp_path)
    capture_dir = run.hosts[0].capture_dir
    assert capture_dir is not None
    poll = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;ep_poll_[k]"
    lock = "Executor task l;org.apache.kafka.clients.consumer.KafkaConsumer.poll;futex_wait_[k]"
    capture.write_offcpu(capture_dir, 100, [
        OffCpuEntry("net", poll, 3_000_000_000, 30, threads=frozenset({11, 12})),
        OffCpuEntry("lock", lock, 10**9, 5, threads=frozenset({11})),
        OffCpuEntry("lock", "GC Thread#0;futex_wait_[k]", 10**9, 5, threads=frozenset({13})),
    ])  # fmt: skip
    capture.write_offcpu(capture_dir, 200, [OffCpuEntry("net", poll, 10**9, 3, threads=frozenset({11}))])
    (run,) = inputs.read_inputs([tmp_path / "tiny"])
    matcher = Matcher(parse_profile(KNOWN_PROFILE))
    # WHEN the summary rows are computed
    rows = summary_rows.run_rows(run, TASKS, _counts(run), matcher)
    # THEN a thread under two stacks of a task counts once (2, not 3), the PID row counts each thread once,
    # a task without blocked time has 0 threads, and two processes' threads add up
    kafka = _find(rows, "h1", 100, "Kafka")
    assert kafka["offcpu_threads"] == 2
    assert kafka["wall_seconds_per_thread"] == pytest.approx(kafka["wall_seconds"] / 2)
    assert _find(rows, "h1", 100, "*")["offcpu_threads"] == 3
    assert _find(rows, "h1", 100, "Deserialize")["offcpu_threads"] == 0
    assert _find(rows, "h1", 200, "Kafka")["offcpu_threads"] == 1
    assert _find(rows, "h1", "*", "Kafka")["offcpu_threads"] == 3
    cluster = _find(rows, "*", "*", "*")
    assert cluster["offcpu_threads"] == 4
    assert cluster["wall_seconds_per_thread"] == pytest.approx(cluster["wall_seconds"] / 4)
    assert "offcpu_threads,wall_seconds_per_thread" in summary_rows.format_summary(rows, {})
    # AND a capture made before the thread sets (no offcpu_threads.json) leaves them empty, never 0
    (capture_dir / "pids" / "200" / OFFCPU_THREADS_FILE).unlink()
    (run,) = inputs.read_inputs([tmp_path / "tiny"])
    rows = summary_rows.run_rows(run, TASKS, _counts(run), matcher)
    old = _find(rows, "h1", 200, "Kafka")
    assert old["offcpu_seconds"] == 1.0
    assert (old["offcpu_threads"], old["wall_seconds_per_thread"]) == (None, None)
    assert _find(rows, "h1", 100, "Kafka")["offcpu_threads"] == 2
