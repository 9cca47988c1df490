"""What a capture costs as the window grows (issue 29): capture bytes per executor-minute, the host
agent's peak RSS and CPU, post-run seconds, fetch and analysis time, for one profiler source tree.

Workloads: ``deep`` (bench/DeepStream.java: a Spark Structured Streaming job fed by a socket whose map
recurses 100-250 calls deep along a path of its own per line, Java stacks 100-200 frames, as many distinct
stacks as samples; a local standalone cluster, one 2-core
executor, profiled by `profiler run` at its defaults) and ``ysb`` (`coordinator demo`, YSB on Spark).
``--src`` runs another source tree (e.g. `git archive main | tar -x -C /tmp/main-src`) with this
interpreter: the "before" rows. Each run appends one JSON line to ``--results``; ``--render`` turns
that file into docs/benchmarks/capture.md.

usage: .venv/bin/python bench/bench_capture.py --workload deep --durations 60,300,900 --label after
       .venv/bin/python bench/bench_capture.py --workload deep --durations 60 --label before --src /tmp/main-src
       .venv/bin/python bench/bench_capture.py --render
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_spark_example_depth import serve_lines  # noqa: E402  (the socket source: random words)

RESULTS = REPO / "docs" / "benchmarks" / "capture.jsonl"
DOC = REPO / "docs" / "benchmarks" / "capture.md"
MB = 1e6


def build_jar(work: Path) -> Path:
    from coordinator.workloads.sparkcluster import java_home, spark_home

    classes = work / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    javac = java_home() / "bin" / "javac"
    sources = [str(REPO / "bench" / name) for name in ("DeepStream.java", "DeepPaths.java")]
    subprocess.run([str(javac), "-d", str(classes), "-cp", f"{spark_home()}/jars/*", *sources], check=True)
    jar = work / "deepstream.jar"
    jar_tool = java_home() / "bin" / "jar"
    subprocess.run([str(jar_tool), "cfe", str(jar), "DeepStream", "-C", str(classes), "."], check=True)
    return jar


def timed_child(argv: list[str], src: Path, cwd: Path) -> tuple[float, int, float]:
    """(wall seconds, peak RSS bytes, CPU seconds) of a child process run to its end."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.monotonic()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}: exit {child.returncode}")
    return time.monotonic() - start, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def profile_deep(duration: int, src: Path, out: Path, jar: Path) -> tuple[list[Path], int, int]:
    """Run the deep-stack job, profile its executor; (capture dirs, profiler peak RSS, executors)."""
    from coordinator.workloads.processes import free_port
    from coordinator.workloads.sparkcluster import LocalSparkCluster

    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    # 200 lines per second: Spark's socket source reads a micro-batch's lines by index from a list (quadratic
    # in the lines per batch), which at 5,000 per second took 90 % of the executor's samples, not the map
    threading.Thread(target=serve_lines, args=(server, 2), daemon=True).start()
    with LocalSparkCluster(worker_cores=2, worker_memory="2g") as cluster:
        conf = {"spark.executor.cores": "2", "spark.executor.memory": "1g"}
        app = cluster.submit(jar, ["127.0.0.1", str(port)], conf)
        executors = cluster.wait_for_executors(1, timeout=240)
        time.sleep(60)  # past the first micro-batches' class loading and the JIT's first compilations
        pid_args = [arg for pid in executors for arg in ("--pid", str(pid))]
        # Only our executor: other users' JVMs on a shared host must not enter the scope (no known kinds).
        no_kinds = out.parent / "no_known_spes.txt"
        no_kinds.write_text("none workload nothing no.such.Process.class.at.all\n", encoding="utf-8")
        argv = [sys.executable, "-m", "profiler", "run", "--duration", str(duration), "--out", str(out), "--force",
                "--known-spes", str(no_kinds)]
        _wall, peak, _cpu = timed_child([*argv, *pid_args], src, src)
        cluster.stop_app(app)
    server.close()
    return [out], peak, len(executors)


def profile_ysb(duration: int, src: Path, out: Path) -> tuple[list[Path], int, int]:
    argv = [sys.executable, "-m", "coordinator", "demo", "--duration", str(duration), "--out", str(out), "--quiet"]
    timed_child(argv, src, src)
    captures = sorted(p for p in (out / "hosts").iterdir() if p.is_dir())
    overhead = [json.loads((c / "overhead.json").read_text()) for c in captures]
    executors = sum(1 for c in captures for p in json.loads((c / "scope.json").read_text()) if p["role"] == "workload")
    return captures, max(o["peak_rss_bytes"] for o in overhead), executors


def tree_bytes(root: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in root.rglob(pattern) if p.is_file())


def stack_bytes(capture_dir: Path) -> int:
    names = ("stacks.tpc", "stacks.folded", "timeline.folded", "contexts.json")
    return sum(p.stat().st_size for p in capture_dir.glob("pids/*/*") if p.name in names)


def fetch_bytes(capture_dir: Path, everything: bool) -> int:
    """Bytes of the tar stream `coordinator fetch` moves (deploy.fetch_command's exclusions), or with ``everything``."""
    from coordinator.remote.deploy import FETCH_SKIPPED
    from profiler.capture.checkpoint import CHECKPOINT_DIR

    skipped = () if everything else FETCH_SKIPPED
    argv = ["tar", "-C", str(capture_dir), f"--exclude=./{CHECKPOINT_DIR}", *(f"--exclude=./{p}" for p in skipped)]
    return len(subprocess.run([*argv, "-cf", "-", "."], capture_output=True, check=True).stdout)


def fetch_seconds(capture_dir: Path, work: Path) -> float:
    """What `coordinator fetch` moves: the capture as a tar stream, unpacked elsewhere."""
    target = work / "fetched"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    start = time.monotonic()
    pack = subprocess.Popen(["tar", "-C", str(capture_dir), "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-C", str(target), "-xf", "-"], stdin=pack.stdout, check=True)
    pack.wait()
    return time.monotonic() - start


def measure(args: argparse.Namespace, duration: int, work: Path, jar: Path | None) -> dict[str, Any]:
    out = work / f"{args.workload}-{args.label}-{duration}"
    shutil.rmtree(out, ignore_errors=True)
    if args.workload == "deep":
        assert jar is not None
        captures, agent_peak, executors = profile_deep(duration, args.src, out, jar)
    else:
        captures, agent_peak, executors = profile_ysb(duration, args.src, out)
    overheads = [json.loads((c / "overhead.json").read_text()) for c in captures]
    meta = json.loads((captures[0] / "meta.json").read_text())
    growth = max(
        (max(p["rss_bytes"] for p in o["timeline"]) - (o["rss_baseline_bytes"] or 0)) if o["timeline"] else 0
        for o in overheads
    )
    samples = sum(json.loads(p.read_text())["samples"] for c in captures for p in c.glob("pids/*/sampler.json"))
    analysis = work / f"analysis-{args.label}-{duration}"
    shutil.rmtree(analysis, ignore_errors=True)
    analyze_argv = [sys.executable, "-m", "coordinator", "analyze", *map(str, captures), "--out", str(analysis),
                    "--engine", "in-process"]
    analyze_wall, analyze_peak, _cpu = timed_child(analyze_argv, args.src, args.src)
    minutes = meta["end_time"] - meta["start_time"]
    minutes /= 60
    capture_total = sum(tree_bytes(c) for c in captures)
    return {
        "workload": args.workload,
        "label": args.label,
        "duration": duration,
        "executors": executors,
        "samples": samples,
        "stack_bytes": sum(stack_bytes(c) for c in captures),
        "stack_bytes_per_executor_minute": sum(stack_bytes(c) for c in captures) / max(1, executors) / minutes,
        "capture_bytes": capture_total,
        "run_dir_bytes_per_executor": (capture_total + tree_bytes(analysis)) / max(1, executors),
        "agent_peak_rss": agent_peak,
        "agent_growth": growth,
        "agent_cpu_pct": 100 * max(o["profiler_cpu_seconds"] for o in overheads) / (minutes * 60),
        "post_run_seconds": max(o["post_run_seconds"] for o in overheads),
        "post_run_cpu_seconds": post_run_cpu(overheads),
        "fetch_seconds": sum(fetch_seconds(c, work) for c in captures),
        "fetch_bytes": sum(fetch_bytes(c, everything=False) for c in captures),
        "fetch_bytes_all": sum(fetch_bytes(c, everything=True) for c in captures),
        "analyze_seconds": analyze_wall,
        "analyze_peak_rss": analyze_peak,
        **stack_shape(captures),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "time": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }


def post_run_cpu(overheads: list[dict]) -> float | None:
    """The largest post-run CPU of the hosts; None where the code measured is older than that figure."""
    values = [o.get("post_run_cpu_seconds") for o in overheads]
    return None if not values or None in values else max(values)


def stack_shape(captures: list[Path]) -> dict[str, int]:
    """Frames of the deepest stack, and the distinct stacks of the process with the most (this tree's reader)."""
    from profiler.capture.read import pid_stacks_file, read_stack_counts

    deepest = distinct = 0
    for capture_dir in captures:
        for pid_dir in capture_dir.glob("pids/*"):
            path = pid_stacks_file(capture_dir, int(pid_dir.name))
            if path is not None:
                stacks = read_stack_counts(path)
                deepest = max([deepest, *(s.count(";") + 1 for s in stacks)])
                distinct = max(distinct, len(stacks))
    return {"deepest": deepest, "distinct_stacks": distinct}


def size(count: float) -> str:
    return f"{count / 1e3:.1f} KB" if count < 1e6 else f"{count / 1e6:.2f} MB"


def post_cpu(row: dict) -> str:
    cpu = row.get("post_run_cpu_seconds")
    return f" ({cpu:.1f} CPU s)" if cpu is not None else ""


def render(results: Path) -> str:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lines = [
        "| workload | code | window | executors | samples | distinct stacks | deepest stack | "
        "stack bytes per executor-minute | run dir per executor | agent peak RSS | in-window growth | agent CPU | "
        "post-run (CPU) | fetch | analyze | "
        "analyze peak RSS | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["workload"], r["label"] != "before", r["duration"], r["label"])):
        lines.append(
            f"| {r['workload']} | {r['label']} | {r['duration']} s | {r['executors']} | {r['samples']} | "
            f"{r.get('distinct_stacks', '')} | {r['deepest']} | {size(r['stack_bytes_per_executor_minute'])} | "
            f"{size(r['run_dir_bytes_per_executor'])} | {r['agent_peak_rss'] / MB:.1f} MB | "
            f"+{r['agent_growth'] / MB:.0f} MB | {r['agent_cpu_pct']:.2f} % | "
            f"{r['post_run_seconds']:.1f} s{post_cpu(r)} | "
            f"{r['fetch_seconds']:.2f} s | {r['analyze_seconds']:.1f} s | {r['analyze_peak_rss'] / MB:.0f} MB | "
            f"{r['machine'].rpartition('load ')[2]} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("deep", "ysb"), default="deep")
    parser.add_argument("--durations", default="60,300,900")
    parser.add_argument("--label", default="after", help="the code measured: after (this tree) or before (main)")
    parser.add_argument("--src", type=Path, default=REPO, help="the source tree whose profiler and coordinator run")
    parser.add_argument("--work", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true", help="print the table of --results and stop")
    args = parser.parse_args()
    if args.render:
        print(render(args.results), end="")
        return 0
    args.src = args.src.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-capture-"))
    work.mkdir(parents=True, exist_ok=True)
    jar = build_jar(work) if args.workload == "deep" else None
    for duration in (int(d) for d in args.durations.split(",")):
        row = measure(args, duration, work, jar)
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
        print(json.dumps(row, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
