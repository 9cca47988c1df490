"""The report's latency note: YSB's latency per window from events.json, beside the events and the
cycles per event, escaped (rendered with this tree's templates)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.report import render
from coordinator.report.latencyview import latency_note
from profiler.capture.format import EventCount, write_events
from profiler.capture.read import read_events
from tests.fixtures.flink_report import flink_run_dir, use_tree_templates

HOSTILE_DETAIL = '"><script>window.__pwned=8</script>'


@pytest.fixture
def tree_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    use_tree_templates(monkeypatch)


def with_latency(count: EventCount, detail: str = "read 15 s after") -> EventCount:
    return replace(count, latency_windows=200, latency_median_ms=2412.0, latency_p95_ms=4800.0,
                   latency_max_ms=5021.0, latency_min_ms=310.0, latency_detail=detail)


def test_latency_note_from_the_first_count_that_has_one() -> None:
    plain = EventCount(10, "s")
    text, detail = latency_note([None, plain, with_latency(plain), with_latency(plain, "second")])
    assert text == (
        "Latency per 10 s window (its last update in Redis minus its end): median 2.41 s, p95 4.80 s, "
        "max 5.02 s, min 0.31 s over the 200 windows that closed in the profiled window"
    )
    assert detail == "read 15 s after"
    assert latency_note([None, plain]) == ("", "")
    # a count of zero windows says nothing; a missing figure shows as "?"
    assert latency_note([replace(with_latency(plain), latency_windows=0)]) == ("", "")
    assert "p95 ?," in latency_note([replace(with_latency(plain), latency_p95_ms=None)])[0]


def test_report_shows_latency_beside_the_events_and_escapes_its_detail(tmp_path: Path, tree_templates: None) -> None:
    # GIVEN a run whose events.json carries the demo's latency per window, with a hostile detail
    run_dir = flink_run_dir(tmp_path / "runs")
    capture = run_dir / "hosts" / "node1"
    counted = read_events(capture)
    assert counted is not None
    write_events(capture, with_latency(counted, HOSTILE_DETAIL))
    # WHEN its report is rendered
    page = render.render_report(run_dir).read_text(encoding="utf-8")
    # THEN the tasks card holds the latency note after the events note, before the table with cycles per event
    tasks = page[page.index('id="tasks"'):]
    assert tasks.index("events processed in the window") < tasks.index("Latency per 10 s window") \
        < tasks.index("cycles / event")
    assert "median 2.41 s, p95 4.80 s, max 5.02 s, min 0.31 s over the 200 windows" in tasks
    # AND the detail is an attribute's text, never markup
    assert "<script>window.__pwned" not in page
    assert "&#34;&gt;&lt;script&gt;window.__pwned=8&lt;/script&gt;" in page


def test_no_latency_note_without_latency(tmp_path: Path, tree_templates: None) -> None:
    page = render.render_report(flink_run_dir(tmp_path / "runs")).read_text(encoding="utf-8")
    assert "Latency per 10 s window" not in page
