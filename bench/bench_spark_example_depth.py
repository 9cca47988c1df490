"""Deep stacks on one of Spark's own streaming examples (issue 21): pyspark's
structured_network_wordcount_windowed.py (socket source, windowed counts) on a local standalone cluster,
profiled with `profiler run` at its defaults; prints, per executor, the samples, how many the walk
truncated or cut, the deepest stack and how many samples were deeper than the old 127-frame limit.

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
from pathlib import Path

import pyspark

from coordinator.workloads.processes import free_port
from coordinator.workloads.sparkcluster import LocalSparkCluster

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


def depth_figures(pid_dir: Path) -> dict[str, object]:
    sampler = json.loads((pid_dir / "sampler.json").read_text())
    total = deepest = beyond_old_limit = 0
    for line in (pid_dir / "stacks.folded").read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        depth = stack.count(";") + 1
        total += int(count)
        deepest = max(deepest, depth)
        beyond_old_limit += int(count) if depth > OLD_LIMIT else 0
    return {
        "samples": total,
        "truncated": sampler.get("truncated"),
        "stacks_cut": sampler.get("stacks_cut"),
        "deepest": deepest,
        f"deeper_than_{OLD_LIMIT}": beyond_old_limit,
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
    for pid in executors:
        print(json.dumps({"executor": pid, **depth_figures(args.out / "pids" / str(pid))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
