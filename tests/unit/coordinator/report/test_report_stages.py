"""The report's Spark view: codegen frames named by their operators, the stage table from summary.csv's
stage rows, and a health line when the driver's REST API did not answer (rendered with this tree's
templates)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

import coordinator.report.render as render
from coordinator.analysis.stages import STAGE_COLUMNS
from profiler.capture.format import format_result_csv
from tests.fixtures.flink_report import use_tree_templates
from tests.fixtures.report import make_run_dir, read_payload, spark_stacks
from tests.unit.engines.test_spark_stages import GEN, recorded_plan


@pytest.fixture
def tree_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    use_tree_templates(monkeypatch)


def _run_with_spark(tmp_path: Path, plans: dict[str, Any]) -> Path:
    stacks = spark_stacks(0, hostile=False)
    stacks["Executor task launch worker;org/apache/spark/executor/Executor$TaskRunner.run;" + GEN.format(2)] = 20
    run_dir = make_run_dir(tmp_path / "runs", executors={2201: stacks})
    (run_dir / "hosts" / "node1" / "spark.json").write_text(json.dumps(plans), encoding="utf-8")
    summary = run_dir / "summary.csv"
    with open(summary, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        columns = tuple(reader.fieldnames or ())
        rows = list(reader)
    columns = (*columns, *STAGE_COLUMNS)
    stage = {"run": rows[0]["run"], "host": "*", "pid": "*", "role": "workload", "engine": "spark", "stage": "0.0",
             "job": "0", "query": "ysb", "batch": "0"}
    rows += [{**stage, "task": "Deserialize", "samples": "30", "share": "0.75"},
             {**stage, "task": "unmatched", "samples": "10", "share": "0.25"},
             {**stage, "task": "*", "samples": "40", "share": "1", "cycles": "4000"}]
    summary.write_text(format_result_csv(rows, columns), encoding="utf-8")
    return run_dir


def test_codegen_frames_and_stages_are_named_in_the_report(tmp_path: Path, tree_templates: None) -> None:
    run_dir = _run_with_spark(tmp_path, recorded_plan())
    index = render.render_report(run_dir)
    payload = read_payload(index)
    assert GEN.format(2) + " [codegen stage 2: Project, BroadcastHashJoin]" in payload["frames"]  # type: ignore[operator]
    page = index.read_text(encoding="utf-8")
    assert "Spark stages" in page and "Whole-stage code generation" in page
    assert "Deserialize 75.0 %" in page and "Filter, Project, HashAggregate" in page
    # stage rows never reach the task tables: the cluster table still holds its own rows only
    assert payload["tasks"] and "Spark REST API" not in page


def test_without_the_rest_api_the_report_says_so(tmp_path: Path, tree_templates: None) -> None:
    plans = {"format_version": 1, "plans": [], "notes": ["no Spark driver REST API answered (drivers: 7)"]}
    index = render.render_report(_run_with_spark(tmp_path, plans))
    page = index.read_text(encoding="utf-8")
    assert "Spark REST API" in page and "no Spark driver REST API answered" in page
    assert "[codegen stage" not in json.dumps(read_payload(index)["frames"])
