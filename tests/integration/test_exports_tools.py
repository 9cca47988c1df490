"""Our exports read by the tools they are for: `go tool pprof` (Debian's golang-go, installed by
scripts/setup.sh) gives summary.csv's samples per task and per PID, filters by label and shows the
comments without warnings; flamegraph.pl (vendored in tests/data/flamegraph, run with Debian's perl)
draws the folded export with summary.csv's samples per task."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze
from coordinator.cli import main
from profiler.capture.folded import read_folded
from tests.fixtures.captures import PidSpec, write_run_dir
from tests.fixtures.exports import cluster_task_samples, pid_task_samples, summary_rows

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
GO = shutil.which("go") or "/usr/bin/go"
# Go 1.24 and later build `go tool pprof` from source into the build cache on first use: 59 s of CPU on
# this 2-core machine, ~28 s of the module's ~30 when every test had a cache of its own. One cache for the
# machine (filled by scripts/setup.sh, or else by the first run here) builds it once; the cache is
# content-addressed, so a stale or foreign entry is never used for another source
GOCACHE = Path.home() / ".cache" / "spe-taskprof" / "go-build"
FLAMEGRAPH_PL = DATA / "flamegraph" / "flamegraph.pl"


def go_pprof(tmp_path: Path, *args: str) -> str:
    # go wants a writable home and build cache; pprof writes nothing else with these options
    env = {**os.environ, "HOME": str(tmp_path / "home"), "GOCACHE": str(GOCACHE)}
    result = subprocess.run([GO, "tool", "pprof", *args], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def tag_section(output: str, key: str) -> dict[str, float]:
    """The ``key: Total N`` block of ``pprof -tags``: value -> count."""
    block = re.search(rf"^ {key}: Total [^\n]*\n((?:[ \t]+\S[^\n]*\n)+)", output, re.MULTILINE)
    assert block, output
    values = {}
    for line in block.group(1).splitlines():
        count, _, value = line.strip().partition(" (")
        values[value.split("): ", 1)[1]] = float(count)
    return values


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, Path]:
    """The recorded real Spark executor stacks as a run with two executors, analysed and exported."""
    profile = (REPO / "application_profiles" / "spark_structured_streaming.txt").read_text(encoding="utf-8")
    real = read_folded(DATA / "spark_executor_real.folded")
    run_dir = write_run_dir(
        tmp_path / "runs" / "recorded",
        "recorded",
        {"node1": [PidSpec(4100, dict(real), cycles=3.3e10, cpu_seconds=11.0),
                   PidSpec(4200, dict(read_folded(DATA / "spark_executor_synthetic.folded")), cpu_seconds=0.5)]},
        profile_text=profile,
    )
    analyze([run_dir], engine="in-process")
    out = tmp_path / "recorded.pb.gz"
    assert main(["export", str(run_dir), "--format", "pprof", "--out", str(out)]) == 0
    return run_dir, out


def test_go_tool_pprof_reads_the_export_like_summary_csv(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    run_dir, pprof_file = exported
    rows = summary_rows(run_dir)
    # samples per task and per PID, as summary.csv counts them
    output = go_pprof(tmp_path, "-sample_index=samples", "-tags", str(pprof_file))
    assert tag_section(output, "task") == {t: float(n) for t, n in cluster_task_samples(rows).items()}
    per_pid: dict[str, float] = {}
    for (_, pid, _), count in pid_task_samples(rows).items():
        per_pid[str(pid)] = per_pid.get(str(pid), 0.0) + count
    assert tag_section(output, "pid") == per_pid
    assert "Main binary filename not available" not in output
    # a label filter keeps one process (one -tagfocus key: a second one would replace it), or one task
    samples = pid_task_samples(rows)
    focused = go_pprof(tmp_path, "-sample_index=samples", "-tagfocus=process=^node1:4100$", "-tags", str(pprof_file))
    assert tag_section(focused, "task") == {task: float(n) for (_, pid, task), n in samples.items() if pid == 4100}
    focused = go_pprof(tmp_path, "-sample_index=samples", "-tagfocus=task=^Deserialize$", "-tags", str(pprof_file))
    assert tag_section(focused, "pid") == {
        str(pid): float(n) for (_, pid, task), n in samples.items() if task == "Deserialize"
    }
    # cpu is the default sample type; the comments say where the numbers come from
    top = go_pprof(tmp_path, "-top", "-nodecount=3", str(pprof_file))
    assert "Type: cpu" in top
    comments = go_pprof(tmp_path, "-comments", str(pprof_file))
    assert "spe-taskprof run recorded: samples per task as in summary.csv" in comments
    assert "node1 PID 4200 (spark executor)" in comments  # no cycles for that one


def test_flamegraph_pl_draws_the_folded_export_like_summary_csv(tmp_path: Path, exported: tuple[Path, Path]) -> None:
    run_dir, _ = exported
    folded = tmp_path / "recorded.folded"
    assert main(["export", str(run_dir), "--format", "folded", "--out", str(folded)]) == 0
    result = subprocess.run(
        ["perl", str(FLAMEGRAPH_PL), str(folded)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    # the root frames are the tasks: their titles carry summary.csv's cluster samples
    titles = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", result.stdout)]
    per_task = {}
    for title in titles:
        found = re.fullmatch(r"\[task: (.+)\] \(([\d,]+) samples?, [\d.]+%\)", title)
        if found:
            per_task[found.group(1)] = int(found.group(2).replace(",", ""))
    rows = summary_rows(run_dir)
    assert per_task == cluster_task_samples(rows)
    total = sum(per_task.values())
    assert f"all ({total:,} samples, 100%)" in titles
