"""What following exits with taskstats costs: the agent's CPU per exit record, the workload's per exit.

With /proc counters (``--counters proc``/``auto`` without a PMU) the agent registers a generic netlink
socket for the kernel's taskstats exit records (profiler/sampling/taskstats.py). Nothing happens at a
context switch; at each thread exit the kernel fills a record and queues it to the socket (in the exiting
thread's time), and the agent drains and parses the queue at its readings (in its own time).

A child Python process starts and joins ``--threads`` short threads one after another (each one exit
record); rounds interleave the child alone (no listener) and with a registered listener. Reported: the
child's CPU per thread (start + exit) in both conditions, and the agent's CPU (process_time around
draining and parsing, exit records of every process on the host included) per record drained. Medians
over rounds, (min … max) the spread.

usage: .venv/bin/python bench/bench_taskstats_exits.py [--rounds N] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.sampling.taskstats import TaskstatsListener

CHILD = r"""
import sys, threading, time
count = int(sys.argv[1])
start = time.process_time()
for _ in range(count):
    thread = threading.Thread(target=int)
    thread.start()
    thread.join()
print(time.process_time() - start, flush=True)
"""


def child_cpu_per_thread(threads: int) -> float:
    """The child's own CPU per started-and-exited thread, in µs."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads)], capture_output=True, text=True, check=True)
    return float(out.stdout) * 1e6 / threads


def with_listener(threads: int) -> tuple[float, float, int]:
    """(child µs per thread, agent µs per record, records) with a registered listener drained after."""
    listener = TaskstatsListener()
    try:
        per_thread = child_cpu_per_thread(threads)
        time.sleep(0.05)
        before = time.process_time()
        records = len(listener.drain())
        agent = time.process_time() - before
    finally:
        listener.close()
    if listener.overruns:
        print(f"  warning: {listener.overruns} receive overruns", file=sys.stderr)
    return per_thread, agent * 1e6 / max(records, 1), records


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} … {max(values):.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=5000)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (CAP_NET_ADMIN) to register for taskstats", file=sys.stderr)
        return 2
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    alone: list[float] = []
    listened: list[float] = []
    agent: list[float] = []
    for round_index in range(args.rounds):
        alone.append(child_cpu_per_thread(args.threads))
        per_thread, per_record, records = with_listener(args.threads)
        listened.append(per_thread)
        agent.append(per_record)
        print(
            f"round {round_index + 1}: child µs/thread alone {alone[-1]:.2f}, with listener {per_thread:.2f}; "
            f"agent {per_record:.2f} µs/record over {records} records"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"child CPU per thread start+exit, no listener:   {spread(alone)} µs")
    print(f"child CPU per thread start+exit, with listener: {spread(listened)} µs")
    print(f"difference of medians: {statistics.median(listened) - statistics.median(alone):+.2f} µs per exit")
    print(f"agent CPU per exit record (drain + parse):      {spread(agent)} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
