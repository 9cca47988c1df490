"""BPF time per context switch of the off-CPU program (profiler/sampling/offcpu_trace.c), this tree's against a
git ref's (the "before"), with no profiler around it: the figure that does not depend on the host's load.

Each variant is compiled with the same defines as `profiler run --off-cpu` would use, attached to sched_switch
beside bench/PingPongRate.java (thread pairs handing a token over with park/unpark: ~100,000s of switches a
second), and its run_time_ns / run_cnt read from the kernel's BPF statistics over a few seconds. Variants are
interleaved, each once per round; medians and (min … max) over the rounds. Scopes: `jvm` (the JVM's PID in
the scope: every switch is a scoped thread's) and `elsewhere` (an empty scope: every switch of the host is
someone else's, the floor all other work pays). `empty` is a program that returns at once: the tracepoint's
and the statistics' own cost, included in every figure.

usage: .venv/bin/python bench/bench_offcpu_switch.py [--rounds N] [--seconds S] [--before REF] [--every 10,1000]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_offcpu import warm_jvm  # noqa: E402

from profiler.bpf.pidns import with_own_ids  # noqa: E402
from profiler.bpf.stats import bpf_stats_enabled  # noqa: E402
from profiler.sampling.offcpu import BPF_SOURCE, build_bpf_text, read_kernel_hz, read_switch_layout  # noqa: E402

EMPTY = "BPF_HASH(target_tgids, u32, u8, 16);\nRAW_TRACEPOINT_PROBE(sched_switch) { return 0; }\n"


def variants(before: str, everies: list[int]) -> dict[str, str]:
    """name -> program text: the ref's and this tree's at each N, scoped to the JVM or to nothing."""
    layout, hz = read_switch_layout(), read_kernel_hz()
    old = subprocess.run(
        ["git", "show", f"{before}:profiler/sampling/offcpu_trace.c"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    new = BPF_SOURCE.read_text(encoding="utf-8")
    found = {"empty": EMPTY}
    for scope in ("jvm", "elsewhere"):
        for every in everies:
            found[f"{before} 1/{every} {scope}"] = build_bpf_text(old, layout, 1_000_000, every)
            found[f"tree 1/{every} {scope}"] = build_bpf_text(new, layout, 1_000_000, every, hz)
    return found


def _stats(fd: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines() if ":" in line
    )
    return int(fields["run_time_ns"]), int(fields["run_cnt"])


def measure(name: str, text: str, pid: int, seconds: float) -> tuple[float, float]:
    """(ns per run, runs per second) of one variant attached for ``seconds``."""
    from bcc import BPF

    bpf = BPF(text=with_own_ids(text).encode())  # current_pid_tgid() as compile_program defines it
    try:
        if name.endswith(" jvm"):
            bpf[b"target_tgids"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
            if "scope_bits" in text:  # this tree's program: the scope is read from a bitmap
                words = bpf[b"scope_bits"]
                key = words.Key(pid >> 6)
                words[key] = words.Leaf(int(words[key].value) | 1 << (pid & 63))
        fd = next(iter(bpf.funcs.values())).fd
        first = _stats(fd)
        time.sleep(seconds)
        last = _stats(fd)
    finally:
        bpf.cleanup()
    runs = last[1] - first[1]
    return (last[0] - first[0]) / max(runs, 1), runs / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--before", default="main", help="git ref of the program to compare with (main)")
    parser.add_argument("--every", default="10,1000", help="--off-cpu-sample-every values (10,1000)")
    args = parser.parse_args()
    texts = variants(args.before, [int(n) for n in args.every.split(",")])
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in texts}
    scratch = tempfile.TemporaryDirectory(prefix="bench-offcpu-switch-")
    with scratch, warm_jvm(Path(scratch.name), 2) as jvm, bpf_stats_enabled():
        for round_no in range(args.rounds):
            for name, text in texts.items():
                ns, rate = measure(name, text, jvm.pid, args.seconds)
                load = os.getloadavg()[0]
                results[name].append((ns, rate, load))
                print(f"round {round_no} {name}: {ns:.0f} ns/run, {rate:,.0f} runs/s, load {load:.0f}", flush=True)
    print("\n| variant | ns per run (median) | min … max | runs/s (median) | load |\n|---|---|---|---|---|")
    for name, rows in results.items():
        times = [r[0] for r in rows]
        loads = [r[2] for r in rows]
        print(
            f"| {name} | {statistics.median(times):.0f} | {min(times):.0f} … {max(times):.0f} | "
            f"{statistics.median(r[1] for r in rows):,.0f} | {min(loads):.0f}–{max(loads):.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
