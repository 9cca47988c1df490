"""draft-profile's Flink side: tasks named after the job's operators, patterns from the stacks under
each vertex's task threads, a chain task for what no operator claims, Flink's runtime, other threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.analysis.flinkdraft import draft_flink_profile, flink_vertices_of, operators_of
from coordinator.analysis.inputs import read_inputs
from profiler.capture.format import VertexWindow, write_flink_vertices
from tests.fixtures.captures import TINY_PID_100, TINY_PID_200, write_run_dir

SOURCE = VertexWindow("j", "ysb", "v1", "Source: YSB generator -> DeserializeBolt -> EventFilterBolt", 2, True)
WINDOW = VertexWindow("j", "ysb", "v2", "CampaignProcessor -> RedisResultSink: Writer", 2, False)
TASK = "org.apache.flink.streaming.runtime.tasks.StreamTask::invoke"
STACKS = {
    # the source chain: generator, then the user's functions nested inside its collect() calls
    f"Source: YSB gen;{TASK};org.apache.flink.connector.datagen.source.GeneratorSourceReader::pollNext;"
    "ysb.YsbFlink$EventGenerator::map": 300,
    f"Source: YSB gen;{TASK};org.apache.flink.connector.datagen.source.GeneratorSourceReader::pollNext;"
    "ysb.YsbFlink$DeserializeBolt::flatMap;com.fasterxml.jackson.core.JsonParser::nextToken": 250,
    f"Source: YSB gen;{TASK};ysb.YsbFlink$DeserializeBolt::flatMap;ysb.YsbFlink$EventFilterBolt::filter": 50,
    "Source: YSB generator -> DeserializeBolt -> EventFilterBolt (1/2)#0;[unknown]": 20,
    # the window chain: Flink's window operator (the user's aggregate inlined), the sink writer
    f"CampaignProcess;{TASK};org.apache.flink.streaming.runtime.operators.windowing.WindowOperator::"
    "processElement": 120,
    f"CampaignProcess;{TASK};ysb.YsbFlink$RedisResultSink$Writer::write;java.net.SocketOutputStream::write": 80,
    # runtime and other threads
    "Flink Netty Ser;org.apache.flink.shaded.netty4.io.netty.channel.nio.NioEventLoop::run": 90,
    "C2 CompilerThre;Compile::Optimize": 60,
    "flink-metrics-12;java.lang.Thread::run": 5,
    "flink-metrics-3;java.lang.Thread::run": 5,
}


def test_operators_of_a_chain() -> None:
    assert operators_of("Source: GenSource -> ToKeyed") == ["Source: GenSource", "ToKeyed"]
    assert operators_of("WindowSum -> Discard: Writer") == ["WindowSum", "Discard: Writer"]


def test_draft_names_operators_finds_their_classes_and_leaves_little_unmatched() -> None:
    # GIVEN stacks of a YSB-like job and its two vertices; WHEN a profile is drafted
    draft = draft_flink_profile(STACKS, [WINDOW, SOURCE], "runs/x")
    shares = {task: samples for task, samples, _share in draft.shares}
    # THEN each operator whose class or kind is in the stacks is a task, innermost operators win
    assert shares["Source - YSB generator"] == 300
    assert shares["DeserializeBolt"] == 250
    assert shares["EventFilterBolt"] == 50
    assert shares["CampaignProcessor"] == 120  # Flink's window operator: the user's function was inlined
    assert shares["RedisResultSink - Writer"] == 80
    assert "ysb.YsbFlink$DeserializeBolt" in draft.text
    source_line = next(line for line in draft.text.splitlines() if line.startswith("Source - YSB generator:"))
    assert "ysb.YsbFlink$EventGenerator" in source_line and "org.apache.flink.connector.datagen" in source_line
    # AND the chain's own threads keep the rest, the runtime and other threads are named
    assert shares["Source - YSB generator -> DeserializeBolt -> EventFilterBolt (chain, operator unknown)"] == 20
    assert shares["Network (Flink shuffle)"] == 90 and shares["JIT compiler"] == 60
    assert shares["Other threads"] == 10 and "re:^flink\\-metrics\\-\\d+" in draft.text
    assert draft.unmatched_share == 0.0 and draft.samples == sum(STACKS.values())
    # AND the text parses as a profile whose source tasks come first
    assert draft.profile.task_names[0] == "Source - YSB generator"


def test_flink_vertices_of_a_run_come_from_its_flink_json(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "r", "r", {"h1": [TINY_PID_100], "h2": [TINY_PID_200]})
    write_flink_vertices(run_dir / "hosts" / "h2", [SOURCE, WINDOW])
    (run,) = read_inputs([run_dir])
    assert flink_vertices_of(run) == (SOURCE, WINDOW)
    (bare,) = read_inputs([run_dir / "hosts" / "h1"])
    assert flink_vertices_of(bare) == ()


def test_draft_profile_command_drafts_a_flink_run_from_its_job_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a run whose capture has flink.json (its job's vertices)
    from coordinator.cli import main

    run_dir = write_run_dir(tmp_path / "r", "r", {"h1": [TINY_PID_100]})
    write_flink_vertices(run_dir / "hosts" / "h1", [SOURCE, WINDOW])
    out = tmp_path / "drafted.txt"
    # WHEN draft-profile runs on it
    assert main(["draft-profile", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().err
    # THEN the tasks come from the job graph (each vertex's chain), not Spark's plan, and no Spark note is given
    text = out.read_text()
    assert "Flink job's operators" in text
    assert "Source - YSB generator -> DeserializeBolt -> EventFilterBolt (chain, operator unknown):" in text
    assert "CampaignProcessor -> RedisResultSink - Writer (chain, operator unknown):" in text
    assert "codegen" not in printed and "no Spark plan" not in printed
    assert "--by stage" not in printed and "--by vertex" in printed


@pytest.mark.parametrize("engine", ["flink", "spark"])
def test_draft_profile_on_stdout_is_only_the_profile(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a Flink run (flink.json) or a Spark run without spark.json (a note is due)
    from coordinator.cli import main
    from profiler.matching.appprofile import load_profile

    run_dir = write_run_dir(tmp_path / "r", "r", {"h1": [TINY_PID_100]})
    if engine == "flink":
        write_flink_vertices(run_dir / "hosts" / "h1", [SOURCE, WINDOW])
    # WHEN draft-profile runs without --out, as `coordinator draft-profile RUN > my.txt`
    assert main(["draft-profile", str(run_dir)]) == 0
    captured = capsys.readouterr()
    redirected = tmp_path / "my.txt"
    redirected.write_text(captured.out)
    # THEN what stdout held parses as a profile, and is the very text --out writes
    profile = load_profile(redirected)
    assert profile.task_names
    out = tmp_path / "out.txt"
    assert main(["draft-profile", str(run_dir), "--out", str(out)]) == 0
    assert out.read_text() == captured.out and capsys.readouterr().out == ""
    # AND the shares, notes and next steps went to stderr, none of them to stdout
    assert "shares on this run" in captured.err and "next:" in captured.err
    assert "shares on this run" not in captured.out and "next:" not in captured.out
    assert ("no Spark plan" in captured.err) == (engine == "spark")
