"""Exports (speedscope, pprof, folded) agree with summary.csv task by task; the speedscope file
validates against speedscope's published schema (tests/data/speedscope, speedscope 1.25.0, MIT) and the
pprof file parses back with the protobuf library; `coordinator summary` and `analyze --print`.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze
from coordinator.analysis.timeline import SubWindow
from coordinator.cli import main
from coordinator.export.files import render
from coordinator.export.pprof import LABEL_KEYS, build_profile, decode
from coordinator.export.speedscope import build_speedscope
from coordinator.export.stacks import TASK_FRAME_PREFIX, load_export_set, select
from profiler.capture.folded import iter_folded, read_folded
from profiler.errors import ConfigError
from profiler.files.outputs import MARKER
from tests.fixtures.captures import PidSpec, write_run_dir
from tests.fixtures.exports import (
    analysed_task_files,
    assert_exports_agree_with_summary,
    cluster_task_samples,
    pid_task_samples,
    pid_task_value,
    pprof_totals,
    speedscope_task_samples,
    summary_rows,
    validate_speedscope,
)

DATA = Path(__file__).resolve().parents[3] / "data"
REPO = Path(__file__).resolve().parents[4]


# ---------------------------------------------------------------- runs


@pytest.fixture
def recorded_run(tmp_path: Path) -> Path:
    """The recorded real Spark executor capture (tests/data) as two executors of one host (the second
    with a third of the samples), matched with the shipped Spark profile and analysed."""
    real = read_folded(DATA / "spark_executor_real.folded")
    synthetic = read_folded(DATA / "spark_executor_synthetic.folded")
    profile = (REPO / "application_profiles" / "spark_structured_streaming.txt").read_text(encoding="utf-8")
    run_dir = write_run_dir(
        tmp_path / "runs" / "recorded",
        "recorded",
        {
            "node1": [
                PidSpec(4100, dict(real), cycles=3.3e10, cpu_seconds=11.0, instructions=4.0e10),
                PidSpec(4200, dict(synthetic), cycles=1.0e9, cycles_estimated=True, cpu_seconds=0.5),
            ],
            "node2": [PidSpec(5100, {s: max(1, c // 3) for s, c in real.items()})],  # no counters
        },
        profile_text=profile,
    )
    analyze([run_dir], engine="in-process")
    return run_dir


@pytest.fixture
def analysed_tiny(tiny_run: Path) -> Path:
    analyze([tiny_run], engine="in-process")
    return tiny_run


# ---------------------------------------------------------------- pprof


def test_pprof_round_trip_agrees_with_summary(recorded_run: Path) -> None:
    # GIVEN an analysed run of real stacks WHEN exported as pprof and parsed back with protobuf
    export = load_export_set(recorded_run)
    profile = decode(render(export, "pprof"))  # type: ignore[arg-type]
    rows = summary_rows(recorded_run)
    strings = profile.string_table
    # THEN the sample types, and per (host, pid, task) the samples are summary.csv's, exactly
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == [
        ("samples", "count"), ("cpu", "nanoseconds"), ("cycles", "count")
    ]
    assert strings[0] == ""
    assert pprof_totals(profile, 0) == pid_task_samples(rows)
    # cpu and cycles: the PID's totals × the task's share, as summary.csv (6 significant digits)
    for column, index, scale in (("cpu_seconds", 1, 1e9), ("cycles", 2, 1.0)):
        expected = pid_task_value(rows, column)
        got = pprof_totals(profile, index)
        for key, value in expected.items():
            assert got[key] / scale == pytest.approx(value, rel=2e-5), (column, key)
    # node2's PID has no counters: cpu is samples × period, cycles 0, and a comment says so
    period = profile.period
    assert period == round(1e9 / 99)
    node2 = [s for s in profile.sample if "node2" in {strings[lab.str] for lab in s.label}]
    assert node2 and all(s.value[1] == s.value[0] * period and s.value[2] == 0 for s in node2)
    assert any("node2 PID 5100" in strings[c] for c in profile.comment)
    assert any("cycles estimated" in strings[c] and "PID 4200" in strings[c] for c in profile.comment)


def test_every_export_of_recorded_stacks_agrees_with_summary(recorded_run: Path) -> None:
    assert_exports_agree_with_summary(recorded_run)


def test_pprof_labels_and_locations(analysed_tiny: Path) -> None:
    profile = decode(render(load_export_set(analysed_tiny), "pprof"))  # type: ignore[arg-type]
    strings = profile.string_table
    functions = {f.id: strings[f.name] for f in profile.function}
    locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
    stacks: Counter[str] = Counter()
    for sample in profile.sample:
        labels = {strings[lab.key]: strings[lab.str] for lab in sample.label}
        assert tuple(labels) == LABEL_KEYS
        assert labels["run"] == "tiny" and labels["host"] == "h1" and labels["role"] == "workload"
        frames = [locations[i] for i in reversed(sample.location_id)]  # pprof: leaf first
        assert labels["thread"] == frames[0]
        stacks[";".join(frames)] += sample.value[0]
    # the stacks are the capture's, unchanged
    expected = read_folded(analysed_tiny / "hosts/h1/pids/100/stacks.folded")
    expected.update(read_folded(analysed_tiny / "hosts/h1/pids/200/stacks.folded"))
    assert stacks == expected
    assert strings[profile.default_sample_type] == "cpu"
    assert profile.duration_nanos == 10 * 10**9


def test_pprof_bytes_are_deterministic_gzip(analysed_tiny: Path) -> None:
    export = load_export_set(analysed_tiny)
    first, second = render(export, "pprof"), render(export, "pprof")
    assert first == second
    assert isinstance(first, bytes) and first[:2] == b"\x1f\x8b"
    assert build_profile(export).SerializeToString(deterministic=True) == gzip.decompress(first)


# ---------------------------------------------------------------- speedscope


@pytest.mark.parametrize("per_task", [False, True])
def test_speedscope_validates_and_agrees_with_summary(recorded_run: Path, per_task: bool) -> None:
    document = build_speedscope(load_export_set(recorded_run), per_task=per_task)
    validate_speedscope(document)
    assert speedscope_task_samples(document, per_task) == pid_task_samples(summary_rows(recorded_run))
    for profile in document["profiles"]:
        assert profile["endValue"] == sum(profile["weights"])
        assert len(profile["samples"]) == len(profile["weights"])
    names = [p["name"] for p in document["profiles"]]
    if not per_task:
        assert names == [
            "node1 PID 4100 (spark executor)", "node1 PID 4200 (spark executor)", "node2 PID 5100 (spark executor)"
        ]


def test_speedscope_frames_are_the_folded_frames(analysed_tiny: Path) -> None:
    document = build_speedscope(load_export_set(analysed_tiny))
    frames = [f["name"] for f in document["shared"]["frames"]]
    assert len(frames) == len(set(frames))  # interned
    profile = document["profiles"][0]
    first = [frames[i] for i in profile["samples"][0]]
    # root first: the task, then the thread, then the stack as folded; tasks in profile order
    assert first == ["[task: Kafka]", "Executor task l", "java.lang.Thread.run",
                     "org.apache.kafka.clients.consumer.KafkaConsumer.poll", "sun.nio.ch.read"]
    roots = [frames[s[0]] for s in profile["samples"]]
    assert roots == sorted(roots, key=["[task: Kafka]", "[task: Deserialize]", "[task: GC]"].index)


def test_speedscope_hostile_names_stay_data(tmp_path: Path) -> None:
    from tests.fixtures.report import make_run_dir

    run_dir = make_run_dir(tmp_path / "runs")
    document = json.loads(render(load_export_set(run_dir), "speedscope"))  # type: ignore[arg-type]
    validate_speedscope(document)
    names = {f["name"] for f in document["shared"]["frames"]}
    assert "<script>window.__pwned='script'</script>" in names


# ---------------------------------------------------------------- folded


def test_folded_per_task_equals_the_analysis_task_files(recorded_run: Path) -> None:
    files = render(load_export_set(recorded_run), "folded", per_task=True)
    assert isinstance(files, dict)
    task_files = json.loads((recorded_run / "analysis.json").read_text(encoding="utf-8"))["task_files"]
    assert set(files) == {*task_files.values(), "unmatched.folded"}
    analysed = analysed_task_files(recorded_run)
    for name, text in files.items():
        if name == "unmatched.folded":
            assert text == (recorded_run / name).read_text(encoding="utf-8")
        else:
            assert text == analysed[name], name
    assert any(text for name, text in files.items() if name != "unmatched.folded")


def test_folded_with_task_root_frames_sums_to_cluster_rows(recorded_run: Path) -> None:
    text = render(load_export_set(recorded_run), "folded")
    assert isinstance(text, bytes)
    by_task: Counter[str] = Counter()
    for stack, count in iter_folded(text.decode("utf-8").splitlines(keepends=True)):
        root = stack.split(";", 1)[0]
        by_task[root[len(TASK_FRAME_PREFIX) : -1]] += count
    assert dict(by_task) == cluster_task_samples(summary_rows(recorded_run))


# ---------------------------------------------------------------- sub-window, selection


def test_exports_of_a_sub_window_agree_with_its_summary(timeline_run: Path) -> None:
    analyze([timeline_run], engine="in-process", window=SubWindow(10.0, 30.0))
    export = load_export_set(timeline_run)
    rows = summary_rows(timeline_run)
    assert export.task_samples() == pid_task_samples(rows)
    profile = decode(render(export, "pprof"))  # type: ignore[arg-type]
    assert pprof_totals(profile, 0) == pid_task_samples(rows)
    for key, value in pid_task_value(rows, "cpu_seconds").items():
        assert pprof_totals(profile, 1)[key] / 1e9 == pytest.approx(value, rel=2e-5)
    assert any("sub-window" in profile.string_table[c] for c in profile.comment)


def test_select_by_task_host_and_pid(recorded_run: Path) -> None:
    export = load_export_set(recorded_run)
    only = select(export, tasks=["Deserialize"], hosts=["node1"], pids=[4100])
    assert {s.task for s in only.stacks} == {"Deserialize"}
    assert {(s.process.host, s.process.pid) for s in only.stacks} == {("node1", 4100)}
    expected = pid_task_samples(summary_rows(recorded_run))["node1", 4100, "Deserialize"]
    assert sum(s.count for s in only.stacks) == expected
    with pytest.raises(ConfigError, match="task Nope: not in this run"):
        select(export, tasks=["Nope"])
    with pytest.raises(ConfigError, match="PID 5100: not in this run; choose from: 4100, 4200"):
        select(export, hosts=["node1"], pids=[5100])


# ---------------------------------------------------------------- commands


def test_export_command_writes_derived_names_and_refuses_overwrite(
    analysed_tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(analysed_tiny), "--format", "pprof", "--host", "h1", "--task", "Kafka"]) == 0
    out = analysed_tiny / "exports" / "tiny-host-h1-task-Kafka.pb.gz"
    assert out.is_file() and f"wrote {out}" in capsys.readouterr().out
    assert main(["export", str(analysed_tiny), "--format", "pprof", "--host", "h1", "--task", "Kafka"]) == 5
    assert "exists; choose another --out or add --force" in capsys.readouterr().err
    assert main(["export", str(analysed_tiny), "--format", "pprof", "--host", "h1", "--task", "Kafka", "--force"]) == 0
    per_task_dir = str(analysed_tiny / "t")
    assert main(["export", str(analysed_tiny), "--format", "folded", "--per-task", "--out", per_task_dir]) == 0
    assert sorted(p.name for p in (analysed_tiny / "t").iterdir() if p.name != MARKER) == [
        "Deserialize.folded", "GC.folded", "Kafka.folded", "unmatched.folded"
    ]
    assert main(["export", str(analysed_tiny), "--format", "speedscope", "--pid", "999"]) == 2
    assert "PID 999: not in this run; choose from: 100, 200" in capsys.readouterr().err


def test_export_to_standard_output(analysed_tiny: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["export", str(analysed_tiny), "--format", "folded", "--task", "GC", "--out", "-"]) == 0
    captured = capsysbinary.readouterr()
    assert captured.out == b"[task: GC];GC Thread#0;start_thread;G1ParTask::work 10\n"
    assert b"10 samples of 2 process(es) to standard output" in captured.err


def test_export_leaves_out_a_damaged_host_and_says_so(recorded_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a run whose node2 capture is damaged after the analysis
    (recorded_run / "hosts" / "node2" / "meta.json").write_text("{not json", encoding="utf-8")
    # WHEN it is exported THEN node1 is, and one warning line names node2's damaged file
    out = recorded_run / "x.folded"
    assert main(["export", str(recorded_run), "--format", "folded", "--out", str(out)]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("export: warning: not exported: host node2: ")
    assert "node2/meta.json:1: not valid JSON" in warnings[0]
    assert out.stat().st_size > 0
    # AND when every host is damaged, the export is refused with that file, not written empty
    (recorded_run / "hosts" / "node1" / "meta.json").write_text("[]", encoding="utf-8")
    assert main(["export", str(recorded_run), "--format", "folded", "--out", str(out), "--force"]) == 6
    (error,) = capsys.readouterr().err.splitlines()
    assert "meta.json" in error and error.startswith("coordinator export: error: ")


def test_summary_names_a_damaged_cell(analysed_tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = analysed_tiny / "summary.csv"
    lines = summary.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    cells = lines[2].split(",")
    cells[header.index("cycles")] = "lots"
    lines[2] = ",".join(cells)
    summary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["summary", str(analysed_tiny)]) == 6
    (error,) = capsys.readouterr().err.splitlines()
    assert f"{summary}:3: column cycles: 'lots' is not a number" in error


def test_export_of_a_bare_capture_goes_to_its_analysis_dir(analysed_tiny: Path) -> None:
    capture_dir = analysed_tiny / "hosts" / "h1"
    assert main(["export", str(capture_dir), "--format", "speedscope"]) == 0
    (written,) = (capture_dir / "analysis" / "exports").iterdir()
    validate_speedscope(json.loads(written.read_text(encoding="utf-8")))


def test_summary_command_prints_the_task_tables(analysed_tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(analysed_tiny), "--pids"]) == 0
    out = capsys.readouterr().out
    assert "run tiny: all hosts" in out and "run tiny: host h1 PID 100 (workload spark)" in out
    assert "Kafka" in out and "42.5 ± 6.8 %" in out and "managing process: not sampled" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["Kafka", "85", "42.5", "±", "6.8", "%", "700", "M", "0.35", "700", "k", "0"] in lines


LONG_TASKS = {"Kafka": "Kafka/Source: Custom Source", "Deserialize": "ClusterManagement", "GC": "JIT compilation"}


@pytest.mark.parametrize("columns", [None, "80", "120"])  # None: a pipe without COLUMNS (rich's 80)
def test_summary_keeps_task_names_whole_in_a_narrow_terminal_or_a_pipe(
    analysed_tiny: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: str | None
) -> None:
    # GIVEN task names as long as a Flink operator's, in a terminal of 80 columns, a pipe or 120 columns
    summary = analysed_tiny / "summary.csv"
    text = summary.read_text(encoding="utf-8")
    for short, long in LONG_TASKS.items():
        text = text.replace(f",{short},", f",{long},")
    summary.write_text(text, encoding="utf-8")
    monkeypatch.delenv("COLUMNS", raising=False)
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    assert main(["summary", str(analysed_tiny)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]  # after the summary.csv's path
    width = int(columns or 80)
    assert all(len(line) <= width for line in lines)
    # THEN every name stands whole on its row, beside its samples and share
    rows = {line.split("  ")[0]: line.split() for line in lines if line.startswith(tuple(LONG_TASKS.values()))}
    assert set(rows) == set(LONG_TASKS.values())
    assert rows["Kafka/Source: Custom Source"][3:8] == ["85", "42.5", "±", "6.8", "%"]
    assert rows["JIT compilation"][2] == "10"
    header = next(line.split("  ") for line in lines if line.startswith("task "))
    header = [cell.strip() for cell in header if cell.strip()]
    if width == 80:  # AND the least important columns give way, and a note says which
        assert header == ["task", "samples", "share ± 95 % CI", "cycles", "CPU s"]
        assert lines[-1] == "80 columns: left out cycles/event, multi-task (COLUMNS=120 shows them)"
    else:
        assert header[-2:] == ["cycles/event", "multi-task"]
        assert not any("left out" in line for line in lines)


def test_summary_folds_a_name_wider_than_the_terminal() -> None:
    import io

    from coordinator.report.terminal import COLUMNS, TaskTable, fitting_columns, print_tables

    name = "Kafka/Source: Custom Source -> Timestamps/Watermarks -> Deserialize"  # 68 characters
    table = TaskTable("run r: all hosts", ((name, "1", "100.0 %", "1 G", "1", "—", "0"),))
    assert fitting_columns([table], 80) == (0, 1, 2)  # every column that can give way has
    stream = io.StringIO()
    print_tables([table], stream, width=80)
    header, *rows = stream.getvalue().splitlines()[1:4]
    task_width = header.index("samples")
    assert " ".join(row[:task_width].strip() for row in rows) == name  # wrapped, not cut
    assert len(COLUMNS) == 7 and fitting_columns([table], 200) == tuple(range(7))


def test_summary_needs_an_analysis(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(tiny_run)]) == 2
    assert "no summary.csv; run `coordinator analyze" in capsys.readouterr().err


def test_analyze_print(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tiny_run), "--engine", "in-process", "--print"]) == 0
    assert "run tiny: all hosts" in capsys.readouterr().out


# ---------------------------------------------------------------- the report's links


def test_report_links_every_flamegraph_to_the_run_exports(analysed_tiny: Path) -> None:
    from coordinator.report.render import render_report
    from tests.fixtures.report import read_payload

    index = render_report(analysed_tiny)
    payload = read_payload(index)
    links = payload["exports"]
    assert isinstance(links, dict)
    assert links["files"] == {"speedscope": "exports/tiny.speedscope.json", "pprof": "exports/tiny.pb.gz"}
    graph_keys = {g["key"] for g in payload["graphs"]}  # type: ignore[attr-defined]
    assert set(links["graphs"]) == graph_keys
    assert links["graphs"]["pid:h1:100"] == {
        "speedscope": "profile “h1 PID 100 (spark executor)”",
        "pprof": "go tool pprof -tagfocus=process=^h1:100$ -http=: exports/tiny.pb.gz",
    }
    assert links["graphs"]["task:Kafka"]["pprof"].startswith("go tool pprof -tagfocus=task=^Kafka$ ")
    # the files beside the page are the run's exports, and report.json counts them
    report = index.parent
    export = load_export_set(analysed_tiny)
    assert (report / "exports/tiny.pb.gz").read_bytes() == render(export, "pprof")
    document = json.loads((report / "exports/tiny.speedscope.json").read_text(encoding="utf-8"))
    validate_speedscope(document)
    meta = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert meta["exports_bytes"] == sum(p.stat().st_size for p in (report / "exports").iterdir())


def test_export_of_a_run_not_analysed_yet(tiny_run: Path) -> None:
    # no summary.csv: the run's profile copy and the capture's counters (tests/fixtures/captures.py TINY_*)
    export = load_export_set(tiny_run)
    assert export.task_samples() == {
        ("h1", 100, "Kafka"): 60, ("h1", 100, "Deserialize"): 30, ("h1", 100, "GC"): 10,
        ("h1", 200, "Kafka"): 25, ("h1", 200, "unmatched"): 75,
    }
    profile = decode(render(export, "pprof"))  # type: ignore[arg-type]
    assert pprof_totals(profile, 1)["h1", 100, "Kafka"] == 300_000_000  # 0.6 × 0.5 s
    assert pprof_totals(profile, 2)["h1", 200, "unmatched"] == 300_000_000  # 0.75 × 4e8 cycles


def test_per_task_directory_is_replaced_whole(analysed_tiny: Path) -> None:
    out = analysed_tiny / "per-task"
    assert main(["export", str(analysed_tiny), "--format", "folded", "--per-task", "--out", str(out)]) == 0
    (out / "Old task.folded").write_text("x 1\n", encoding="utf-8")
    assert main(["export", str(analysed_tiny), "--format", "folded", "--per-task", "--out", str(out)]) == 5
    assert main(["export", str(analysed_tiny), "--format", "folded", "--per-task", "--out", str(out), "--force"]) == 0
    assert "Old task.folded" not in {p.name for p in out.iterdir()}
    assert (out / "Kafka.folded").read_text(encoding="utf-8") == analysed_task_files(analysed_tiny)["Kafka.folded"]


# ---------------------------------------------------------------- the registry


def test_every_format_is_registered_once_and_recognises_its_own_file(analysed_tiny: Path) -> None:
    # GIVEN the registry WHEN the command's parser is built THEN --format offers exactly the registered names
    import argparse

    from coordinator.commands.export import ExportCommand
    from coordinator.export.formats import FORMATS, PER_TASK_SUFFIX, export_format, register

    export_parser = argparse.ArgumentParser()
    ExportCommand().prepare_parser(export_parser)
    fmt_action = next(action for action in export_parser._actions if action.dest == "format")
    assert fmt_action.choices is not None
    assert tuple(fmt_action.choices) == tuple(FORMATS) == ("speedscope", "pprof", "folded")
    suffixes = [fmt.suffix for fmt in FORMATS.values()] + [PER_TASK_SUFFIX]
    assert len(set(suffixes)) == len(suffixes)  # no two formats write the same file name
    export = load_export_set(analysed_tiny)
    for name, fmt in FORMATS.items():
        content = fmt.render(export)
        assert isinstance(content, bytes) and fmt.is_own(content[:4096])
        others = [other for other in FORMATS.values() if other is not fmt and other.is_own(content[:4096])]
        assert not others, f"{name}'s file is taken for {[o.name for o in others]}'s: --force could replace it"
    with pytest.raises(ValueError):
        register(FORMATS["pprof"])
    with pytest.raises(ConfigError, match="use one of speedscope, pprof, folded"):
        export_format("svg")
