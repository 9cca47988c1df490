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

The same default set read from /proc instead (``CounterGroup(source="proc")``, the default on a host
without a PMU since the counters moved there) is a fourth condition: no perf event in any thread. Every
condition with counters reads them every --read-every seconds during the window (a run reads once per
--interval, 10 s), and the agent's own time per reading is reported beside the workload's cost.

usage: .venv/bin/python bench/bench_counter_switches.py [--rounds N] [--window S] [--pairs N] [--read-every S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from bench_offcpu import Jvm, warm_jvm  # noqa: E402

from profiler.sampling.counters import DEFAULT_EVENTS, TASK_CLOCK, CounterGroup  # noqa: E402

# condition -> (events counted (None: nothing), where the software events come from)
CONDITIONS: dict[str, tuple[Sequence[str] | None, str]] = {
    "base": (None, "perf"),
    "default counters, perf events": (DEFAULT_EVENTS, "perf"),
    "task-clock only, perf event": ((TASK_CLOCK,), "perf"),
    "default counters, /proc": (DEFAULT_EVENTS, "proc"),
}


@dataclass(frozen=True)
class Window:
    condition: str
    round: int
    switches_per_s: float
    cpu_us_per_switch: float  # the JVM's CPU time (user + system) per context switch of its threads
    events_open: int
    load: float
    read_ms: float | None  # the agent's CPU per reading of the JVM's counters (None: nothing counted)


def read_through(group: CounterGroup | None, pid: int, window: float, every: float) -> list[float]:
    """Sleep through the window, reading the counters every ``every`` s; the agent's CPU ms per read."""
    end = time.monotonic() + window
    costs: list[float] = []
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(every, left))
        if group is not None and time.monotonic() < end:
            before = time.thread_time()
            counters = group.read(pid)
            costs.append(1e3 * (time.thread_time() - before))
            if counters.cpu_seconds is None:
                raise RuntimeError(f"pid {pid}: task-clock not counted: {counters.events[TASK_CLOCK].note}")
    return costs


def measure(jvm: Jvm, condition: str, round_no: int, args: argparse.Namespace) -> Window:
    events, source = CONDITIONS[condition]
    group = CounterGroup(events, source=source) if events is not None else None
    opened = 0
    try:
        if group is not None:
            group.add_pid(jvm.pid)
            opened = group.open_fds()
        time.sleep(0.5)  # the events are in every thread's context before the window starts
        start = jvm.reading()
        costs = read_through(group, jvm.pid, args.window, args.read_every)
        end = jvm.reading()
    finally:
        if group is not None:
            group.close()
    seconds, cpu, switches = end[0] - start[0], end[2] - start[2], end[3] - start[3]
    return Window(
        condition,
        round_no,
        switches / seconds,
        1e6 * cpu / max(switches, 1),
        opened,
        os.getloadavg()[0],
        statistics.median(costs) if costs else None,
    )


def report(windows: list[Window], args: argparse.Namespace) -> str:
    base = statistics.mean(w.cpu_us_per_switch for w in windows if w.condition == "base")
    lines = [
        "| condition | perf events open | context switches/s | JVM CPU µs per switch | counters' µs per switch "
        "| agent ms per reading |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for condition in CONDITIONS:
        mine = [w for w in windows if w.condition == condition]
        extra = [w.cpu_us_per_switch - base for w in mine]
        lines.append(
            f"| {condition} | {statistics.median(w.events_open for w in mine):.0f} "
            f"| {statistics.median(w.switches_per_s for w in mine):,.0f} "
            f"| {statistics.median(w.cpu_us_per_switch for w in mine):.2f} "
            f"| {statistics.median(extra):+.2f} ({min(extra):+.2f} … {max(extra):+.2f}) "
            f"| {_median_ms([w.read_ms for w in mine])} |"
        )
    lines.append("")
    lines.append(
        f"{args.rounds} rounds of {args.window:g} s windows, {args.pairs} thread pairs, counters read every "
        f"{args.read_every:g} s. Windows (condition, round, "
        "switches/s, JVM CPU µs per switch, load average):"
    )
    lines.extend(
        f"- {w.condition} {w.round}: {w.switches_per_s:,.0f}, {w.cpu_us_per_switch:.2f}, {w.load:.1f}" for w in windows
    )
    return "\n".join(lines)


def _median_ms(costs: Sequence[float | None]) -> str:
    known = [cost for cost in costs if cost is not None]
    return f"{statistics.median(known):.1f}" if known else "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--read-every", type=float, default=1.0, help="seconds between counter readings (1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-counters-") as scratch, warm_jvm(Path(scratch), args.pairs) as jvm:
        windows = [
            measure(jvm, condition, round_no, args) for round_no in range(args.rounds) for condition in CONDITIONS
        ]
    print(report(windows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
