"""The analysis pipeline on real PySpark (local mode): known answers, equality with the host-side
pre-aggregation, re-analysis, determinism, error reporting and the compare command.

One SparkSession serves the module (start-up costs seconds). Its Python workers exit after each
task (no reuse) and a warm-up analysis starts the worker daemon before the first test, so the leak
check sees only what a test itself leaves behind.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze, choose_engine, spark_session
from coordinator.analysis.inputs import read_inputs
from coordinator.analysis.timeline import SubWindow
from coordinator.cli import main as coordinator_main
from profiler.capture import format as capture
from profiler.capture.folded import format_folded
from profiler.capture.read import pid_stacks_file, read_capture, read_stack_counts
from profiler.errors import CaptureFormatError
from profiler.matching.aggregate import aggregate_host
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher, match_stacks
from tests.fixtures.captures import (
    GC_STACK,
    JSON_STACK,
    KAFKA_STACK,
    KNOWN_PROFILE,
    NESTED_STACK,
    OTHER_STACK,
    TIMELINE_OPTIONS,
    PidSpec,
    timeline_hosts,
    to_compact,
    write_run_dir,
)
from tests.fixtures.exports import analysed_task_files


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with spark_session("local[2]", {"spark.python.worker.reuse": "false"}) as session:
        warm_up = tmp_path_factory.mktemp("warm-up")
        analyze([write_run_dir(warm_up / "run", "w", {"h": [PidSpec(1, {KAFKA_STACK: 1}, cycles=1.0)]})], spark=session)
        yield session


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _row(rows: list[dict[str, str]], run: str, host: str, pid: str, task: str) -> dict[str, str]:
    (found,) = [r for r in rows if (r["run"], r["host"], r["pid"], r["task"]) == (run, host, pid, task)]
    return found


def _digest_tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_tiny_run_known_answers(spark: object, tiny_run: Path) -> None:
    output = analyze([tiny_run], spark=spark)
    assert output.out_dir == tiny_run and output.summary_csv == tiny_run / "summary.csv"
    rows = _rows(output.summary_csv)
    # pid 100: 60/30/10 of 100 samples, 1e9 cycles
    assert _row(rows, "tiny", "h1", "100", "Kafka")["cycles"] == "600000000"
    assert _row(rows, "tiny", "h1", "100", "Deserialize")["share"] == "0.3"
    assert _row(rows, "tiny", "h1", "100", "Deserialize")["multi_task_samples"] == "10"
    assert _row(rows, "tiny", "h1", "100", "GC")["cycles"] == "100000000"
    # pid 200: 25 Kafka, 75 unmatched of 100 samples, 4e8 cycles
    assert _row(rows, "tiny", "h1", "200", "unmatched")["cycles"] == "300000000"
    # cluster: Kafka 85 of 200 samples, 7e8 cycles
    kafka = _row(rows, "tiny", "*", "*", "Kafka")
    assert (kafka["samples"], kafka["share"], kafka["cycles"]) == ("85", "0.425", "700000000")
    assert kafka["events"] == "1000" and kafka["cycles_per_event"] == "700000" and kafka["load"] == "10k"
    assert _row(rows, "tiny", "h1", "50", "*")["role"] == "managing"
    # per-task stacks, merged over PIDs, most samples first (derived from the captures: no copy is kept)
    assert not (output.out_dir / "tasks").exists()
    tasks = analysed_task_files(tiny_run)
    assert sorted(tasks) == ["Deserialize.folded", "GC.folded", "Kafka.folded"]
    assert tasks["Kafka.folded"] == f"{KAFKA_STACK} 85\n"
    assert tasks["Deserialize.folded"] == f"{JSON_STACK} 20\n{NESTED_STACK} 10\n"
    assert tasks["GC.folded"] == f"{GC_STACK} 10\n"
    assert output.unmatched_file.read_text() == f"{OTHER_STACK} 75\n"
    record = json.loads(output.analysis_json.read_text())
    assert record["profile_text"] == KNOWN_PROFILE and record["inputs"][0]["run"] == "tiny"
    assert output.stats.samples == 200 and output.stats.distinct_stacks == 5


def _host_side_rows(run_dir: Path, host: str, profile_text: str) -> list[dict[str, object]]:
    """What `profiler run` pre-aggregates on the host for the same capture and profile."""
    capture_dir = run_dir / "hosts" / host
    info = read_capture(capture_dir)
    matcher = Matcher(parse_profile(profile_text))
    matched = {
        p.pid: match_stacks(matcher, read_stack_counts(pid_stacks_file(capture_dir, p.pid)))
        for p in info.processes
        if p.sampled
    }
    return aggregate_host(host, info.processes, matched, info.counters, info.net)


def test_multi_run_summary_equals_host_preaggregation(
    spark: object, multi_run_archive: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "combined"
    output = analyze(multi_run_archive, out_dir=out, spark=spark)
    rows = _rows(output.summary_csv)
    assert {r["run"] for r in rows} == {"r1", "r2"}
    assert {r["engine"] for r in rows if r["host"] == "*"} == {"spark"}
    # labels: engine collides with the engine column, load does not
    assert {(r["run"], r["label_engine"], r["load"]) for r in rows} == {("r1", "spark", "1"), ("r2", "spark", "2")}
    for run_dir, run_id in zip(multi_run_archive, ("r1", "r2")):
        for host in ("h1", "h2"):
            expected = capture.format_result_csv(_host_side_rows(run_dir, host, KNOWN_PROFILE))
            ours = [r for r in rows if r["run"] == run_id and r["host"] == host and r["pid"] != "*"]
            assert capture.format_result_csv(ours) == expected, (run_id, host)
    # cluster rows: samples and cycles are the sums over hosts' PIDs
    r2 = [r for r in rows if r["run"] == "r2" and r["pid"] not in ("*",) and r["task"] != "*"]
    for task in ("Kafka", "Deserialize", "GC", "unmatched"):
        cluster = _row(rows, "r2", "*", "*", task)
        members = [r for r in r2 if r["task"] == task]
        assert int(cluster["samples"]) == sum(int(r["samples"]) for r in members)
        assert float(cluster["cycles"]) == pytest.approx(sum(float(r["cycles"]) for r in members), rel=1e-5)
    # r2 doubles every count of r1: the same shares, twice the cycles
    assert _row(rows, "r2", "*", "*", "GC")["share"] == _row(rows, "r1", "*", "*", "GC")["share"]
    assert _row(rows, "r2", "h3", "*", "*")["host_state"] == "failed"
    assert _row(rows, "r2", "*", "*", "Kafka")["cycles_estimated"] == "1"  # pid 102 is estimated
    assert _row(rows, "r2", "h2", "*", "*")["bytes_sent"] == "10"


def test_reanalysis_with_edited_profile_leaves_the_capture_untouched(
    spark: object, tiny_run: Path, tmp_path: Path
) -> None:
    analyze([tiny_run], spark=spark)
    before = _digest_tree(tiny_run / "hosts")
    edited = tmp_path / "edited.txt"
    edited.write_text(KNOWN_PROFILE.replace("GC: GC Thread", "Lookup: java.util.HashMap") + "Garbage: G1ParTask\n")
    output = analyze([tiny_run], profile=edited, spark=spark)
    rows = _rows(output.summary_csv)
    assert _row(rows, "tiny", "*", "*", "Lookup")["samples"] == "75"
    assert _row(rows, "tiny", "*", "*", "Garbage")["samples"] == "10"
    assert _row(rows, "tiny", "*", "*", "unmatched")["samples"] == "0"
    assert not [r for r in rows if r["task"] == "GC"]
    # the old profile's task files are gone, the new ones are there
    assert not (output.out_dir / "tasks").exists()
    assert sorted(analysed_task_files(tiny_run)) == [
        "Deserialize.folded",
        "Garbage.folded",
        "Kafka.folded",
        "Lookup.folded",
    ]
    assert output.unmatched_file.read_text() == ""
    assert json.loads(output.analysis_json.read_text())["profile_source"] == str(edited)
    assert _digest_tree(tiny_run / "hosts") == before
    assert not [p for p in tiny_run.iterdir() if p.name.startswith(".")]  # no scratch left


def test_output_is_byte_identical_across_runs_and_partitionings(
    spark: object, multi_run_archive: list[Path], tmp_path: Path
) -> None:
    conf = spark.conf  # type: ignore[attr-defined]
    original = conf.get("spark.sql.shuffle.partitions")
    try:
        conf.set("spark.sql.shuffle.partitions", "1")
        first = analyze(multi_run_archive, out_dir=tmp_path / "a", spark=spark)
        conf.set("spark.sql.shuffle.partitions", "7")
        analyze(list(reversed(multi_run_archive)), out_dir=tmp_path / "b", spark=spark)
    finally:
        conf.set("spark.sql.shuffle.partitions", original)
    for name in ("summary.csv", "unmatched.folded"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert analysed_task_files(tmp_path / "a") == analysed_task_files(tmp_path / "b")
    assert first.summary_csv.read_bytes().count(b"\n") > 40


def test_in_process_engine_writes_the_same_bytes_as_spark(
    spark: object, multi_run_archive: list[Path], tmp_path: Path
) -> None:
    # GIVEN the multi-run, multi-host archive analysed on Spark and in-process (no JVM)
    on_spark = analyze(multi_run_archive, out_dir=tmp_path / "spark", spark=spark)
    output = analyze(multi_run_archive, out_dir=tmp_path / "local", engine="in-process")
    # (the distinct stacks: Spark's workers send packed fingerprints, the driver counts them)
    assert on_spark.stats.distinct_stacks == output.stats.distinct_stacks > 1
    assert on_spark.stats.samples == output.stats.samples > 0
    # THEN every file is byte-identical, and auto picks in-process for such a small local input
    files = sorted(p.relative_to(tmp_path / "spark") for p in (tmp_path / "spark").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*") if p.is_file())
    # no stack copies; the marker lets --force recognise the directory as ours
    assert [str(f) for f in files] == [".spe-taskprof", "analysis.json", "summary.csv", "unmatched.folded"]
    for name in files:
        assert (tmp_path / "spark" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    tasks = analysed_task_files(tmp_path / "spark")
    assert tasks == analysed_task_files(tmp_path / "local") and len(tasks) > 2
    assert output.stats.session_seconds == 0
    assert choose_engine("auto", "local[*]", read_inputs(multi_run_archive, None)) == "in-process"
    assert choose_engine("auto", "spark://10.0.0.1:7077", read_inputs(multi_run_archive, None)) == "spark"


@pytest.mark.parametrize("window", [SubWindow(10, 20), SubWindow(12, None), SubWindow(0, 30)], ids=str)
def test_sub_window_in_process_and_spark_write_the_same_bytes(
    spark: object, timeline_run: Path, tmp_path: Path, window: SubWindow
) -> None:
    # GIVEN two runs with timelines, the second with two hosts (one without any counters timeline)
    second = write_run_dir(
        tmp_path / "second",
        "second",
        {**timeline_hosts(), "h2": [PidSpec(7, timeline={1: {KAFKA_STACK: 3}, 2: {GC_STACK: 9}}, cycles=1.2e9)]},
        **TIMELINE_OPTIONS,
    )
    # WHEN both engines analyse the same sub-window
    analyze([timeline_run, second], out_dir=tmp_path / "spark", spark=spark, window=window)
    analyze([timeline_run, second], out_dir=tmp_path / "local", engine="in-process", window=window)
    # THEN every file, analysis.json with its intervals included, is byte-identical
    files = sorted(p.relative_to(tmp_path / "spark") for p in (tmp_path / "spark").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*") if p.is_file())
    for name in files:
        assert (tmp_path / "spark" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    recorded = json.loads((tmp_path / "spark" / "analysis.json").read_text())["window"]
    assert [(h["run"], h["host"]) for h in recorded["hosts"]] == [("second", "h1"), ("second", "h2"), ("timed", "h1")]


@pytest.mark.parametrize("window", [None, SubWindow(10, 20)], ids=str)
def test_stack_tables_analyse_on_spark_as_their_folded_twins(
    spark: object, timeline_run: Path, multi_run_archive: list[Path], tmp_path: Path, window: SubWindow | None
) -> None:
    # GIVEN the same runs with folded stacks (format 3) and with stack tables (format 4)
    folded_runs = [timeline_run] if window is not None else multi_run_archive
    compact_runs = []
    for run in folded_runs:
        twin = tmp_path / "compact" / run.name
        shutil.copytree(run, twin)
        for host_dir in (twin / "hosts").iterdir():
            to_compact(host_dir)
        assert not list(twin.rglob("pids/*/*.folded")) and list(twin.rglob("pids/*/stacks.tpc"))
        compact_runs.append(twin)
    # WHEN both are analysed on Spark
    analyze(folded_runs, out_dir=tmp_path / "folded-out", spark=spark, window=window)
    analyze(compact_runs, out_dir=tmp_path / "compact-out", spark=spark, window=window)
    # THEN summary.csv, the unmatched stacks and every task's stacks are byte-identical
    for name in ["summary.csv", "unmatched.folded"]:
        assert (tmp_path / "folded-out" / name).read_bytes() == (tmp_path / "compact-out" / name).read_bytes()
    tasks = analysed_task_files(tmp_path / "folded-out")
    assert tasks == analysed_task_files(tmp_path / "compact-out") and any(tasks.values())


def test_bad_stacks_file_is_one_line_error(spark: object, tiny_run: Path) -> None:
    bad = capture.stacks_path(tiny_run / "hosts" / "h1", 200)
    bad.write_text(bad.read_text() + "this line has no count\n")
    with pytest.raises(CaptureFormatError, match=r"stacks.folded:3: not a folded stack line"):
        analyze([tiny_run], spark=spark)
    assert not (tiny_run / "summary.csv").exists()


def _two_runs_for_compare(root: Path) -> tuple[Path, Path]:
    # T: 30 % vs 36 % of 10000 samples (significant); U: 10.0 % vs 10.1 % (not)
    def run(name: str, t: int, u: int) -> Path:
        stacks = {"main;work;T.run": t, "main;work;U.run": u, "main;idle": 10_000 - t - u}
        return write_run_dir(root / name, name, {"h": [PidSpec(1, stacks, cycles=1.0e10)]}, "T: T.run\nU: U.run\n")

    return run("a", 3000, 1000), run("b", 3600, 1010)


def test_compare_flags_significant_share_difference(
    spark: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_a, run_b = _two_runs_for_compare(tmp_path)
    analyze([run_a], spark=spark)
    analyze([run_b], spark=spark)
    out_csv = tmp_path / "compare.csv"
    assert coordinator_main(["compare", str(run_a), str(run_b), "--csv", str(out_csv)]) == 0
    rows = {r["task"]: r for r in _rows(out_csv)}
    assert rows["T"]["significant"] == "1" and float(rows["T"]["p_value"]) < 1e-10
    assert rows["T"]["cycles_a"] == "3000000000" and rows["T"]["cycles_b"] == "3600000000"
    assert rows["T"]["cycles_relative_delta"] == "0.2"
    assert rows["U"]["significant"] == "0"
    printed = capsys.readouterr()  # the table is the data (stdout); what was written goes to stderr
    assert "wrote" in printed.err and "T " in printed.out and "wrote" not in printed.out


def test_analyze_command_end_to_end(tmp_path: Path) -> None:
    # What a user runs, in a fresh process (its own JVM) on local[1]; the terminal stays quiet.
    run_dir = write_run_dir(tmp_path / "r", "r", {"h": [PidSpec(7, {KAFKA_STACK: 3, OTHER_STACK: 1}, cycles=4.0)]})
    command = [
        sys.executable,
        "-m",
        "coordinator",
        "analyze",
        str(run_dir),
        "--master",
        "local[1]",
        "--label",
        "load=5",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert f"wrote {run_dir / 'summary.csv'}" in done.stdout
    assert f"wrote {run_dir / 'report' / 'index.html'}" in done.stdout  # analyze renders the report too
    assert (run_dir / "report" / "index.html").is_file()
    assert done.stderr == ""
    rows = _rows(run_dir / "summary.csv")
    assert _row(rows, "r", "*", "*", "Kafka")["cycles"] == "3" and rows[0]["load"] == "5"
    assert format_folded({OTHER_STACK: 1}) == (run_dir / "unmatched.folded").read_text()


def test_analyze_command_reports_errors_in_one_line(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "r", "r", {"h": [PidSpec(7, {KAFKA_STACK: 3}, cycles=4.0)]})
    bad_profile = tmp_path / "bad.txt"
    bad_profile.write_text("Kafka: re:(unclosed\n")
    command = [sys.executable, "-m", "coordinator", "analyze", str(run_dir), "--profile", str(bad_profile)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"{bad_profile}:1:" in done.stderr, done.stderr


@pytest.mark.parametrize(("window", "stateful"), [("state", True), ("sink", False)])
def test_ysb_query_keeps_its_window_where_asked(spark: object, window: str, stateful: bool) -> None:
    # The YSB demo's micro-batch query (coordinator demo --spark-window): with the window in the sink
    # the query has no aggregation and no watermark (so no stateful operator, no shuffle, and nothing
    # Spark compiles anew per window), and the rows are what RedisSink's window mode reads
    # (campaign_id, event_time, pre_window_latency_ms). Analysed, not started (Spark plans a streaming
    # query's physical operators only when it starts, and the module's session has no sink jar).
    from coordinator.workloads.ysb.pipeline import build_ysb

    rows = build_ysb(spark, 1000, 10, 10, 2, window=window)  # type: ignore[arg-type]
    plan = rows._jdf.queryExecution().analyzed().toString()  # type: ignore[attr-defined]
    assert rows.isStreaming
    assert ("EventTimeWatermark" in plan) is stateful, plan
    assert ("Aggregate [" in plan) is stateful, plan
    if not stateful:
        assert rows.columns == ["campaign_id", "event_time", "pre_window_latency_ms"]
