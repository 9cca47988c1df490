"""`coordinator demo` end to end on real Spark, real eBPF and real Redis: the YSB tasks show up in
summary.csv, unmatched stays small, the sink wrote windows, and nothing is left running."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
REQUIRED_TASKS = ("Deserialize", "Filter+Projection+Join", "Window", "Sink")


def _whole_run_shares(summary_csv: Path) -> dict[str, float]:
    """task -> share of the run's workload samples (the host "*", pid "*" rows)."""
    with open(summary_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["pid"] == "*" and r["role"] == "workload"]
    hosts = {r["host"] for r in rows}
    host = "*" if "*" in hosts else hosts.pop()
    return {r["task"]: float(r["share"] or 0.0) for r in rows if r["host"] == host}


def _processes_mentioning(text: str) -> list[tuple[int, str]]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append((proc.pid, " ".join(proc.info["cmdline"])[:120]))
        except psutil.Error:
            continue
    return found


def test_demo_profiles_ysb_tasks(tmp_path: Path) -> None:
    # GIVEN nothing; WHEN the demo runs for a short window
    out = tmp_path / "demo-run"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "demo", "--duration", "20", "--rate", "10000", "--out", str(out),
         "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, f"demo failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    # THEN the report and summary exist and every YSB task got CPU, with little left unmatched
    summary = out / "summary.csv"
    assert summary.is_file(), result.stdout
    assert re.search(r"^wrote .*report", result.stdout, re.MULTILINE), result.stdout
    shares = _whole_run_shares(summary)
    for task in REQUIRED_TASKS:
        assert shares.get(task, 0.0) > 0.0, f"{task} has no samples: {shares}"
    assert shares.get("unmatched", 0.0) < 0.20, f"unmatched too large: {shares}"

    # AND the pipeline really ran: micro-batches processed and window rows written to the sink
    done = re.search(r"demo: (\d+) micro-batches, (\d+) events .* (\d+) window rows in the sink", result.stdout)
    assert done, result.stdout
    batches, events, windows = (int(g) for g in done.groups())
    assert batches >= 1 and events > 0 and windows > 0, done.group(0)

    # AND everything the demo started is gone (its processes were not our children after it exited)
    started = re.search(r"demo: Spark master (spark://[\d.:]+) \(logs (\S+)\)", result.stdout)
    assert started, result.stdout
    assert _processes_mentioning(started.group(2)) == []
    assert _processes_mentioning(started.group(1)) == []
