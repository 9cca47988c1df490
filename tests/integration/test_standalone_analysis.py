"""`coordinator analyze --master spark://HOST:PORT` on a real standalone cluster (a Master and a Worker
started from pyspark's spark-class, executor JVMs with their own Python workers): the code shipped to
the executors (engines._code_zip) runs the same matcher and sums, and every output file is
byte-identical to the in-process analysis of the same runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from coordinator.analysis.engines import _code_zip, analyze
from coordinator.workloads.sparkcluster import LocalSparkCluster

REPO = Path(__file__).resolve().parents[2]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_code_zip_holds_both_packages(tmp_path: Path) -> None:
    with zipfile.ZipFile(_code_zip(tmp_path)) as archive:
        names = set(archive.namelist())
    shipped = {"profiler/matching/matcher.py", "coordinator/analysis/inputs.py", "coordinator/analysis/engines.py"}
    assert shipped <= names
    assert not [n for n in names if not n.endswith(".py")]


def test_standalone_cluster_analysis_is_byte_identical_to_local(
    spark_cluster: LocalSparkCluster, multi_run_archive: list[Path], tmp_path: Path
) -> None:
    # GIVEN two runs × two hosts analysed in this process (no JVM) as the reference
    analyze(multi_run_archive, out_dir=tmp_path / "local", engine="in-process")

    # WHEN the analyze command runs them on the standalone cluster's executors
    out = tmp_path / "standalone"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "coordinator",
            "analyze",
            *map(str, multi_run_archive),
            "--out",
            str(out),
            "--master",
            spark_cluster.master_url,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr + completed.stdout

    # THEN it ran on Spark (not in-process: the master is not local), and every file but
    # analysis.json (which records the master) is the same bytes
    assert "Spark start-up 0.0 s" not in completed.stdout
    local, standalone = _files(tmp_path / "local"), _files(out)
    assert sorted(local) == sorted(standalone)
    for name in local:
        if name != "analysis.json":
            assert local[name] == standalone[name], name
    recorded = json.loads(standalone["analysis.json"])
    assert recorded["master"] == spark_cluster.master_url
    assert {**recorded, "master": ""} == {**json.loads(local["analysis.json"]), "master": ""}
    # AND the executors' application ran to completion on the cluster
    apps = spark_cluster.master_state().get("completedapps", [])
    assert any(app.get("name") == "taskprof-analyze" for app in apps)  # type: ignore[union-attr]
