"""Frame pointers vs the HotSpot unwinder on the same workload: share agreement, BPF time, profiler CPU.

Runs tests/workloads/CpuSplit (known 50/30/20 split, measured by the JVM's thread CPU clock) twice per
round: once with -XX:+PreserveFramePointer sampled by the walker's frame-pointer steps (the HotSpot
unwinder off, Java frames named by the perf map: the way before issue 30), once without the flag sampled
with the HotSpot unwinder (names from the JVM's nmethods, no perf map). Per run: worker samples, each
burner's share against the truth (largest difference in percentage points and |z|), samples cut before
the thread's start, the BPF programs' time per run (kernel.bpf_stats_enabled on for the window) and the
profiler's own CPU over the window (reader thread, naming; the post-run fold is not in it).

``--flag-gain``: the workload's own gain from running without -XX:+PreserveFramePointer instead. Per
round two fresh JVMs of bench/OpsLoop.java (one worker thread each), one with the flag and one with
-XX:-PreserveFramePointer, started in alternating order, run side by side through the same windows
(the same contention from the rest of the host); per window each one's work per CPU second it got and
per wall second. The gain of a window is without/with - 1; the table gives each round's mean and, over
all windows, mean, standard deviation and range. No profiler runs.

usage: .venv/bin/python bench/bench_hotspot_unwind.py [--seconds 20] [--rounds 2] [--inline]
       .venv/bin/python bench/bench_hotspot_unwind.py --flag-gain [--rounds 4] [--windows 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_cfi import BPF_STATS, prog_stats  # noqa: E402
from bench.bench_overhead import WORKLOAD, OpsJvm, _tree_cpu  # noqa: E402
from profiler.sampling.sampler import StackSampler  # noqa: E402
from profiler.unwind.hotspot import APPROXIMATE_MARK, INLINED_MARK, INTERPRETED_MARK  # noqa: E402
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
        while jvm.pid not in sampler.walker.jvms.namers and time.monotonic() < deadline:
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
    marks = (APPROXIMATE_MARK, INLINED_MARK, INTERPRETED_MARK)
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


FLAG_ON, FLAG_OFF = "-XX:+PreserveFramePointer", "-XX:-PreserveFramePointer"


def _marks(jvms: tuple[OpsJvm, ...]) -> list[tuple[float, int, int]]:
    """(CPU seconds, units, nanoTime) of each JVM, one right after the other."""
    out = []
    for jvm in jvms:
        cpu = _tree_cpu(jvm.pid)
        out.append((cpu, *jvm.mark()))
    return out


def flag_gain_round(classes: Path, windows: int, seconds: float, off_first: bool) -> list[tuple[float, float]]:
    """Per window (gain in work per CPU second, gain in work per wall second) of the JVM without the flag
    over the one with it, both running through the same windows."""
    flags = (FLAG_OFF, FLAG_ON) if off_first else (FLAG_ON, FLAG_OFF)
    started: list[OpsJvm] = []
    try:
        for flag in flags:
            started.append(OpsJvm(classes, 1, flags=(flag,)))
        by_flag = dict(zip(flags, started, strict=True))
        pair = (by_flag[FLAG_ON], by_flag[FLAG_OFF])
        time.sleep(seconds)  # both warmed up past READY: C2 done with the hot loop
        gains = []
        for _window in range(windows):
            before = _marks(pair)
            time.sleep(seconds)
            after = _marks(pair)
            per_cpu, per_s = [], []
            for (cpu0, units0, t0), (cpu1, units1, t1) in zip(before, after, strict=True):
                per_cpu.append((units1 - units0) / max(cpu1 - cpu0, 1e-9))
                per_s.append((units1 - units0) / max((t1 - t0) / 1e9, 1e-9))
            gains.append((per_cpu[1] / per_cpu[0] - 1, per_s[1] / per_s[0] - 1))
        return gains
    finally:
        for jvm in started:
            jvm.stop()


def flag_gain(rounds: int, windows: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-flag-gain-") as scratch:
        javac = shutil.which("javac") or "javac"
        subprocess.run([javac, "-d", scratch, str(WORKLOAD)], check=True)
        print("| round (first started) | windows | gain in work per CPU second | gain in work per second |")
        print("|---|---|---|---|")
        every: list[tuple[float, float]] = []
        for index in range(rounds):
            off_first = index % 2 == 1
            gains = flag_gain_round(Path(scratch), windows, seconds, off_first)
            every += gains
            per_cpu = ", ".join(f"{100 * g:+.1f}" for g, _ in gains)
            per_s = ", ".join(f"{100 * g:+.1f}" for _, g in gains)
            first = "without" if off_first else "with"
            print(f"| {index + 1} ({first} the flag) | {len(gains)} × {seconds:.0f} s | {per_cpu} % | {per_s} % |",
                  flush=True)
        for label, values in (("per CPU second", [g for g, _ in every]), ("per second", [g for _, g in every])):
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"\ngain in work {label} over {len(values)} windows: mean {100 * statistics.mean(values):+.2f} %, "
                  f"sd {100 * spread:.2f} pp, range {100 * min(values):+.1f} .. {100 * max(values):+.1f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--inline", action="store_true", help="the JIT's defaults (C2 inlines the burners)")
    parser.add_argument("--flag-gain", action="store_true",
                        help="the workload's gain from running without -XX:+PreserveFramePointer (no profiler)")
    parser.add_argument("--windows", type=int, default=3, help="--flag-gain: windows per round")
    args = parser.parse_args(argv)
    if args.flag_gain:
        flag_gain(args.rounds, args.windows, args.seconds)
        return 0
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
