"""Java symbols over a long window: a JVM whose compiled code is freed and replaced all the time.

CodeChurn (tests/workloads) defines fresh copies of two template classes every generation, burns CPU
in them with a known split, and unloads them (their code is freed, the next generation's lands at
reused addresses). A perf map dumped only at the end names early samples with whatever lives at their
address at the end; refreshed versions, each sample named with the version of its time, must give the
measured split within sampling error.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.sampling.sampler import StackSampler
from tests.fixtures.jvm import java_home, javac

pytestmark = pytest.mark.integration

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
NAMES = ("ChurnAlpha", "ChurnBeta")


@pytest.fixture(scope="module")
def churn_classes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("churn")
    classpath, templates = root / "cp", root / "templates"
    javac(classpath, WORKLOADS / "CodeChurn.java")
    javac(templates, *sorted((WORKLOADS / "churn").glob("*.java")))
    return classpath, templates


def start_churn(
    classes: tuple[Path, Path], generation_ms: int, frame_pointers: bool, java: Path | None = None
) -> subprocess.Popen[str]:
    """CodeChurn (ChurnAlpha 60 %, ChurnBeta 40 %), answered READY; on ``java`` (a JDK home, default 17)."""
    classpath, templates = classes
    argv = [
        str((java or java_home()) / "bin" / "java"),
        *(["-XX:+PreserveFramePointer"] if frame_pointers else []),
        "-XX:+UseSerialGC",
        "-Xmx128m",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,com.example.churn.*::*",
        "-cp",
        str(classpath),
        "com.example.CodeChurn",
        str(templates),
        str(generation_ms),
        "60",
    ]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd="/")
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY"):
        process.kill()
        process.wait(timeout=30)
        raise AssertionError(line)
    return process


@pytest.fixture
def churn_jvm(churn_classes: tuple[Path, Path]) -> Iterator[subprocess.Popen[str]]:
    process = start_churn(churn_classes, 2000, frame_pointers=True)  # a generation lives 2 s
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


def _ask(process: subprocess.Popen[str], command: str) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def _counts(folded: dict[str, int]) -> dict[str, int]:
    counts = dict.fromkeys(NAMES, 0)
    for stack, count in folded.items():
        for name in NAMES:
            if f"com.example.churn.{name}::burn" in stack:
                counts[name] += count
    return counts


def test_refreshed_perf_maps_name_churning_code_within_sampling_error(churn_jvm):
    # GIVEN two samplers on the same churning JVM: one refreshing its perf map every 0.5 s (a 2 s
    # generation lives through several refreshes), one naming everything with the map of the end
    # (JIT frames walked by frame pointers and named by perf maps: the HotSpot unwinder would name them itself)
    refreshing = StackSampler(perf_map_refresh=0.5, hotspot_unwind=False)
    end_only = StackSampler(perf_map_refresh=0, hotspot_unwind=False)
    try:
        for sampler in (refreshing, end_only):
            sampler.start()
            sampler.begin_window()
            sampler.add_pid(churn_jvm.pid)
            sampler.prepare_symbols(churn_jvm.pid)
        assert _ask(churn_jvm, "reset") == "RESET"
        # 14 s: one churner thread at 99 Hz gives ~1,450 samples (n >= 300 below), ~16 map versions (>= 10; a
        # version when the map changed: 10 s gave 13, too near) and 7 generations more than the 2 before READY
        # (>= 4); 20 s (issue 48) gave ~2,100 samples and ~26 versions
        time.sleep(14)
        truth = json.loads(_ask(churn_jvm, "report"))
        for sampler in (refreshing, end_only):
            sampler.stop()
        # WHEN both windows are symbolized
        fresh = refreshing.collect()[churn_jvm.pid]
        stale = end_only.collect()[churn_jvm.pid]
    finally:
        refreshing.close()
        end_only.close()

    assert truth["generations"] >= 4 and truth["unloaded"] > 0, truth
    cpu = truth["cpu_seconds"]
    expected = cpu["ChurnAlpha"] / (cpu["ChurnAlpha"] + cpu["ChurnBeta"])
    counts = _counts(fresh.folded)
    n = sum(counts.values())
    stale_counts = _counts(stale.folded)
    stale_n = sum(stale_counts.values()) or 1
    report = (
        f"truth {expected:.3f}; refreshed {counts} ({fresh.stats.perf_map_snapshots} versions); "
        f"end-only {stale_counts}"
    )
    assert n >= 300, report
    # THEN the refreshed naming gives the measured split within sampling error
    observed = counts["ChurnAlpha"] / n
    z = (observed - expected) / math.sqrt(expected * (1 - expected) / n)
    assert abs(z) <= 4, report
    assert fresh.stats.perf_map_snapshots >= 10, report
    # AND most burner samples got a name at all (the end-only map leaves freed code [unknown])
    churner = sum(count for stack, count in fresh.folded.items() if stack.startswith("churner"))
    assert n >= 0.6 * churner, report
    print(report, f"end-only ChurnAlpha share {stale_counts['ChurnAlpha'] / stale_n:.3f}")
