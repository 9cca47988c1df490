"""Frame pointers vs the HotSpot unwinder on the same workload: share agreement, BPF time, profiler CPU.

Runs tests/workloads/CpuSplit (known 50/30/20 split, measured by the JVM's thread CPU clock) twice per
round: once with -XX:+PreserveFramePointer sampled by the walker's frame-pointer steps (the HotSpot
unwinder off, Java frames named by the perf map: the way before issue 30), once without the flag sampled
with the HotSpot unwinder (names from the JVM's nmethods, no perf map). Per run: worker samples, each
burner's share against the truth (largest difference in percentage points and |z|), samples cut before
the thread's start, the BPF programs' time per run (kernel.bpf_stats_enabled on for the window) and the
profiler's own CPU over the window (reader thread, naming; the post-run fold is not in it).

usage: .venv/bin/python bench/bench_hotspot_unwind.py [--seconds 20] [--rounds 2] [--inline]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_cfi import BPF_STATS, prog_stats  # noqa: E402
from profiler.sampling.sampler import StackSampler  # noqa: E402
from profiler.unwind.hotspot import INLINED_MARK, INTERPRETED_MARK  # noqa: E402
from tests.fixtures.jvm import compile_workloads, method_counts, start_cpu_split  # noqa: E402


def _unmarked(stack: str, marks: tuple[str, ...]) -> str:
    for mark in marks:
        stack = stack.replace(mark + ";", ";").removesuffix(mark)
    return stack


def one_run(classpath: Path, unwinder: bool, seconds: float, inline: bool) -> str:
    jvm = start_cpu_split(classpath, preserve_frame_pointer=not unwinder, dontinline=not inline, warmup_ms=4000)
    sampler = StackSampler(perf_map_mode="none" if unwinder else "auto", hotspot_unwind=unwinder)
    try:
        sampler.start()
        sampler.add_pid(jvm.pid)
        sampler.prepare_symbols(jvm.pid)
        deadline = time.monotonic() + 60
        while jvm.pid not in sampler._jvms.namers and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # perf map written (frame-pointer run)
        sampler.begin_window()
        jvm.reset()
        time_before, runs_before = prog_stats(sampler._bpf)
        cpu_before = time.process_time()
        time.sleep(seconds)
        truth = jvm.shares()
        cpu = time.process_time() - cpu_before
        time_after, runs_after = prog_stats(sampler._bpf)
        sampler.stop()
        collected = sampler.collect()[jvm.pid]
    finally:
        sampler.close()
        jvm.kill()
    marks = (INLINED_MARK, INTERPRETED_MARK)
    worker = {_unmarked(stack, marks): n for stack, n in collected.folded.items() if stack.startswith("burner-")}
    counts = method_counts(worker, jvm.methods)
    n = sum(counts.values())
    worst_pp = worst_z = 0.0
    for method in jvm.methods:
        share, p = counts[method] / max(n, 1), truth[method]
        worst_pp = max(worst_pp, abs(share - p) * 100)
        worst_z = max(worst_z, abs(share - p) / math.sqrt(p * (1 - p) / max(n, 1)))
    stats = collected.stats
    runs = runs_after - runs_before
    cut = sum(stats.stacks_cut.values())
    mode = "HotSpot unwinder, no frame pointers" if unwinder else "frame pointers (+PreserveFramePointer)"
    return (
        f"| {mode} | {stats.samples} | {sum(worker.values())} ({n} in a burner) | {worst_pp:.1f} pp, "
        f"|z| {worst_z if n else float('nan'):.1f} "
        f"| {100 * cut / max(stats.samples, 1):.1f} % | {(time_after - time_before) / max(runs, 1) / 1000:.2f} µs "
        f"({runs} runs; {(time_after - time_before) / max(stats.samples, 1) / 1000:.1f} µs per sample of the JVM) "
        f"| {cpu:.2f} s / {seconds:.0f} s |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--inline", action="store_true", help="the JIT's defaults (C2 inlines the burners)")
    args = parser.parse_args(argv)
    stats_before = Path(BPF_STATS).read_text().strip()
    Path(BPF_STATS).write_text("1")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            classpath = compile_workloads(Path(scratch) / "classes")
            print("| mode | samples | worker samples | largest share error | cut | BPF per run | profiler CPU |")
            print("|---|---|---|---|---|---|---|")
            for _round in range(args.rounds):
                for unwinder in (False, True):
                    print(one_run(classpath, unwinder, args.seconds, args.inline), flush=True)
    finally:
        Path(BPF_STATS).write_text(stats_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
