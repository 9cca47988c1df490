"""Memory of `profiler run` by phase: compiling, the window, and after it (symbolize, match, write).

Starts --jvms CPU-bound JVMs (bench/OpsLoop.java, -XX:+PreserveFramePointer), profiles them with
`profiler run --pid ...` for --window seconds and reads the profiler's /proc/PID/status every 0.1 s
(VmRSS, RssAnon, RssFile) beside its status file's state. Reports the peak per phase, the RSS when the
window starts and ends, and the peak RSS the run records itself (overhead.json, getrusage). Goal: peak
RSS <= 200 MB.

usage: .venv/bin/python bench/bench_memory.py [--jvms N] [--window S] [--rounds N] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import REPO, WORKLOAD, OpsJvm, command_line, machine_facts, publish

from profiler.capture import format as capture
from profiler.capture.read import read_overhead, read_sampler_stats, read_scope

DOC = REPO / "docs" / "benchmarks" / "memory.md"
PHASES = ("starting", "sampling", "writing")  # status.json states: compile + tables, window, after it
GOAL_MB = 200


@dataclass
class Trace:
    """The profiler's memory (MB) sampled every 0.1 s, by the phase its status file said."""

    peak: dict[str, float] = field(default_factory=dict)
    anon_peak: dict[str, float] = field(default_factory=dict)
    file_peak: dict[str, float] = field(default_factory=dict)
    window_start: float | None = None
    window_end: float | None = None


def _status_kb(pid: int) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    values[key] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return values


def _state(status: Path) -> str | None:
    try:
        return json.loads(status.read_text()).get("state")
    except (OSError, ValueError):
        return None


def watch(pid: int, status: Path, stop: threading.Event, trace: Trace) -> None:
    last_rss = 0.0
    while not stop.is_set():
        values = _status_kb(pid)
        state = _state(status)
        if values and state is not None:
            rss = values["VmRSS"] / 1024
            phase = state if state in PHASES else "starting"
            trace.peak[phase] = max(trace.peak.get(phase, 0.0), rss)
            trace.anon_peak[phase] = max(trace.anon_peak.get(phase, 0.0), values.get("RssAnon", 0) / 1024)
            trace.file_peak[phase] = max(trace.file_peak.get(phase, 0.0), values.get("RssFile", 0) / 1024)
            if state == "sampling" and trace.window_start is None:
                trace.window_start = rss
            if state == "writing" and trace.window_end is None:
                trace.window_end = last_rss
            last_rss = rss
        time.sleep(0.1)


@dataclass(frozen=True)
class Round:
    trace: Trace
    recorded_peak_mb: float  # overhead.json's peak_rss_bytes: the agent's VmHWM
    samples: int


def profile_round(jvms: list[OpsJvm], seconds: float, work: Path, index: int) -> Round:
    out, status = work / f"cap{index}", work / f"status{index}.json"
    known_spes = work / "known_spes.txt"
    known_spes.write_text("# matches nothing: only --pid is sampled\nbench  workload  none  no.such.MainClass\n")
    profile = work / "profile.txt"
    profile.write_text("Work: OpsLoop\n")
    pids = [arg for jvm in jvms for arg in ("--pid", str(jvm.pid))]
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler", "run", "--duration", str(seconds), "--out", str(out), "--force",
         *pids, "--known-spes", str(known_spes), "--profile", str(profile), "--status-file", str(status)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    trace, stop = Trace(), threading.Event()
    watcher = threading.Thread(target=watch, args=(process.pid, status, stop, trace), daemon=True)
    watcher.start()
    try:
        _, err = process.communicate(timeout=seconds + 600)
    finally:
        stop.set()
        watcher.join()
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"profiler run failed ({process.returncode}): {err.decode(errors='replace')[-500:]}")
    overhead = read_overhead(out)
    assert overhead is not None
    samples = sum(p.samples for p in _sampler_stats(out))
    shutil.rmtree(out, ignore_errors=True)
    return Round(trace, overhead.peak_rss_bytes / 2**20, samples)


def _sampler_stats(out: Path) -> list[capture.SamplerStats]:
    stats = []
    for process in read_scope(out):
        found = read_sampler_stats(out, process.pid)
        if found is not None:
            stats.append(found)
    return stats


def run(args: argparse.Namespace) -> list[Round]:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        subprocess.run([shutil.which("javac") or "javac", "-d", str(work), str(WORKLOAD)], check=True)
        jvms: list[OpsJvm] = []
        try:
            for _ in range(args.jvms):
                jvms.append(OpsJvm(work, 1))
            time.sleep(5)  # JIT warm-up: the perf maps the run symbolizes with
            for index in range(args.rounds):
                rounds.append(profile_round(jvms, args.window, work, index))
                print(f"round {index + 1}/{args.rounds}: peak {rounds[-1].recorded_peak_mb:.0f} MB", flush=True)
        finally:
            for jvm in jvms:
                jvm.stop()
    return rounds


def _median(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.median(present):.0f}" if present else "—"


def report(rounds: list[Round], args: argparse.Namespace, command: str) -> str:
    lines = [
        "# Memory of `profiler run` by phase",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{command}`",
        "",
        f"Machine: {machine_facts()}.",
        "",
        f"Workload: {args.jvms} JVM(s) of bench/OpsLoop.java (1 thread each, -XX:+PreserveFramePointer), "
        f"profiled with `profiler run --pid ...` for {args.window:.0f} s, {args.rounds} round(s); the profiler's "
        "/proc/PID/status read every 0.1 s and binned by its status file's state. Medians over rounds, MB.",
        "",
        "| phase | peak RSS | peak anonymous | peak file-backed |",
        "|---|---:|---:|---:|",
    ]
    names = {"starting": "start: BPF compiles, unwind tables", "sampling": "the window", "writing": "after it"}
    for phase in PHASES:
        lines.append(
            f"| {names[phase]} | {_median([r.trace.peak.get(phase) for r in rounds])} | "
            f"{_median([r.trace.anon_peak.get(phase) for r in rounds])} | "
            f"{_median([r.trace.file_peak.get(phase) for r in rounds])} |"
        )
    lines += [
        "",
        "| measure | median | range | goal |",
        "|---|---:|---|---|",
        f"| RSS when the window starts | {_median([r.trace.window_start for r in rounds])} MB | | |",
        f"| RSS when the window ends | {_median([r.trace.window_end for r in rounds])} MB | | |",
        f"| peak RSS as the run records it (overhead.json, getrusage) | "
        f"{_median([r.recorded_peak_mb for r in rounds])} MB | "
        f"{min(r.recorded_peak_mb for r in rounds):.0f} … {max(r.recorded_peak_mb for r in rounds):.0f} | "
        f"≤ {GOAL_MB} MB |",
        f"| samples per round | {_median([float(r.samples) for r in rounds])} | | |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jvms", type=int, default=2, help="JVMs profiled at once (2)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds per window (30)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write {DOC}")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_memory: needs root (eBPF)", file=sys.stderr)
        return 3
    command = command_line("bench_memory.py", argv)
    return publish(report(run(args), args, command), DOC, args.no_write)


if __name__ == "__main__":
    sys.exit(main())
