"""The scope's CPU in a real `profiler run` on a host where many processes start and exit (issue 49): the
run's own figure, overhead.json's cpu_by_component "scope" (the runner's thread inside the scope's polls),
over a window in which ``--count`` short processes (`sh -c true`, as test suites and cron jobs start them)
start and exit, none of them an engine process. The profiled target is a sleeping process given by --pid;
the shipped known_spes.txt. ``--src`` runs another source tree's agent (the "before"). Needs root; on a
shared machine run under the heavy lock. Prints one JSON line.

usage: flock /tmp/spe-heavy.lock .venv/bin/python bench/bench_scope_churn.py [--seconds 60] [--count 2000]
       ... bench/bench_scope_churn.py --src /tmp/main-src   # the "before"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START_SECONDS = 3.0  # the churn starts after the agent's start-up, so the window sees all of it


def churn(count: int, seconds: float, stop: threading.Event) -> int:
    """``count`` short processes spread evenly over ``seconds``; how many were started."""
    started = 0
    interval = seconds / count
    next_at = time.monotonic()
    while started < count and not stop.is_set():
        subprocess.Popen(["sh", "-c", "true"]).wait()
        started += 1
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))
    return started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the window (default 60 s)")
    parser.add_argument("--count", type=int, default=2000, help="short processes over the window (default 2000)")
    parser.add_argument("--src", type=Path, default=REPO, help="the agent's source tree (default this one)")
    parser.add_argument("--keep", type=Path, help="copy the run directory here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_scope_churn: needs root (BPF)", file=sys.stderr)
        return 2
    target = subprocess.Popen(["sleep", str(args.seconds + 120)])
    stop = threading.Event()
    started: list[int] = []
    with tempfile.TemporaryDirectory(prefix="scope-churn-") as scratch:
        out = Path(scratch) / "run"
        env = {**os.environ, "PYTHONPATH": str(args.src)}
        argv_run = [sys.executable, "-m", "profiler", "run", "--pid", str(target.pid),
                    "--duration", f"{args.seconds + 2 * START_SECONDS:g}", "--out", str(out), "--force"]  # fmt: skip
        load_before = os.getloadavg()
        run = subprocess.Popen(
            argv_run, env=env, cwd=args.src, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            time.sleep(START_SECONDS)
            thread = threading.Thread(target=lambda: started.append(churn(args.count, args.seconds, stop)), daemon=True)
            thread.start()
            _, stderr = run.communicate(timeout=args.seconds + 600)
        finally:
            stop.set()
            if run.poll() is None:
                run.kill()
                run.wait()
            target.kill()
            target.wait()
        if run.returncode != 0:
            print(f"bench_scope_churn: profiler run exited {run.returncode}: {stderr[-400:]}", file=sys.stderr)
            return 1
        overhead = json.loads((out / "overhead.json").read_text())
        if args.keep is not None:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
        scoped = len(json.loads((out / "scope.json").read_text())) if (out / "scope.json").exists() else None
        meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    components = {entry["component"]: entry["cpu_seconds"] for entry in overhead.get("cpu_by_component") or []}
    print(
        json.dumps(
            {
                "src": str(args.src),
                "window_s": args.seconds + 2 * START_SECONDS,
                "started": started[0] if started else 0,
                "scope_cpu_s": components.get("scope"),
                "cpu_by_component": components,
                "exec_watch": meta.get("exec_watch"),
                "scoped_processes": scoped,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
