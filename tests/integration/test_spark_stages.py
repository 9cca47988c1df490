"""Spark-aware attribution on real Spark, real eBPF and the real demo (issue 18): every executor task
sample knows its stage from the thread's full name, summary.csv can be cut by stage with the driver's
job and micro-batch, the report names codegen stages by their operators, and a drafted profile gives
every task samples and leaves less than 10 % unmatched, on Structured Streaming and on Continuous
Processing. The demo runs are the session's (tests/fixtures/demo.py), shared with test_demo.py."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from profiler.capture.folded import format_folded
from profiler.capture.stacktable import read_table
from tests.fixtures.demo import DemoRun

REPO = Path(__file__).resolve().parents[2]


def _coordinator(*args: str, timeout: float = 900) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"coordinator {args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _cluster_rows(summary: Path) -> list[dict[str, str]]:
    with open(summary, newline="") as handle:
        return [r for r in csv.DictReader(handle) if r["host"] == "*" and r["pid"] == "*"]


@pytest.mark.parametrize("spe", ["spark-str", "spark-cp"])
def test_stages_codegen_names_and_a_drafted_profile_on_the_demo(
    shared_demo: Callable[[str], DemoRun], tmp_path: Path, spe: str
) -> None:
    # GIVEN a demo run of the engine (the session's, copied: the cut by stage below rewrites summary.csv)
    out = shared_demo(spe).copy_to(tmp_path / "run")
    (capture,) = out.glob("hosts/*")
    meta = json.loads((capture / "meta.json").read_text())
    # THEN the executors' threads carry full names, and task samples their Spark task
    assert meta["thread_names"] == "uprobe", meta["warnings"]
    tables = [read_table(p) for p in capture.glob("pids/*/stacks.tpc")]
    contexts = [t.contexts for t in tables if t.contexts]
    assert contexts and all(" in stage " in name for c in contexts for name in c)
    stacks = "".join(format_folded(t.folded()) for t in tables)
    assert "\nExecutor task launch worker;" in "\n" + stacks
    spark = json.loads((capture / "spark.json").read_text())
    assert spark["plans"] and spark["plans"][0]["stages"], spark["notes"]

    # WHEN the run is cut by stage
    _coordinator("analyze", str(out), "--by", "stage")
    rows = _cluster_rows(out / "summary.csv")
    stage_totals = [r for r in rows if r["stage"] and r["task"] == "*"]
    # THEN summary.csv has a row per stage with the driver's job, and the ordinary rows are unchanged
    assert stage_totals and sum(int(r["samples"]) for r in stage_totals) > 0
    assert all(r["job"] for r in stage_totals), stage_totals[:3]
    if spe == "spark-str":
        assert all(r["batch"] for r in stage_totals), stage_totals[:3]
    plain = [r for r in rows if not r["stage"]]
    assert plain and {r["task"] for r in plain} >= {"unmatched", "*"}
    # AND the driver's plan gave the codegen stages' operators, and the report names every sampled
    # codegen frame by them (a short CP window under load may sample none: its generated code can still
    # be interpreted, as "Interpreter" frames)
    codegen = [e["codegen"] for p in spark["plans"] for e in p["executions"] if e.get("codegen")]
    assert codegen, spark["plans"][0]["executions"][:3]
    report = (out / "report" / "index.html").read_text()
    if "GeneratedIteratorForCodegenStage" in stacks or spe == "spark-str":
        assert "[codegen stage " in report

    # WHEN a profile is drafted and used
    draft = tmp_path / "draft.txt"
    printed = _coordinator("draft-profile", str(out), "--out", str(draft))
    assert "Codegen " in draft.read_text(), printed
    _coordinator("analyze", str(out), "--profile", str(draft), "--out", str(tmp_path / "drafted"))
    drafted = _cluster_rows(tmp_path / "drafted" / "summary.csv")
    shares = {r["task"]: (int(r["samples"]), float(r["share"] or 0)) for r in drafted}
    # THEN every task of the draft gets samples and less than 10 % stay unmatched
    tasks = [t for t in shares if t not in ("*", "unmatched")]
    assert tasks and all(shares[t][0] > 0 for t in tasks), shares
    assert shares["unmatched"][1] < 0.10, shares
