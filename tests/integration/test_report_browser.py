"""The report in a real headless Chromium, opened from disk: renders, searches, zooms, drills down,
shows hostile frame names as text, logs no error. Screenshots go to tests/artifacts/."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from coordinator.report.publish import publish
from coordinator.report.render import render_report
from tests.fixtures.browser import Chromium
from tests.fixtures.flink_report import flink_run_dir, flink_vertex_run_dir, use_tree_templates
from tests.fixtures.report import HOSTILE_FRAMES, make_run_dir

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SEARCH_COLOR = "#e600e6"

CLEAR_SEARCH = "(s => { s.value = ''; s.dispatchEvent(new Event('input')); })(document.getElementById('flame-search'))"
FRAMES = "document.querySelectorAll('#flame g.frame')"
FRAME_COUNT = "document.querySelectorAll('#flame g.frame').length"


def _labels_settled(browser: Chromium) -> None:
    """d3-flame-graph animates widths and writes labels after its transition; wait for both."""
    browser.wait_for(
        "Array.from(document.querySelectorAll('#flame g.frame .d3-flame-graph-label'))"
        ".filter(d => d.textContent.length > 0).length > 3"
    )
    widths = f"JSON.stringify(Array.from({FRAMES}).map(g => g.querySelector('rect').getAttribute('width')))"
    deadline = time.monotonic() + 10
    previous = browser.evaluate(widths)
    while time.monotonic() < deadline:
        time.sleep(0.15)
        current = browser.evaluate(widths)
        if current == previous:
            return
        previous = current
    raise AssertionError("flamegraph transitions did not settle")


def _frame_box(browser: Chromium, name: str) -> list[float]:
    box = browser.evaluate(
        "(() => { const g = Array.from(document.querySelectorAll('#flame g.frame'))"
        f".find(g => g.getAttribute('name') === {json.dumps(name)}); if (!g) return null;"
        " g.scrollIntoView({block: 'center'}); const r = g.querySelector('rect').getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2, r.width]; })()"
    )
    assert box is not None, f"no frame named {name!r} drawn"
    return list(box)


def test_report_in_headless_chromium(tmp_path: Path, chromium: Chromium) -> None:
    # GIVEN a run with two executors, a failed host and frames that look like markup
    run_dir = make_run_dir(tmp_path / "runs")
    index = render_report(run_dir)

    # WHEN Chromium opens the report from disk
    chromium.open(index.as_uri())
    assert chromium.wait_for(FRAME_COUNT) > 10
    _labels_settled(chromium)
    assert chromium.evaluate("window.spReport.key") == "host:node1"

    # THEN the stacked chart has one bar segment per executor and task
    assert chromium.evaluate("document.querySelectorAll('#stacked-chart svg rect').length") == 2 * 6
    # hostile frame names are drawn literally and nothing they contain ran or became an element
    for frame in HOSTILE_FRAMES:
        texts = chromium.evaluate(
            "Array.from(document.querySelectorAll('#flame g.frame'))"
            f".filter(g => g.getAttribute('name') === {json.dumps(frame)})"
            ".map(g => [g.querySelector('.d3-flame-graph-label').textContent, g.querySelector('title').textContent])"
        )
        assert texts, frame
        label, title = texts[0]
        assert title.startswith(frame)
        assert label in ("", frame)  # empty when the frame is too narrow for a label
    assert chromium.evaluate("typeof window.__pwned") == "undefined"
    assert chromium.evaluate("document.querySelectorAll('img, #flame b, #unmatched b').length") == 0
    candidates = chromium.evaluate(
        "Array.from(document.querySelectorAll('table.candidates code')).map(c => c.textContent)"
    )
    assert set(HOSTILE_FRAMES) <= set(candidates)

    # hovering a frame explains it in the details line, as text
    x, y, _ = _frame_box(chromium, "com/example/Event.<init>")
    chromium.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    details = chromium.wait_for(
        "(t => t.includes('Event.<init>') ? t : '')(document.getElementById('flame-details').textContent)"
    )
    assert "task Deserialize" in details and "deciding frame for Deserialize" in details

    # search highlights the matching frames (and a regex metacharacter is just text)
    chromium.type_into("#flame-search", "HashMap")
    highlighted = chromium.wait_for(
        "Array.from(document.querySelectorAll('#flame g.frame rect'))"
        f".filter(r => r.getAttribute('fill') === '{SEARCH_COLOR}').map(r => r.parentNode.getAttribute('name'))"
    )
    assert highlighted and all("HashMap" in name for name in highlighted)
    assert "frames match" in chromium.evaluate("document.getElementById('search-info').textContent")
    chromium.evaluate(CLEAR_SEARCH)
    chromium.type_into("#flame-search", "Ysb$$Lambda$0x00007F3C8C0A1B20")  # literal, case-insensitive
    assert chromium.wait_for("document.getElementById('search-info').textContent.startsWith('1 frames match')")
    chromium.evaluate(CLEAR_SEARCH)
    chromium.type_into("#flame-search", "(")  # not a regular expression: no exception, no match
    assert chromium.wait_for("document.getElementById('search-info').textContent.startsWith('0 frames match')")
    chromium.evaluate(CLEAR_SEARCH)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    chromium.screenshot(ARTIFACTS / "report.png")

    # clicking a frame zooms into it
    x, y, width_before = _frame_box(chromium, "org/apache/spark/sql/kafka010/KafkaDataConsumer.get")
    for kind in ("mousePressed", "mouseReleased"):
        chromium.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
    chromium.wait_for(
        "(() => { const g = Array.from(document.querySelectorAll('#flame g.frame')).find(g => "
        "g.getAttribute('name') === 'org/apache/spark/sql/kafka010/KafkaDataConsumer.get');"
        f" return g && g.querySelector('rect').getBoundingClientRect().width > {width_before} * 2; }})()"
    )

    # clicking a task in the legend opens its drill-down flamegraph
    chromium.click("#legend .legend-item[data-task='Filter']")
    assert chromium.wait_for("window.spReport.key === 'task:Filter'")
    assert chromium.evaluate("document.getElementById('graph-select').value") == "task:Filter"
    _labels_settled(chromium)
    names = chromium.evaluate(f"Array.from({FRAMES}).map(g => g.getAttribute('name'))")
    assert "org/apache/spark/sql/execution/FilterExec.doExecute" in names
    assert not any("Kafka" in name for name in names)
    legend_class = chromium.evaluate("document.querySelector(\"#legend [data-task='Filter']\").className")
    assert "legend-item active" in legend_class
    # and so does a task in the table
    chromium.click("#tasks button.task-link[data-task='unmatched']")
    assert chromium.wait_for("window.spReport.key === 'task:unmatched'")
    chromium.click("#hosts button.pid-link[data-graph='pid:node1:2202']")
    assert chromium.wait_for("window.spReport.key === 'pid:node1:2202'")
    chromium.click("#legend .legend-item[data-task='Kafka']")
    assert chromium.wait_for("window.spReport.key === 'task:Kafka'")
    _labels_settled(chromium)
    chromium.screenshot(ARTIFACTS / "report-drilldown.png")

    assert chromium.errors() == []


def test_published_index_links_to_the_report(tmp_path: Path, chromium: Chromium) -> None:
    site = tmp_path / "site"
    publish(render_report(make_run_dir(tmp_path / "runs", labels={"engine": "spark"})).parent, site)
    chromium.open((site / "index.html").as_uri())
    assert chromium.evaluate("document.querySelectorAll('table.runs tbody tr').length") == 1
    assert "engine=spark" in chromium.evaluate("document.querySelector('table.runs').textContent")
    chromium.click("table.runs a")
    chromium.wait_event("Page.loadEventFired")
    assert chromium.wait_for(FRAME_COUNT) > 10
    assert chromium.errors() == []


def test_time_chart_and_sub_window_in_headless_chromium(
    tmp_path: Path, chromium: Chromium, timeline_run: Path
) -> None:
    # GIVEN a ring-buffer capture of two executors with three 10 s intervals (GC and JIT in the first)
    index = render_report(make_run_dir(tmp_path / "runs", intervals=3, hostile=False))

    # WHEN Chromium opens the report
    chromium.open(index.as_uri())
    chromium.wait_for(FRAME_COUNT)

    # THEN node1's time chart has one series per task with samples (all five tasks and unmatched)
    series = "Array.from(document.querySelectorAll('#time-chart .time-host svg path.series'))"
    assert chromium.wait_for(f"{series}.length") == 6
    assert chromium.evaluate(f"{series}.map(p => p.getAttribute('data-task'))") == [
        "Kafka", "Deserialize", "Filter", "Window", "GC", "unmatched"
    ]
    assert chromium.evaluate("document.getElementById('time-unit').value") == "cycles"
    # every unit draws, and hovering an interval explains it
    for unit in ("share", "samples", "cycles"):
        chromium.evaluate(
            f"(s => {{ s.value = '{unit}'; s.dispatchEvent(new Event('change')); }})"
            "(document.getElementById('time-unit'))"
        )
        assert chromium.evaluate(f"{series}.length") == 6
    box = chromium.evaluate(
        "(() => { const s = document.querySelector('#time-chart svg'); s.scrollIntoView({block: 'center'});"
        " const r = s.getBoundingClientRect(); return [r.left + 70, r.top + 100]; })()"
    )
    chromium.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]})
    details = chromium.wait_for(
        "(t => t.startsWith('0–10 s') ? t : '')(document.querySelector('#time-chart .time-details').textContent)"
    )
    assert "GC" in details and "cycles" in details
    # the profiler's own RSS and CPU over the window, and the sampler's per-PID health
    assert chromium.evaluate("document.querySelectorAll('#overhead-chart svg path.line').length") == 2
    health = chromium.evaluate("document.getElementById('health').textContent")
    assert "node1 PID 2201" in health and "Java frames unresolved" in health and "dropped (ring buffer full" in health
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    chromium.screenshot(ARTIFACTS / "report-time-chart.png")
    assert chromium.errors() == []

    # GIVEN a run analysed for a sub-window
    from coordinator.analysis.engines import analyze
    from coordinator.analysis.timeline import SubWindow

    analyze([timeline_run], engine="in-process", window=SubWindow(12, 19))
    chromium.open(render_report(timeline_run).as_uri())
    # THEN the header names the intervals used, the chart shades them and keeps one series per task
    meta = chromium.wait_for("document.querySelector('.masthead .meta').textContent")
    assert "sub-window" in meta and "10–20 s of the window (--from 12 --to 19; whole 10 s intervals)" in meta
    assert chromium.wait_for(f"{series}.length") == 4  # Kafka, Deserialize, GC, unmatched
    shade = chromium.evaluate("document.querySelector('#time-chart rect.subwindow').getAttribute('width')")
    assert float(shade) > 0
    # PID 200 has no counters timeline: its window cycles are split by its samples per interval
    assert chromium.evaluate("document.getElementById('time-unit').value") == "cycles"
    assert chromium.errors() == []


def test_flink_vertices_beside_the_samples_in_chromium(
    tmp_path: Path, chromium: Chromium, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a Flink run with Flink's own view of its vertices (rendered with this tree's templates)
    use_tree_templates(monkeypatch)
    index = render_report(flink_run_dir(tmp_path / "runs"))
    # WHEN Chromium opens it
    chromium.open(index.as_uri())
    chromium.wait_for("document.querySelectorAll('#flink tbody tr').length === 2")
    # THEN each vertex row shows Flink's busy time and the sampled on-CPU time side by side, on screen
    rows = chromium.evaluate(
        "Array.from(document.querySelectorAll('#flink tbody tr')).map(r => [r.dataset.vertex,"
        " r.querySelector('.flink-busy').textContent, r.querySelector('.flink-on-cpu').textContent,"
        " r.querySelector('.flink-on-cpu').getBoundingClientRect().left"
        " - r.querySelector('.flink-busy').getBoundingClientRect().right])"
    )
    assert [row[:3] for row in rows] == [["Source: GenSource -> ToKeyed", "180", "150"],
                                         ["WindowSum -> Discard: Writer", "400", "50"]], rows
    assert all(0 < row[3] < 400 for row in rows), rows  # the same row, a few columns apart
    assert chromium.evaluate("document.querySelector('#flink').getBoundingClientRect().height") > 50
    assert chromium.evaluate("!!document.querySelector('nav.toc a[href=\"#flink\"]')")
    chromium.evaluate("document.querySelector('#flink').scrollIntoView()")
    chromium.screenshot(ARTIFACTS / "report-flink.png")
    assert chromium.errors() == []


def test_flink_samples_by_vertex_subtask_and_operator_in_chromium(
    tmp_path: Path, chromium: Chromium, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a Flink run analysed with --by vertex (two subtasks per vertex, a vertex name with markup)
    use_tree_templates(monkeypatch)
    index = render_report(flink_vertex_run_dir(tmp_path / "runs"))
    # WHEN Chromium opens its report
    chromium.open(index.as_uri())
    chromium.wait_for("document.querySelectorAll('#vertices table.subtasks tbody tr').length === 4")
    # THEN each subtask has its own row with its TaskManager and PID, the markup stays text
    subtasks = chromium.evaluate(
        "Array.from(document.querySelectorAll('#vertices table.subtasks tbody tr')).map(r =>"
        " Array.from(r.cells).slice(0, 6).map(c => c.textContent))"
    )
    assert sorted(row[:2] for row in subtasks) == [
        ["Source: <b>Gen</b> -> ToKeyed", "1/2"], ["Source: <b>Gen</b> -> ToKeyed", "2/2"],
        ["WindowSum -> Discard: Writer", "1/2"], ["WindowSum -> Discard: Writer", "2/2"],
    ], subtasks
    assert {row[3] for row in subtasks if row[0].startswith("Source")} == {"127.0.0.1:40935-75c27a"}
    assert {row[5] for row in subtasks} == {"2201"}
    assert chromium.evaluate("document.querySelectorAll('#vertices b').length") == 0
    # AND per vertex the operators of its chain and what stays "chain, operator unknown"
    vertices = chromium.evaluate(
        "Array.from(document.querySelectorAll('#vertices table.vertex-operators tbody tr')).map(r =>"
        " [r.dataset.vertex, r.cells[3].textContent, r.querySelector('.operator-unknown').textContent])"
    )
    by_name = {row[0]: row for row in vertices}
    assert "WindowSum" in by_name["WindowSum -> Discard: Writer"][1], vertices
    assert by_name["Source: <b>Gen</b> -> ToKeyed"][2].strip() != "", vertices
    assert chromium.evaluate("!!document.querySelector('nav.toc a[href=\"#vertices\"]')")
    chromium.evaluate("document.querySelector('#vertices').scrollIntoView()")
    chromium.screenshot(ARTIFACTS / "report-flink-vertices.png")
    assert chromium.errors() == []
