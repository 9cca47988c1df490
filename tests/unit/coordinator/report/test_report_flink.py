"""The report's Flink section: Flink's own busy/back-pressured/idle per vertex beside the sampled on-CPU
time, and the events note with the count's uncertainty (rendered with this tree's templates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.report import render
from tests.fixtures.flink_report import SOURCE, WINDOW, flink_run_dir, use_tree_templates
from tests.fixtures.report import make_run_dir


@pytest.fixture
def tree_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    use_tree_templates(monkeypatch)


def test_flink_vertices_show_flinks_times_beside_the_sampled_on_cpu_time(tmp_path: Path, tree_templates: None) -> None:
    # GIVEN a run with flink.json; WHEN its report is rendered
    index = render.render_report(flink_run_dir(tmp_path / "runs"))
    page = index.read_text(encoding="utf-8")
    # THEN the Flink section lists both vertices, source first, with busy beside on-CPU per subtask
    assert "Flink&#39;s own view beside the samples" in page or "Flink's own view beside the samples" in page
    assert page.index(SOURCE.replace(">", "&gt;")) < page.index(WINDOW.replace(">", "&gt;"))
    run = render.load_run(index.parent.parent)
    view = render.build_view(run, {h.name: render.load_stacks(h.capture) for h in run.hosts if h.capture})
    lines = {line.name: line for line in view.flink_vertices}
    assert lines[SOURCE].on_cpu_ms_per_s == pytest.approx(150.0) and lines[SOURCE].samples == 891
    assert lines[WINDOW].on_cpu_ms_per_s == pytest.approx(50.0)
    assert lines[WINDOW].busy_off_cpu_ms_per_s == pytest.approx(350.0)  # busy 400, on CPU 50: waiting
    assert lines[SOURCE].records_in == 600_000 and lines[SOURCE].records_in_uncertainty == 1200.0
    # AND the events note (summary.csv's count, 300,000 in the fixture) carries the uncertainty and the method
    assert "300,000 events processed in the window (from flink-rest:http://127.0.0.1:8081) ± 1,200, 0.40 %, "\
        "interpolated between metric-cache refreshes" in view.events_note


def test_no_flink_section_without_flink_json(tmp_path: Path, tree_templates: None) -> None:
    index = render.render_report(make_run_dir(tmp_path / "runs", hostile=False))
    assert 'id="flink"' not in index.read_text(encoding="utf-8")


def test_health_says_when_subtasks_are_not_mapped_to_taskmanagers(tmp_path: Path, tree_templates: None) -> None:
    # GIVEN a Flink run whose flink.json has no placement (REST gone at the end), and one that has it
    from tests.fixtures.flink_report import flink_vertex_run_dir

    for run_dir, expected in ((flink_run_dir(tmp_path / "a"), "warn"), (flink_vertex_run_dir(tmp_path / "b"), "ok")):
        run = render.load_run(run_dir)
        view = render.build_view(run, {h.name: render.load_stacks(h.capture) for h in run.hosts if h.capture})
        # THEN a health line says whether the mapping to TaskManager ids is there
        (line,) = [h for h in view.health if h.topic.endswith("Flink subtasks")]
        assert line.level == expected, line
        if expected == "warn":
            assert "mapping of subtasks to TaskManager ids is missing" in line.text
            assert view.flink_run and not view.subtask_lines  # the section says how to get vertex rows
        else:
            assert "1 of them sampled on this host" in line.text and len(view.subtask_lines) == 4
