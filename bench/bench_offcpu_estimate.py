"""Is the off-CPU sampling of busy threads unbiased? bench/PingPongRate.java (threads that switch ~20,000-50,000
times a second each) under `profiler run --off-cpu --off-cpu-min-block 0 --off-cpu-sample-every N`: per thread
name, the switch-outs offcpu.folded counts (each followed one weighted by the switch-outs it stands for)
against the thread's own context switches from /proc/PID/task/TID/status over the same window (read when the
profiler starts and ends sampling; the tracer is attached a little longer, so N = 1 gives the reference).

usage: .venv/bin/python bench/bench_offcpu_estimate.py [--every 10] [--window 8] [--pairs 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_offcpu import _no_spes, _wait_state, warm_jvm  # noqa: E402


def switches_by_name(pid: int) -> dict[str, int]:
    """Context switches (voluntary and not) per thread name, truncated to the kernel's 15 bytes."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        name = fields["Name"].strip()[:15]
        count = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        found[name] = found.get(name, 0) + count
    return found


def estimated_by_name(folded: Path) -> dict[str, int]:
    """Switch-outs per thread name (the stack's root, cut to the kernel's 15 bytes as /proc gives it: the
    capture names threads in full, e.g. "VM Periodic Task Thread") from offcpu.folded: ``cause ns switches stack``."""
    found: dict[str, int] = {}
    for line in folded.read_text().splitlines():
        _cause, _ns, switches, stack = line.split(" ", 3)
        root = stack.split(";", 1)[0][:15]
        found[root] = found.get(root, 0) + int(switches)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=10, help="--off-cpu-sample-every (10)")
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-offcpu-estimate-") as name:
        scratch = Path(name)
        with warm_jvm(scratch, args.pairs) as jvm:
            out, status = scratch / "cap", scratch / "status.json"
            argv = [
                sys.executable, "-m", "profiler", "run", "--duration", str(args.window), "--out", str(out),
                "--pid", str(jvm.pid), "--known-spes", str(_no_spes(scratch)), "--status-file", str(status),
                "--checkpoint", "0", "--force", "--off-cpu", "--off-cpu-min-block", "0",
                "--off-cpu-sample-every", str(args.every),
            ]  # fmt: skip
            profiler = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _wait_state(status, "sampling", profiler)
            before = switches_by_name(jvm.pid)
            _wait_state(status, "writing", profiler)
            after = switches_by_name(jvm.pid)
            profiler.communicate(timeout=600)
            estimated = estimated_by_name(out / "pids" / str(jvm.pid) / "offcpu.folded")
    truth = {name: count - before.get(name, 0) for name, count in after.items()}
    print(f"--off-cpu-sample-every {args.every}, load {os.getloadavg()[0]:.0f}")
    print("| thread | switches (/proc) | estimated | ratio |\n|---|---|---|---|")
    for thread in sorted(truth, key=lambda t: -truth[t])[:8]:
        ratio = estimated.get(thread, 0) / truth[thread] if truth[thread] else float("nan")
        print(f"| {thread} | {truth[thread]:,} | {estimated.get(thread, 0):,} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
