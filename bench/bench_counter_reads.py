"""The /proc counters' cost on live JVMs: CPU per reading of every given pid (software events from /proc,
exit records from taskstats), with the threads read at every reading and with them read once per
``--period``. Readings ``--every`` seconds apart, the two modes on the same pids one after the other.

usage: .venv/bin/python bench/bench_counter_reads.py --readings 12 --every 1 --period 3 PID [PID ...]
       (no pid: every java process on the host)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.sampling.counters import DEFAULT_EVENTS, CounterGroup


def java_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "java"]


def cpu_per_reading(pids: list[int], readings: int, every: float, period: float) -> tuple[float, int]:
    """(CPU seconds per reading of all ``pids``, threads counted at the end) with threads read once a ``period``."""
    group = CounterGroup(DEFAULT_EVENTS, source="proc", thread_readings_every_s=period)
    for pid in pids:
        group.add_pid(pid)
    spent = 0.0
    for _ in range(readings):
        time.sleep(every)
        start = time.process_time()
        for pid in pids:
            group.read(pid)
        spent += time.process_time() - start
    threads = sum(len(psutil.Process(pid).threads()) for pid in pids if psutil.pid_exists(pid))
    group.close()
    return spent / readings, threads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pids", nargs="*", type=int, help="pids to count (default: every java process)")
    parser.add_argument("--readings", type=int, default=12, help="readings per mode (12)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between readings (1)")
    parser.add_argument("--period", type=float, default=3.0, help="seconds between thread readings (3)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of both modes (2)")
    args = parser.parse_args(argv)
    pids = args.pids or java_pids()
    if not pids:
        parser.error("no pid given and no java process running")
    for round_number in range(args.rounds):
        for label, period in (("threads at every reading", 0.0), (f"threads every {args.period:g} s", args.period)):
            per_reading, threads = cpu_per_reading(pids, args.readings, args.every, period)
            print(
                f"round {round_number + 1}: {label}: {per_reading * 1e3:.2f} ms CPU per reading of "
                f"{len(pids)} pids ({threads} threads)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
