"""render_report from crafted run directories: files, payload, tables, pruning, publishing, CLI."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from coordinator.analysis.load import load_run
from coordinator.cli import main
from coordinator.report.flame import MIXED
from coordinator.report.publish import list_published, publish
from coordinator.report.render import REPORT_MARKER, VENDOR_FILES, render_report
from coordinator.rundir import host_capture_dir
from profiler.capture.folded import read_folded
from profiler.capture.format import result_file_name
from profiler.errors import CaptureFormatError, OutputExistsError
from profiler.files.outputs import MARKER
from tests.fixtures.report import HOSTILE_FRAMES, make_run_dir, read_payload, spark_stacks

TEMPLATES = Path(__file__).resolve().parents[4] / "templates"


def _summary_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "summary.csv", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_report_directory_is_complete_and_offline(crafted_run: Path) -> None:
    index = render_report(crafted_run)
    assert index == crafted_run / "report" / "index.html"
    report = index.parent
    for name in ("report.js", "report.css", "report.json", REPORT_MARKER):
        assert (report / name).is_file(), name
    for name in VENDOR_FILES:
        assert (report / "vendor" / name).read_bytes() == (TEMPLATES / "vendor" / name).read_bytes()
    html = index.read_text(encoding="utf-8")
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # no CDN
    assert '<script src="vendor/d3.min.js"></script>' in html
    assert '<script src="vendor/d3-flamegraph.min.js"></script>' in html
    summary = json.loads((report / "report.json").read_text())
    assert summary["run_id"] == crafted_run.name
    assert summary["labels"] == {"engine": "spark", "rate": "50k"}
    assert [h["state"] for h in summary["hosts"]] == ["ok", "failed"]


def test_payload_graphs_agree_with_the_stacks_and_the_summary(crafted_run: Path) -> None:
    payload = read_payload(render_report(crafted_run))
    frames = payload["frames"]
    assert isinstance(frames, list) and len(frames) == len(set(frames))  # interned once
    tasks = [t["name"] for t in payload["tasks"]]  # type: ignore[union-attr]
    assert tasks == ["Kafka", "Deserialize", "Filter", "Window", "GC", "unmatched"]
    graphs = {g["key"]: g for g in payload["graphs"]}  # type: ignore[union-attr]
    capture = host_capture_dir(crafted_run, "node1")
    per_pid = {pid: sum(read_folded(capture / "pids" / str(pid) / "stacks.folded").values()) for pid in (2201, 2202)}
    assert graphs["pid:node1:2201"]["samples"] == per_pid[2201]
    assert graphs["host:node1"]["samples"] == sum(per_pid.values())
    assert payload["defaultGraph"] == "host:node1"
    cluster = {r["task"]: r for r in _summary_rows(crafted_run) if r["host"] == "*"}
    for task in tasks:  # the matcher in the report and the pipeline agree on every task
        assert graphs[f"task:{task}"]["samples"] == int(cluster[task]["samples"]), task
    kafka = tasks.index("Kafka")
    root = graphs["task:Kafka"]["tree"]
    assert root[2] == kafka  # a drill-down graph holds one task only
    assert graphs["host:node1"]["tree"][2] == MIXED
    bars = payload["chart"]["bars"]  # type: ignore[index]
    assert [b["pid"] for b in bars] == ["2201", "2202"]
    assert payload["chart"]["unit"] == "cycles"  # type: ignore[index]


def test_page_shows_metadata_health_tables_and_candidates(crafted_run: Path) -> None:
    html = render_report(crafted_run).read_text(encoding="utf-8")
    assert "20260122-014700" in html
    assert '<span class="label-key">engine</span>spark' in html
    assert "node2: failed: connection refused (port 22)" in html
    assert "cycles estimated" in html
    assert "stacks lost" in html and "truncated" in html
    assert "of the samples matched no task" in html
    assert "JIT compiler threads took" in html and "of the workload processes&#39; samples" in html
    assert "profiler used 0.40 CPU s" in html and "post-run 1.2 s (0.9 CPU s)" in html
    # where the window's CPU went, largest first, and when the first sample came
    assert "CPU s by component: scope 0.30, reading 0.10; first sample 1.8 s after the command (1.4 CPU s)" in html
    assert "BPF programs 0.120 s in 5000 runs (estimated from 3 s of BPF statistics)" in html
    assert 'data-task="Kafka"' in html and 'data-task="unmatched"' in html
    assert "java/io/FileInputStream.read" in html  # top candidate pattern
    assert 'data-graph="pid:node1:2201"' in html
    assert "KafkaDataConsumer, org/apache/kafka" in html  # the profile used
    assert "± " in html  # shares carry their interval
    assert "Stacks and thread names of processes of these users:\n    spark." in html  # whose data it holds


def test_rerender_replaces_atomically_and_refuses_foreign_directories(crafted_run: Path, tmp_path: Path) -> None:
    first = render_report(crafted_run)
    (first.parent / "stale.txt").write_text("old")
    render_report(crafted_run)
    assert not (first.parent / "stale.txt").exists()
    assert [p.name for p in crafted_run.iterdir() if p.name.startswith(".")] == []  # no staging left
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    for force in (False, True):  # the user's own files: refused, even with --force (issue 32)
        with pytest.raises(OutputExistsError, match="did not write"):
            render_report(crafted_run, foreign, force=force)
        assert (foreign / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"  # another directory this tool wrote: replaced with --force only
    ours.mkdir()
    (ours / MARKER).write_text("written by coordinator analyze\n")
    (ours / "summary.csv").write_text("run,host,pid,task,samples,cycles\n")
    with pytest.raises(OutputExistsError, match="--force"):
        render_report(crafted_run, ours)
    assert render_report(crafted_run, ours, force=True).is_file()


def test_bare_host_capture_uses_its_result_csv(crafted_run: Path, tmp_path: Path) -> None:
    capture = host_capture_dir(crafted_run, "node1")
    bare = tmp_path / "cap"
    shutil.copytree(capture, bare)
    assert (bare / result_file_name("node1")).is_file()
    index = render_report(bare)
    payload = read_payload(index)
    assert payload["runId"] == "cap"
    html = index.read_text(encoding="utf-8")
    assert "single host capture" in html
    assert "summed over the PID rows of the host results" in html
    run = load_run(bare)
    assert run.bare_capture and run.rows_source == "host results"


def test_pruning_keeps_totals_and_says_how_to_see_everything(crafted_run: Path) -> None:
    index = render_report(crafted_run, max_stacks=3)
    payload = read_payload(index)
    host = next(g for g in payload["graphs"] if g["key"] == "host:node1")  # type: ignore[union-attr]
    full = next(g for g in read_payload(render_report(crafted_run, max_stacks=0))["graphs"]
                if g["key"] == "host:node1")  # type: ignore[union-attr]
    assert host["stacks"] == 3 and host["droppedStacks"] == full["stacks"] - 3
    assert host["samples"] == full["samples"]
    html = render_report(crafted_run, max_stacks=3).read_text(encoding="utf-8")
    assert "--max-stacks N" in html


def test_missing_profile_makes_every_stack_unmatched(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path, hostile=False)
    (run_dir / "application_profile.txt").unlink()
    (host_capture_dir(run_dir, "node1") / "application_profile.txt").unlink()
    (run_dir / "summary.csv").unlink()
    payload = read_payload(render_report(run_dir))
    graphs = {g["key"]: g for g in payload["graphs"]}  # type: ignore[union-attr]
    assert graphs["task:unmatched"]["samples"] == graphs["host:node1"]["samples"] > 0


def test_not_a_run_directory_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(CaptureFormatError, match="neither a run directory"):
        render_report(tmp_path)


def test_publish_two_runs_newest_first_and_replace(tmp_path: Path) -> None:
    older = make_run_dir(tmp_path / "runs", run_id="20260101-000000", labels={"build": "a"})
    newer = make_run_dir(tmp_path / "runs", run_id="20260122-014700", labels={"build": "<b>"},
                         executors={7: spark_stacks(1, hostile=False)})
    # the fixture uses one start time; make the older run older in its run.json
    run_json = json.loads((older / "run.json").read_text())
    run_json["start_time"] -= 86400
    (older / "run.json").write_text(json.dumps(run_json))
    site = tmp_path / "site"
    for run_dir in (newer, older):
        publish(render_report(run_dir).parent, site)
    assert [r.run_id for r in list_published(site)] == ["20260122-014700", "20260101-000000"]
    index = (site / "index.html").read_text(encoding="utf-8")
    assert index.index("20260122-014700/index.html") < index.index("20260101-000000/index.html")
    assert "build=&lt;b&gt;" in index
    (site / "20260122-014700" / "marker.txt").write_text("old copy")
    publish(render_report(newer).parent, site)
    assert not (site / "20260122-014700" / "marker.txt").exists()
    assert sorted(p.name for p in site.iterdir()) == [
        MARKER, "20260101-000000", "20260122-014700", "index.html", "report.css"
    ]
    assert (site / "index.html").stat().st_mode & 0o444 == 0o444  # a web server can read it


def test_publish_refuses_what_is_not_a_report(tmp_path: Path) -> None:
    with pytest.raises(CaptureFormatError, match="coordinator report"):
        publish(tmp_path, tmp_path / "site")


def test_cli_report_and_publish(crafted_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site"
    assert main(["report", str(crafted_run), "--max-stacks", "50", "--publish", str(site)]) == 0
    out = capsys.readouterr().out
    assert "report: wrote" in out and "next: coordinator serve" in out
    assert "payload" in out and "draw only their 50 largest stacks" not in out
    assert (site / crafted_run.name / "index.html").is_file()
    with pytest.raises(SystemExit):
        main(["report", str(crafted_run), "--max-stacks", "-1"])
    assert "must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", str(site), "--port", "70000"])
    assert "between 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "nothing-here")])
    assert "is not a directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == CaptureFormatError.exit_code
    err = capsys.readouterr().err
    assert "neither a run directory" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_hostile_frames_are_in_the_fixture() -> None:
    assert all(";" not in frame for frame in HOSTILE_FRAMES)  # a ';' would split the frame


def test_run_not_analysed_yet_is_pre_aggregated_like_the_host_agent(tiny_run: Path) -> None:
    # tiny_run (tests/fixtures/captures.py): no summary.csv, no <host>_result.csv, known answers
    index = render_report(tiny_run)
    payload = read_payload(index)
    bars = {b["pid"]: b["values"] for b in payload["chart"]["bars"]}  # type: ignore[index]
    assert bars["100"]["Kafka"] == pytest.approx(6e8)
    assert bars["100"]["Deserialize"] == pytest.approx(3e8)
    assert bars["200"]["unmatched"] == pytest.approx(3e8)
    html = index.read_text(encoding="utf-8")
    assert "the captures (pre-aggregated here)" in html
    assert '<span class="label-key">load</span>10k' in html


def test_summary_of_several_runs_shows_this_runs_rows(crafted_run: Path) -> None:
    summary = crafted_run / "summary.csv"
    lines = summary.read_text().splitlines()
    other = [line.replace(crafted_run.name, "other-run", 1).replace(",Kafka,", ",OtherTask,") for line in lines[1:]]
    summary.write_text("\n".join([*lines, *other]) + "\n")
    html = render_report(crafted_run).read_text(encoding="utf-8")
    assert 'data-task="Kafka"' in html and "OtherTask" not in html


def test_damaged_inputs_degrade_to_health_lines(crafted_run: Path) -> None:
    stacks = host_capture_dir(crafted_run, "node1") / "pids" / "2202" / "stacks.folded"
    stacks.write_text("not a folded line\n")
    run_json = json.loads((crafted_run / "run.json").read_text())
    run_json["hosts"].append(dict(run_json["hosts"][1], host="../evil<b>"))
    (crafted_run / "run.json").write_text(json.dumps(run_json))
    index = render_report(crafted_run)
    html = index.read_text(encoding="utf-8")
    assert "node1 PID 2202: stacks left out:" in html and "not a folded stack line" in html
    assert "../evil&lt;b&gt;: unreadable" in html
    graphs = {g["key"] for g in read_payload(index)["graphs"]}  # type: ignore[union-attr]
    assert "pid:node1:2201" in graphs and "pid:node1:2202" not in graphs


def test_events_are_stated_once_with_their_source(crafted_run: Path) -> None:
    html = render_report(crafted_run).read_text(encoding="utf-8")
    assert "300,000 events processed in the window (from --events)" in html
    assert "cycles / event" in html


def test_report_uses_the_profile_the_summary_was_computed_with(crafted_run: Path) -> None:
    # GIVEN a run re-analysed with an edited profile (analysis.json records its text)
    edited = "Everything: re:.\n"
    (crafted_run / "analysis.json").write_text(
        json.dumps({"format_version": 1, "profile_text": edited, "profile_source": "edited.txt"})
    )
    # WHEN the run is loaded for the report, THEN its colours come from the edited profile
    run = load_run(crafted_run)
    assert run.profile_text == edited and run.profile_source == "edited.txt"
    (crafted_run / "analysis.json").unlink()
    assert load_run(crafted_run).profile_text != edited


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"profile_text": "A: x"', "not valid JSON"),
        ("[1, 2]", "the file is a list"),
        ('{"profile_text": 7}', "profile_text is a number"),
        ('{"window": "all"}', "window is a string"),
    ],
)
def test_a_damaged_analysis_record_is_an_error_naming_it(crafted_run: Path, content: str, says: str) -> None:
    # GIVEN analysis.json beside summary.csv, damaged
    (crafted_run / "analysis.json").write_text(content)
    # WHEN the run is loaded for the report, THEN one error names the file and the fix (no silent fallback)
    with pytest.raises(CaptureFormatError) as raised:
        load_run(crafted_run)
    message = str(raised.value)
    assert "analysis.json" in message and says in message and "coordinator analyze" in message, message


def test_a_frame_named_from_a_borrowed_scope_keeps_its_mark_in_the_flamegraphs(tmp_path: Path) -> None:
    # GIVEN an executor whose Filter task's compiled frame was named from a borrowed PcDesc (issue 51)
    stacks = spark_stacks(0, hostile=False)
    marked = "com/example/Ysb$$Lambda$0x00007f3c8c0a1b20.apply [approx]"
    plain = "com/example/Ysb$$Lambda$0x00007f3c8c0a1b20.apply"
    stacks = {stack.replace(plain, marked): n for stack, n in stacks.items()}
    index = render_report(make_run_dir(tmp_path / "runs", executors={2201: stacks}))
    # THEN the frame keeps its mark (the flamegraph washes it out by it) and still matches its task
    payload = read_payload(index)
    assert marked in payload["frames"]  # type: ignore[operator]
    filter_graph = next(g for g in payload["graphs"] if g["key"] == "task:Filter")  # type: ignore[union-attr,index]
    assert filter_graph["samples"] == 25
    script = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    assert "var APPROX = / \\[approx\\]$/;" in script and "APPROX.test(name)" in script
