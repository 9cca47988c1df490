"""Inlined kernels named exactly on a JVM started without any flag (issue 51): the InlineTruth ground
truth (tests/workloads/InlineTruth.java: kernels C2 inlines into InlineTruth::drive, 50/30/20 of the
workers' CPU measured by the JVM's thread CPU clock), sampled by the walker with names from the nmethods.

Cases per JDK:
  none        no flag at all: debug information only at safepoints and calls
  warm        no flag; DebugNonSafepoints written (profiler.unwind.debugflag) after READY, then --settle s
  start       no flag; DebugNonSafepoints written right after the exec, before the JIT compiles drive
  flag        -XX:+UnlockDiagnosticVMOptions -XX:+DebugNonSafepoints (the restart the option avoids)
Per case: worker samples, each kernel's |z| against the truth (among samples named after a kernel), the
unmatched share (charged to drive, or unnamed), the JVM's compiled samples named from a borrowed scope
(sampler.json compiled_approximate / compiled_samples, the health line's figure; the workers' alone; the
mean distance to the PcDesc borrowed) and /proc/loadavg. Heavy: run under the shared lock.

usage: .venv/bin/python bench/bench_exact_inlining.py [--seconds 8] [--settle 5] [--jdk 17 25] [--case ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from profiler.sampling.sampler import StackSampler  # noqa: E402
from profiler.unwind import debugflag  # noqa: E402
from tests.fixtures import inline_truth  # noqa: E402
from tests.fixtures.jvm import java_home, temurin_25  # noqa: E402
from tests.integration.test_walker import _sample  # noqa: E402

CASES = ("none", "warm", "start", "flag")
HOMES = {"17": java_home, "25": temurin_25}
DNS = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"]


def run_case(case: str, jdk: str, classpath: Path, seconds: float, settle: float) -> str:
    home = HOMES[jdk]()
    flags = DNS if case == "flag" else []
    jvm = inline_truth.start_inline_truth(
        classpath, java=home, jvm_flags=flags, on_started=inline_truth.enable_soon if case == "start" else None
    )
    try:
        if case == "warm":
            debugflag.enable(jvm.pid)
            time.sleep(settle)
        load = Path("/proc/loadavg").read_text().split()[:3]
        collected = _sample(StackSampler(perf_map_mode="none"), jvm.pid, seconds, 600, on_begin=jvm.reset)
        truth = jvm.shares()
    finally:
        jvm.kill()
    counts = inline_truth.kernel_counts(collected.folded)
    z, worst, unmatched = inline_truth.shares_vs_truth(counts, truth)
    worker = sum(counts.values())
    detail = " ".join(f"{k[6:]}={counts[k]}/{truth[k]:.3f}/z{z[k]:.1f}" for k in truth)
    stats = collected.stats
    approximate, compiled = inline_truth.approximate_workers(collected.folded)
    mean = stats.approximate_bytes / stats.compiled_approximate if stats.compiled_approximate else 0.0
    return (
        f"| {jdk} | {case} | {worker} | {worst:.1f} | {100 * unmatched:.1f} % (drive {counts['drive']}, "
        f"unnamed {counts['unnamed']}) | {100 * stats.approximate_share():.1f} % of {stats.compiled_samples} "
        f"| {100 * approximate / max(compiled, 1):.1f} % of {compiled} | {mean:.0f} B | {detail} | {' '.join(load)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the write in the warm case")
    parser.add_argument("--jdk", nargs="+", default=["17", "25"], choices=sorted(HOMES))
    parser.add_argument("--case", nargs="+", default=list(CASES), choices=CASES)
    args = parser.parse_args()
    print(
        "| JDK | case | worker samples | worst \\|z\\| | unmatched | approximate (JVM) | approximate (workers) "
        "| mean distance | kernel=samples/truth/\\|z\\| | loadavg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for jdk in args.jdk:
            classpath = inline_truth.compile_inline_truth(Path(tmp) / jdk, HOMES[jdk]())
            for case in args.case:
                print(run_case(case, jdk, classpath, args.seconds, args.settle), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
