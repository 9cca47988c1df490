"""Campaigns without Spark or eBPF: campaign rows from the pipeline's summary (in-process engine),
cycles per event and its interval, label handling, the table, the command end to end and the page's
escaping, and the demo's campaign arguments."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest

from coordinator.analysis.campaign import (
    CAMPAIGN_COLUMNS,
    campaign_rows,
    figure_data,
    format_campaign,
    label_key_column,
    label_value_number,
    level_table,
    summary_label_columns,
)
from coordinator.analysis.engines import analyze
from coordinator.analysis.rows import read_summary
from coordinator.cli import main as coordinator_main
from coordinator.commands.campaign import varying_label
from profiler.errors import ConfigError
from profiler.matching.stats import share_ci95
from tests.fixtures.captures import gc_grown_runs, multi_run_hosts, write_run_dir

HOSTILE = "</script><img src=x onerror=alert(1)>"


def _levels(tmp_path: Path, levels: list[tuple[str, str, int]]) -> list[Path]:
    """One run per (spe, rate, scale); events grow with the rate, counts with the scale."""
    runs = []
    for index, (spe, rate, scale) in enumerate(levels):
        runs.append(
            write_run_dir(
                tmp_path / "runs" / f"r{index}",
                f"r{index}",
                multi_run_hosts(scale),
                labels={"spe": spe, "rate": rate, "workload": "ysb"},
                events={"h1": int(label_value_number(rate) or 0), "h2": int(label_value_number(rate) or 0)},
            )
        )
    return runs


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def three_levels(tmp_path: Path) -> list[Path]:
    return _levels(tmp_path, [("spark", "10k", 1), ("spark", "20k", 2), ("flink", "10k", 3)])


def test_rows_are_the_summary_cluster_rows_divided_by_events(three_levels: list[Path], tmp_path: Path) -> None:
    # GIVEN three runs analysed together by the pipeline (in-process engine)
    output = analyze(three_levels, out_dir=tmp_path / "campaign", engine="in-process")
    summary = read_summary(output.summary_csv)
    labels = summary_label_columns(list(summary[0]))
    assert labels == ["rate", "spe", "workload"]

    # WHEN the campaign rows are made
    rows = campaign_rows(summary, labels)

    # THEN one row per run and task (3 tasks, unmatched, *), the summary's own cells
    assert [(r.run, r.task) for r in rows[:5]] == [("r0", t) for t in ("Kafka", "Deserialize", "GC", "unmatched", "*")]
    assert len(rows) == 15
    cluster = {(r["run"], r["task"]): r for r in summary if r["host"] == "*" and r["pid"] == "*"}
    for row in rows:
        source = cluster[(row.run, row.task)]
        assert row.values["cycles_per_event"] == pytest.approx(float(source["cycles_per_event"]))
        assert row.values["events"] == int(source["events"])
    # AND the interval is the share's Wilson half-width scaled by the run's cycles per event
    kafka = next(r for r in rows if (r.run, r.task) == ("r1", "Kafka"))
    total = next(r for r in rows if (r.run, r.task) == ("r1", "*"))
    samples, all_samples = kafka.values["samples"], total.values["samples"]
    expected = share_ci95(samples, all_samples) * total.values["cycles"] / total.values["events"]
    assert kafka.values["cycles_per_event_ci95"] == pytest.approx(expected, rel=1e-5)
    assert total.values["cycles_per_event_ci95"] == 0
    assert kafka.labels == {"rate": "20k", "spe": "spark", "workload": "ysb"}

    # AND campaign.csv has the fixed columns then the labels, and is the same bytes for the same input
    text = format_campaign(rows, labels)
    assert text.splitlines()[0].split(",") == [*CAMPAIGN_COLUMNS, *labels]
    assert len(_csv(text)) == 15
    assert format_campaign(campaign_rows(summary, labels), labels) == text


def test_label_numbers_and_columns() -> None:
    assert [label_value_number(v) for v in ("20000", "2.5", "50k", "1M", "600K", "x", "", "10 k")] == [
        20000.0, 2.5, 50000.0, 1e6, 600000.0, None, None, 10000.0,
    ]  # fmt: skip
    assert label_key_column("rate", ["rate", "spe"]) == "rate"
    assert label_key_column("engine", ["label_engine"]) == "label_engine"  # renamed: shadows a fixed column
    with pytest.raises(ConfigError, match="labels: rate, spe"):
        label_key_column("nodes", ["rate", "spe"])
    assert varying_label({"rate": {"1", "2"}, "workload": {"ysb"}}) == "rate"
    with pytest.raises(ConfigError, match="--by"):
        varying_label({"rate": {"1", "2"}, "nodes": {"1", "4"}})
    with pytest.raises(ConfigError, match="--by"):
        varying_label({"rate": {"1"}})


def test_figure_and_table_order_levels_numerically_and_average_repeats(tmp_path: Path) -> None:
    # GIVEN spark at 9k, 10k (twice) and 100k; text order would put 100k before 9k
    runs = _levels(tmp_path, [("spark", "10k", 1), ("spark", "100k", 2), ("spark", "9k", 1), ("spark", "10k", 3)])
    output = analyze(runs, out_dir=tmp_path / "c", engine="in-process")
    summary = read_summary(output.summary_csv)
    rows = campaign_rows(summary, summary_label_columns(list(summary[0])))

    figure = figure_data(rows, "rate", "spe")
    assert figure["xs"] == ["9k", "10k", "100k"] and figure["numeric"]
    assert figure["tasks"] == ["Kafka", "Deserialize", "GC", "unmatched"]
    assert {p["xValue"] for p in figure["points"]} == {9000.0, 10000.0, 100000.0}

    levels, lines = level_table(rows, "rate", "spe")
    assert levels == [("spark", "9k"), ("spark", "10k"), ("spark", "100k")]
    assert [task for task, _ in lines] == ["Kafka", "Deserialize", "GC", "unmatched", "*"]
    kafka_10k = dict(lines)["Kafka"][1]
    assert kafka_10k is not None and kafka_10k.runs == 2
    repeats = [r.values["cycles_per_event"] for r in rows if r.task == "Kafka" and r.labels["rate"] == "10k"]
    assert kafka_10k.cycles_per_event == pytest.approx(sum(repeats) / 2)


def test_campaign_command_writes_csv_and_page(
    three_levels: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert coordinator_main(["campaign", *map(str, three_levels), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "x axis: label rate" in printed  # spe separates the lines, so rate is the one that varies
    rows = _csv((out / "campaign.csv").read_text())
    assert len(rows) == 15 and {r["spe"] for r in rows} == {"spark", "flink"}
    index = out / "report" / "index.html"
    assert {p.name for p in index.parent.iterdir()} >= {"index.html", "campaign.js", "report.css", "vendor"}
    assert (index.parent / "vendor" / "d3.min.js").is_file()
    assert "https://" not in index.read_text()  # offline: no CDN
    # AND a second campaign into the same directory replaces it; a run directory is refused
    assert coordinator_main(["campaign", *map(str, three_levels), "--out", str(out), "--by", "rate"]) == 0
    assert coordinator_main(["campaign", *map(str, three_levels), "--out", str(three_levels[0])]) != 0
    assert coordinator_main(["campaign", *map(str, three_levels), "--out", str(out), "--by", "nodes"]) == 2


def test_page_carries_hostile_labels_as_data(tmp_path: Path) -> None:
    from coordinator.report.campaign import render_campaign_html

    runs = _levels(tmp_path, [(HOSTILE, "1k", 1), (HOSTILE, "2k", 2)])
    output = analyze(runs, out_dir=tmp_path / "c", engine="in-process")
    summary = read_summary(output.summary_csv)
    rows = campaign_rows(summary, summary_label_columns(list(summary[0])))
    html = render_campaign_html(rows, "rate", "spe", "hostile")
    assert HOSTILE not in html  # never as markup: escaped in text, \u003c in the JSON
    start = html.index('id="campaign-data" type="application/json">') + len(
        'id="campaign-data" type="application/json">'
    )
    payload = json.loads(html[start : html.index("</script>", start)])
    assert payload["seriesValues"] == [HOSTILE]


def test_demo_campaign_arguments() -> None:
    from coordinator.commands.demo import DemoCommand

    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    default = parser.parse_args([])
    assert default.rates is None and default.rate == 20_000 and default.spe == ["spark-str"]
    parsed = parser.parse_args(["--rates", "5000, 10000,20000", "--spe", "spark-str,flink"])
    assert parsed.rates == [5000, 10000, 20000] and parsed.spe == ["spark-str", "flink"]
    for bad in (["--rates", "5000,5000"], ["--rates", "0,10"], ["--rates", ","], ["--rate", "5", "--rates", "5,6"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


# ---------------------------------------------------------------- compare: differential flamegraph


def test_diff_flamegraph_known_answer() -> None:
    from coordinator.report.flame import FrameTable, build_diff_flamegraph

    # GIVEN A: 80 x;a + 20 x;b, and B: 40 x;a + 60 x;b (same total, B moved samples from a to b)
    frames = FrameTable()
    graph = build_diff_flamegraph({"x;a": 80, "x;b": 20}, {"x;a": 40, "x;b": 60, "y": 0}, frames)
    name, a, b, delta, significant, children = graph.tree
    assert (frames.names[name], a, b, delta, significant) == ("all", 100, 100, 0.0, 0)
    ((x, xa, xb, xdelta, xsig, grandchildren),) = children
    assert (frames.names[x], xa, xb, xdelta, xsig) == ("x", 100, 100, 0.0, 0)
    by_name = {frames.names[c[0]]: c for c in grandchildren}
    assert by_name["a"][1:5] == [80, 40, -0.4, 1]  # share fell 40 points: significant
    assert by_name["b"][1:5] == [20, 60, 0.4, 1]
    assert [frames.names[c[0]] for c in grandchildren] == ["a", "b"]  # widest first
    # AND a small change in a small sample is not significant
    small = build_diff_flamegraph({"x;a": 5, "x;b": 5}, {"x;a": 6, "x;b": 4}, FrameTable())
    assert [c[4] for c in small.tree[5][0][5]] == [0, 0]


def test_compare_out_writes_table_and_differential_flamegraph(tmp_path: Path) -> None:
    # GIVEN two analysed runs whose GC share doubled
    run_a, run_b = gc_grown_runs(tmp_path)
    # WHEN compare writes its page
    out = tmp_path / "cmp"
    assert coordinator_main(["compare", str(run_a), str(run_b), "--out", str(out)]) == 0
    # THEN compare.csv and the page with the merged tree are there, GC grew significantly
    rows = {r["task"]: r for r in _csv((out / "compare.csv").read_text())}
    assert rows["GC"]["significant"] == "1" and float(rows["GC"]["share_delta"]) == pytest.approx(0.2)
    html = (out / "index.html").read_text()
    start = html.index('id="compare-data" type="application/json">') + len('id="compare-data" type="application/json">')
    payload = json.loads(html[start : html.index("</script>", start)])
    assert (payload["samplesA"], payload["samplesB"]) == (1000, 1000)
    assert "GC Thread#0" in payload["frames"]
    assert (out / "vendor" / "d3-flamegraph.min.js").is_file()
    # AND a second comparison replaces the page; a directory that is not one is refused
    assert coordinator_main(["compare", str(run_a), str(run_b), "--out", str(out)]) == 0
    assert coordinator_main(["compare", str(run_a), str(run_b), "--out", str(run_a)]) != 0
