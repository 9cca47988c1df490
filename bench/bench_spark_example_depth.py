"""Deep stacks on one of Spark's own streaming examples (issue 21): pyspark's
structured_network_wordcount_windowed.py (socket source, windowed counts) on a local standalone cluster,
profiled with `profiler run` at its defaults; prints, per executor, the samples, how many the walk
truncated or cut, the deepest stack and how many samples were deeper than the old 127-frame limit.

Then the agent's cost in the window (issue 49's third item): its CPU and its BPF programs' run time
(kernel.bpf_stats) in % of a core, RSS at the window's start, its growth after the first tick, the peak
(start-up and post-run included) and the post-run's seconds, from the capture's overhead.json.

usage: .venv/bin/python bench/bench_spark_example_depth.py OUT_DIR [--duration 60]   (about 3 minutes)
results: docs/benchmarks/unwinding.md
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

from coordinator.workloads.processes import free_port
from coordinator.workloads.sparkcluster import LocalSparkCluster
from profiler.capture import stacktable
from profiler.capture.read import pid_stacks_file

WORDS = ["spark", "flink", "stream", "window", "join", "filter", "sink", "kafka", "event", "task", "cycle"]
EXAMPLE = "examples/src/main/python/sql/streaming/structured_network_wordcount_windowed.py"
OLD_LIMIT = 127


def serve_lines(server: socket.socket, lines_per_tick: int = 50) -> None:
    """The example's socket source: lines of random words, ``lines_per_tick`` every 10 ms (50: about 5,000
    lines per second)."""
    conn, _ = server.accept()
    while True:
        block = "".join(" ".join(random.choice(WORDS) for _ in range(20)) + "\n" for _ in range(lines_per_tick))
        try:
            conn.sendall(block.encode())
        except OSError:
            return
        time.sleep(0.01)


def folded_stacks(capture: Path, pid: int) -> Iterator[tuple[str, int]]:
    """(folded stack, samples) of ``pid``: from its stack table (format 4 on), else its stacks.folded."""
    path = pid_stacks_file(capture, pid)
    if path is None:
        return
    if stacktable.is_table_file(path):
        table = stacktable.read_table(path)
        text = table.stack_text(table.frame_texts())
        for stack_id, count in table.stack_counts().items():
            yield text(stack_id), count
        return
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        yield stack, int(count)


def depth_figures(capture: Path, pid: int) -> dict[str, object]:
    sampler = json.loads((capture / "pids" / str(pid) / "sampler.json").read_text())
    total = deepest = beyond_old_limit = 0
    for stack, count in folded_stacks(capture, pid):
        depth = stack.count(";") + 1
        total += count
        deepest = max(deepest, depth)
        beyond_old_limit += count if depth > OLD_LIMIT else 0
    return {
        "samples": total,
        "truncated": sampler.get("truncated"),
        "stacks_cut": sampler.get("stacks_cut"),
        "deepest": deepest,
        f"deeper_than_{OLD_LIMIT}": beyond_old_limit,
    }


def agent_cost(out: Path) -> dict[str, object]:
    """The agent's own cost over the window, from ``out``'s overhead.json and meta.json."""
    overhead = json.loads((out / "overhead.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    window = max(meta["end_time"] - meta["start_time"], 1e-9)
    bpf = overhead.get("bpf_run_time_ns")
    ticks = [point["rss_bytes"] for point in overhead.get("timeline", [])]
    mb = 1024 * 1024
    return {
        "window_s": round(window, 1),
        "agent_cpu_pct": round(100 * overhead["profiler_cpu_seconds"] / window, 3),
        "bpf_pct": None if bpf is None else round(100 * bpf / 1e9 / window, 3),
        "agent_with_bpf_pct": None
        if bpf is None
        else round(100 * (overhead["profiler_cpu_seconds"] + bpf / 1e9) / window, 3),
        "bpf_us_per_run": None if not bpf or not overhead.get("bpf_run_count") else
        round(bpf / 1e3 / overhead["bpf_run_count"], 2),
        "rss_baseline_mb": round((overhead.get("rss_baseline_bytes") or 0) / mb, 1),
        "growth_after_first_tick_mb": round((ticks[-1] - ticks[0]) / mb, 1) if len(ticks) > 1 else None,
        "peak_rss_mb": round(overhead["peak_rss_bytes"] / mb, 1),
        "post_run_s": overhead.get("post_run_seconds"),
        "cpu_by_component": {c["component"]: c["cpu_seconds"] for c in overhead.get("cpu_by_component", [])},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--duration", type=int, default=60)
    args = parser.parse_args()
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=serve_lines, args=(server,), daemon=True).start()
    example = Path(pyspark.__file__).parent / EXAMPLE
    with LocalSparkCluster(worker_cores=2, worker_memory="2g") as cluster:
        app = cluster.submit(example, ["127.0.0.1", str(port), "10", "5"])
        executors = cluster.wait_for_executors(1, timeout=180)
        time.sleep(45)  # past the first micro-batches' class loading
        pid_args = [arg for pid in executors for arg in ("--pid", str(pid))]
        run = [sys.executable, "-m", "profiler", "run", "--duration", str(args.duration), "--out", str(args.out)]
        subprocess.run([*run, "--force", *pid_args], check=True)
        cluster.stop_app(app)
    print(json.dumps({"agent": agent_cost(args.out)}))
    for pid in executors:
        print(json.dumps({"executor": pid, **depth_figures(args.out, pid)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
