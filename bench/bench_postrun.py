"""Post-run latency of `coordinator profile`: end of sampling → captures home → summary.csv → report,
for 1, 2, 4 and 8 hosts (each host a real sshd on a loopback port, each running the real profiler).

    .venv/bin/python bench/bench_postrun.py            # 1, 2, 4, 8 hosts, 5 s windows, 2 repetitions
    .venv/bin/python bench/bench_postrun.py --quick    # 1 and 2 hosts, 2 s windows, 1 repetition

Writes docs/benchmarks/postrun.md (unless --no-write). Needs root (sshd, eBPF).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coordinator import rundir  # noqa: E402
from profiler.capture.read import read_meta  # noqa: E402
from tests.fixtures.sshd import SshdFactory  # noqa: E402

BUSY = "import time\nend = time.time() + 3600\nwhile time.time() < end:\n    sum(i * i for i in range(1000))\n"


@dataclass(frozen=True)
class Sample:
    hosts: int
    window_end_to_fetched: float  # last host's sampling end → every capture home (run.json written)
    window_end_to_summary: float  # → summary.csv written (the goal: ≤ 15 s, flat in hosts)
    window_end_to_report: float | None  # → report/index.html written
    window_end_to_spark: float | None  # → the analysis's Spark session ready (warmed beside the fetch)
    wall: float  # whole `profile_cluster` call
    duration: float
    start_spread: float  # max - min of the hosts' sampling starts (coordinator clock)
    complete: bool


def measure(factory: SshdFactory, n_hosts: int, duration: float, busy_pid: int, work: Path, index: int) -> Sample:
    servers = factory.hosts[:n_hosts]
    cluster = factory.cluster_file(
        [h.cluster_line(factory.user_key) for h in servers], work / f"cluster-{n_hosts}-{index}.txt"
    )
    known_hosts = factory.known_hosts(servers, work / f"known_hosts-{n_hosts}-{index}")
    profile = work / "profile.txt"
    known_spes = work / "known_spes.txt"
    out = work / f"run-{n_hosts}-{index}"
    # One `coordinator profile` process per run, as a user runs it: the analysis's JVM starts afresh.
    command = [
        sys.executable, "-m", "coordinator", "profile",
        "--cluster", str(cluster), "--known-hosts", str(known_hosts), "--out", str(out),
        "--profile", str(profile), "--known-spes", str(known_spes), "--pid", str(busy_pid),
        "--duration", str(duration), "--quiet",
        # all "hosts" compile their BPF programs on this machine's cores at once
        "--start-delay", str(6.0 + 3.0 * n_hosts),
    ]  # fmt: skip
    began = time.time()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.time() - began
    info = rundir.read_run(out)
    for host in info.hosts:
        if host.state != "ok":
            print(f"  {host.host}: {host.state}: {host.reason}", flush=True)
    if done.returncode not in (0, 9):
        print(done.stderr[-2000:], flush=True)
    ends, starts = [], []
    for host in info.hosts:
        if not host.has_capture:
            continue
        meta = read_meta(rundir.host_capture_dir(out, host.host))
        offset = host.clock_offset or 0.0
        ends.append(meta.end_time - offset)
        starts.append(meta.start_time - offset)
    window_end = max(ends)
    summary = out / "summary.csv"
    report = out / "report" / "index.html"
    spark_ready = None
    for line in (out / "coordinator.log").read_text().splitlines():
        match = re.search(r"warm-up began ([0-9.]+), ready ([0-9.]+)", line)
        if match and float(match.group(2)) > 0:
            spark_ready = float(match.group(2)) - window_end
    return Sample(
        hosts=n_hosts,
        window_end_to_fetched=(info.end_time or window_end) - window_end,
        window_end_to_summary=summary.stat().st_mtime - window_end,
        window_end_to_report=report.stat().st_mtime - window_end if report.exists() else None,
        window_end_to_spark=spark_ready,
        wall=wall,
        duration=duration,
        start_spread=max(starts) - min(starts),
        complete=info.complete,
    )


def machine() -> str:
    cpus = os.cpu_count()
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpus} CPUs ({model}), kernel {platform.release()}, Python {platform.python_version()}"


def render(samples: list[Sample], command: str, load_before: str, load_after: str) -> str:
    lines = [
        "# Post-run latency of `coordinator profile`",
        "",
        "End of sampling (the last host's window end, on the coordinator's clock) until the captures are",
        "home, `summary.csv` is written (PySpark pipeline) and the HTML report is rendered. Each host is a",
        "real sshd on a loopback port of this one machine running the real profiler (`--pid` of a busy",
        "process), so all hosts share this machine's CPUs — on a real cluster each host writes its capture",
        "on its own CPUs. Goal: ≤ 15 s for one host, flat in the number of hosts.",
        "",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        f"- load average before / after: {load_before} / {load_after} (the machine is shared)",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| hosts | runs | → captures home (s) | → Spark session ready (s) | → summary.csv (s) | → report (s) "
        "| start spread (s) | wall (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({s.hosts for s in samples}):
        group = [s for s in samples if s.hosts == n]

        def med(values: list[float]) -> str:
            return f"{statistics.median(values):.1f}" if values else "–"

        reports = [s.window_end_to_report for s in group if s.window_end_to_report is not None]
        sparks = [s.window_end_to_spark for s in group if s.window_end_to_spark is not None]
        lines.append(
            f"| {n} | {len(group)} | {med([s.window_end_to_fetched for s in group])} | {med(sparks)} | "
            f"{med([s.window_end_to_summary for s in group])} | {med(reports)} | "
            f"{med([s.start_spread for s in group])} | {med([s.wall for s in group])} |"
        )
    lines += [
        "",
        "Medians. \"captures home\" covers the profilers' own writing phase (symbolization, matching, result",
        "files), the coordinator noticing `done` (status polled every 0.5 s), and the tar stream over SSH.",
        "Runs this small are analysed in-process (the pipeline's engine \"auto\": same matcher and row code,",
        "byte-identical output, no JVM); Spark, with its ~10 s start-up, is for archives and very large runs.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 2 hosts, 2 s windows, one repetition")
    parser.add_argument("--hosts", type=int, nargs="+", default=None, help="host counts (1 2 4 8)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per host count (2)")
    parser.add_argument("--duration", type=float, default=None, help="sampling window (5 s)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    counts = args.hosts or ([1, 2] if args.quick else [1, 2, 4, 8])
    repeat = args.repeat or (1 if args.quick else 2)
    duration = args.duration or (2.0 if args.quick else 5.0)
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="bench-postrun-") as tmp:
        work = Path(tmp)
        (work / "profile.txt").write_text("Python: re:.+\n")
        (work / "known_spes.txt").write_text("bench workload nothing taskprof-bench-matches-no-process\n")
        factory = SshdFactory(work / "sshd")
        try:
            for _ in range(max(counts)):
                factory.start()
            for n in counts:
                for index in range(repeat):
                    sample = measure(factory, n, duration, busy.pid, work, index)
                    samples.append(sample)
                    print(
                        f"{n} host(s): captures home {sample.window_end_to_fetched:.1f} s, spark ready "
                        f"{sample.window_end_to_spark or 0:.1f} s, summary "
                        f"{sample.window_end_to_summary:.1f} s, report {sample.window_end_to_report or 0:.1f} s, "
                        f"start spread {sample.start_spread:.2f} s, wall {sample.wall:.1f} s"
                        + ("" if sample.complete else " (PARTIAL)"),
                        flush=True,
                    )
        finally:
            factory.stop_all()
            busy.kill()
            busy.wait()
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    command = " ".join([".venv/bin/python bench/bench_postrun.py", *sys.argv[1:]])
    text = render(samples, command, load_before, load_after)
    print(text)
    if not args.no_write:
        target = REPO / "docs" / "benchmarks" / "postrun.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
