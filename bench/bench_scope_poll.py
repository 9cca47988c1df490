"""What the scope analyzer's polling costs on a host with process churn (issue 29): the CPU seconds of
``ScopeAnalyzer.poll()`` at the runner's poll interval while other processes start and exit, with the
real exec watcher (tracepoint) or polling, for one profiler source tree.

The churn: ``--idle`` long-lived processes (a busy host's pid table) and ``--rate`` short processes per
second (`sh -c` running `true`, as test suites and cron jobs do), none of them an engine process; the
known_spes.txt is the shipped one. Prints one JSON line.

usage: .venv/bin/python bench/bench_scope_poll.py [--seconds 30] [--rate 60] [--idle 300] [--polling] [--lifetime S]
       .venv/bin/python bench/bench_scope_poll.py --src /tmp/main-src   # the "before"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_SECONDS = 0.25


def churn(rate: float, stop: threading.Event, lifetime: float) -> int:
    started = 0
    children: list[subprocess.Popen[bytes]] = []
    while not stop.is_set():
        if lifetime:  # processes that live long enough to be listed and looked at, reaped as they end
            children = [child for child in children if child.poll() is None]
            children.append(subprocess.Popen(["sleep", str(lifetime)]))
        else:
            subprocess.Popen(["sh", "-c", "true"]).wait()
        started += 1
        stop.wait(1.0 / rate)
    for child in children:
        child.wait()
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=60.0, help="short processes started per second")
    parser.add_argument("--idle", type=int, default=300, help="long-lived processes on the host")
    parser.add_argument("--polling", action="store_true", help="no exec watcher")
    parser.add_argument("--lifetime", type=float, default=0.0, help="churn: `sleep LIFETIME`, not `sh -c true`")
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    sys.path.insert(0, str(args.src))
    from profiler.scope.analyzer import ScopeAnalyzer
    from profiler.scope.spes import default_known_spes_path, load_known_spes

    idle = [subprocess.Popen(["sleep", str(args.seconds + 60)]) for _ in range(args.idle)]
    stop = threading.Event()
    counter: list[int] = []
    thread = threading.Thread(target=lambda: counter.append(churn(args.rate, stop, args.lifetime)), daemon=True)
    scope = ScopeAnalyzer(load_known_spes(default_known_spes_path()), exec_watch=not args.polling)
    try:
        scope.start()
        thread.start()
        cpu = 0.0
        polls = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            before = time.thread_time()
            scope.poll()
            cpu += time.thread_time() - before
            polls += 1
            time.sleep(POLL_SECONDS)
    finally:
        stop.set()
        thread.join()
        scope.close()
        for process in idle:
            process.kill()
            process.wait()
    print(
        json.dumps(
            {
                "src": str(args.src),
                "mode": scope.exec_watch_mode,
                "seconds": args.seconds,
                "polls": polls,
                "started": counter[0] if counter else 0,
                "idle": args.idle,
                "lifetime": args.lifetime,
                "cmdlines_skipped": getattr(scope, "cmdlines_skipped", None),
                "poll_cpu_seconds": round(cpu, 4),
                "per_minute": round(cpu * 60 / args.seconds, 4),
                "load": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
