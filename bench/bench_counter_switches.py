"""What the per-process counters cost a workload that switches context often.

`profiler run` counts each scoped process with one inherited perf event per (thread, event)
(profiler/sampling/counters.py, like `perf stat -p`). Each such event sits in its thread's perf context,
and the kernel schedules a thread's context out and in at every one of its context switches: that work is
done in the switching thread and billed to it, so it shows in the workload's CPU time, not the profiler's.

A warmed-up JVM (bench/PingPongRate.java: thread pairs handing a token over with park/unpark; every
hand-off is a futex wait and wake) runs interleaved windows: base (nothing counted), the profiler's
default counter set (CounterGroup with DEFAULT_EVENTS: on a host without a PMU only the software events
open), task-clock alone. The cost per context switch is the JVM's CPU time per switch minus the base
windows' mean; medians over rounds, (min … max) the spread.

usage: .venv/bin/python bench/bench_counter_switches.py [--rounds N] [--window S] [--pairs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from bench_offcpu import WORKLOAD, Jvm  # noqa: E402

from profiler.sampling.counters import DEFAULT_EVENTS, TASK_CLOCK, CounterGroup  # noqa: E402

# condition -> events counted (None: nothing)
CONDITIONS: dict[str, Sequence[str] | None] = {
    "base": None,
    "default counters": DEFAULT_EVENTS,
    "task-clock only": (TASK_CLOCK,),
}


@dataclass(frozen=True)
class Window:
    condition: str
    round: int
    switches_per_s: float
    cpu_us_per_switch: float  # the JVM's CPU time (user + system) per context switch of its threads
    events_open: int
    load: float


def measure(jvm: Jvm, condition: str, round_no: int, window: float) -> Window:
    events = CONDITIONS[condition]
    group = CounterGroup(events) if events is not None else None
    opened = 0
    try:
        if group is not None:
            group.add_pid(jvm.pid)
            opened = group.open_fds()
        time.sleep(0.5)  # the events are in every thread's context before the window starts
        start = jvm.reading()
        time.sleep(window)
        end = jvm.reading()
        if group is not None:
            group.read(jvm.pid)  # the counters work (a window whose events failed to open would say 0 fds)
    finally:
        if group is not None:
            group.close()
    seconds, cpu, switches = end[0] - start[0], end[2] - start[2], end[3] - start[3]
    return Window(condition, round_no, switches / seconds, 1e6 * cpu / max(switches, 1), opened, os.getloadavg()[0])


def report(windows: list[Window], args: argparse.Namespace) -> str:
    base = statistics.mean(w.cpu_us_per_switch for w in windows if w.condition == "base")
    lines = [
        "| condition | perf events open | context switches/s | JVM CPU µs per switch | counters' µs per switch |",
        "|---|---:|---:|---:|---:|",
    ]
    for condition in CONDITIONS:
        mine = [w for w in windows if w.condition == condition]
        extra = [w.cpu_us_per_switch - base for w in mine]
        lines.append(
            f"| {condition} | {statistics.median(w.events_open for w in mine):.0f} "
            f"| {statistics.median(w.switches_per_s for w in mine):,.0f} "
            f"| {statistics.median(w.cpu_us_per_switch for w in mine):.2f} "
            f"| {statistics.median(extra):+.2f} ({min(extra):+.2f} … {max(extra):+.2f}) |"
        )
    lines.append("")
    lines.append(
        f"{args.rounds} rounds of {args.window:g} s windows, {args.pairs} thread pairs. Windows (condition, round, "
        "switches/s, JVM CPU µs per switch, load average):"
    )
    lines.extend(
        f"- {w.condition} {w.round}: {w.switches_per_s:,.0f}, {w.cpu_us_per_switch:.2f}, {w.load:.1f}" for w in windows
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-counters-") as scratch_name:
        scratch = Path(scratch_name)
        javac = Path(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")) / "bin" / "javac"
        subprocess.run([str(javac), "-d", str(scratch / "classes"), str(WORKLOAD)], check=True, timeout=180)
        jvm = Jvm(scratch / "classes", args.pairs)
        try:
            time.sleep(3)  # JIT warm-up
            windows = [
                measure(jvm, condition, round_no, args.window)
                for round_no in range(args.rounds)
                for condition in CONDITIONS
            ]
        finally:
            jvm.close()
    print(report(windows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
