"""What the checkpoint journal costs `profiler run`, and what `profiler recover` gets back after a SIGKILL.

One warmed-up JVM (bench/OpsLoop.java); one `profiler run` window per --checkpoint period (0 = none),
each reading overhead.json: the profiler's CPU over the window, the checkpoints' own CPU and wall time
(fsync included) and the journal bytes written. Then one run killed with SIGKILL halfway through its
window, recovered: samples at the kill (status file), samples recovered, the journal's size and the
time `profiler recover` took.

usage: .venv/bin/python bench/bench_checkpoint.py [--window S] [--periods 0,30,5,1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_overhead import WORKLOAD, OpsJvm, command_line, machine_facts, publish  # noqa: E402

from profiler.capture import format as capture  # noqa: E402
from profiler.capture.checkpoint import journal_path  # noqa: E402
from profiler.capture.read import read_meta, read_overhead, read_sampler_stats  # noqa: E402

DOC = REPO / "docs" / "benchmarks" / "checkpoint.md"


@dataclass(frozen=True)
class Run:
    period: float
    samples: int
    distinct_stacks: int
    profiler_cpu_s: float
    checkpoints: int
    checkpoint_cpu_s: float
    checkpoint_wall_s: float
    journal_bytes: int


def _inputs(work: Path) -> list[str]:
    known = work / "known_spes.txt"
    known.write_text("# matches nothing: only --pid is sampled\nbench  workload  none  no.such.MainClass\n")
    profile = work / "profile.txt"
    profile.write_text("Work: OpsLoop\n")
    return ["--known-spes", str(known), "--profile", str(profile), "--no-exec-watch"]


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _start(jvm: OpsJvm, work: Path, name: str, window: float, period: float) -> tuple[subprocess.Popen[bytes], Path]:
    out, status = work / name, work / f"{name}.status"
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler", "run", "--duration", str(window), "--out", str(out), "--force",
         "--pid", str(jvm.pid), "--checkpoint", str(period), "--status-file", str(status), *_inputs(work)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while _status(status).get("state") != "sampling":
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"profiler run did not start: {process.stderr.read() if process.stderr else b''!r}")
        time.sleep(0.1)
    return process, status


def measured_run(jvm: OpsJvm, work: Path, window: float, period: float) -> Run:
    process, _status_file = _start(jvm, work, f"cap-{period:g}", window, period)
    _, err = process.communicate(timeout=window + 600)
    if process.returncode != 0:
        raise RuntimeError(f"profiler run failed: {err.decode(errors='replace')[-400:]}")
    out = work / f"cap-{period:g}"
    overhead = read_overhead(out)
    stats = read_sampler_stats(out, jvm.pid)
    assert overhead is not None and stats is not None
    distinct = len(capture.stacks_path(out, jvm.pid).read_text().splitlines())
    shutil.rmtree(out)
    return Run(
        period, stats.samples, distinct, overhead.profiler_cpu_seconds, overhead.checkpoints,
        overhead.checkpoint_cpu_seconds, overhead.checkpoint_seconds, overhead.checkpoint_bytes,
    )  # fmt: skip


def killed_run(jvm: OpsJvm, work: Path, window: float, period: float) -> dict[str, float]:
    process, status = _start(jvm, work, "killed", window, period)
    time.sleep(window / 2)
    at_kill = _status(status)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    out = work / "killed"
    journal = journal_path(out).stat().st_size
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "profiler", "recover", str(out), "--quiet"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    recover_s = time.monotonic() - began
    meta = read_meta(out)
    stats = read_sampler_stats(out, jvm.pid)
    assert stats is not None
    return {
        "elapsed_at_kill_s": float(at_kill.get("elapsed") or 0),
        "samples_at_kill": float(at_kill.get("samples") or 0),
        "recovered_window_s": meta.end_time - meta.start_time,
        "samples_recovered": float(stats.samples),
        "journal_bytes": float(journal),
        "recover_s": recover_s,
    }


def synthetic(stacks: int, depth: int, intervals: int) -> dict[str, float]:
    """Encoding cost of a Spark-sized store: ``stacks`` distinct stacks of ``depth`` frames spread over
    ``intervals`` timeline slices; the first checkpoint (everything) and a later one (1 % new stacks,
    every counter of the latest slice touched)."""
    import random
    import struct

    from profiler.capture.journal import Checkpoint, encode_checkpoint
    from profiler.capture.stackstore import StackStore

    rng = random.Random(1)
    store = StackStore(int(10e9))
    store.track_deltas = True
    store.begin(0)
    frames = [rng.randrange(0x7F0000000000, 0x7F0000100000) for _ in range(4000)]

    def add(count: int, interval: int) -> None:
        for _ in range(count):
            user = struct.pack(f"<{depth}Q", *rng.choices(frames, k=depth))
            store.add(1234, 1, b"Executor task launch worker", interval * 10_000_000_000, user, -1)

    for interval in range(intervals):
        add(stacks // intervals, interval)
    began = time.process_time()
    first = len(encode_checkpoint(Checkpoint(0.0, store.take_delta(), {})))
    first_s = time.process_time() - began
    add(stacks // 100, intervals)
    began = time.process_time()
    later = len(encode_checkpoint(Checkpoint(0.0, store.take_delta(), {})))
    later_s = time.process_time() - began
    return {"first_bytes": first, "first_cpu_s": first_s, "later_bytes": later, "later_cpu_s": later_s}


def report(runs: list[Run], killed: dict[str, float], args: argparse.Namespace, command: str) -> str:
    base = next((r for r in runs if r.period == 0), None)
    lines = [
        "# Cost of the checkpoint journal (`profiler run --checkpoint`), and `profiler recover` after a SIGKILL",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{command}`",
        "",
        f"Machine: {machine_facts()}.",
        "",
        f"Workload: bench/OpsLoop.java, {args.threads} thread(s), -XX:+PreserveFramePointer; one `profiler run "
        f"--pid` window of {args.window:g} s at 99 Hz per period, the perf map refreshed every 60 s (default).",
        "",
        "| --checkpoint | samples | distinct stacks | profiler CPU s (window) | checkpoints | their CPU s | "
        "their wall s (fsync incl.) | CPU per checkpoint ms | journal bytes | bytes per checkpoint | "
        "checkpoint CPU share of one core |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        per = run.checkpoint_cpu_s / run.checkpoints * 1000 if run.checkpoints else 0.0
        size = run.journal_bytes / run.checkpoints if run.checkpoints else 0.0
        lines.append(
            f"| {run.period:g}{' (none)' if run.period == 0 else ''} | {run.samples} | {run.distinct_stacks} | "
            f"{run.profiler_cpu_s:.3f} | {run.checkpoints} | {run.checkpoint_cpu_s:.4f} | "
            f"{run.checkpoint_wall_s:.4f} | {per:.2f} | {run.journal_bytes} | {size:.0f} | "
            f"{100 * run.checkpoint_cpu_s / args.window:.3f} % |"
        )
    if base is not None:
        lines += ["", f"Profiler CPU over the window without checkpoints: {base.profiler_cpu_s:.3f} s "
                  f"({100 * base.profiler_cpu_s / args.window:.2f} % of one core)."]  # fmt: skip
    lines += [
        "",
        f"Killed run (`--checkpoint {args.kill_period:g}`, SIGKILL halfway through a {args.window:g} s window, then "
        "`profiler recover`; the JVM still runs, so its frames are named the live way):",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {key.replace('_', ' ')} | {value:.1f} |" for key, value in killed.items()),
        "",
        "Samples and distinct stacks differ between rows because the machine is shared (the JVM gets less CPU "
        "under load); the checkpoint columns are the runner's own measurement of its checkpoints (thread CPU "
        "time and wall time around taking, encoding, appending and fdatasync), read from overhead.json.",
        "",
        "The first checkpoint carries every distinct stack seen so far, each later one only the stacks new since "
        "and the count deltas, so the journal grows with distinct stacks and touched counters, not with samples.",
    ]
    big = synthetic(50_000, 60, 30)
    lines += [
        "",
        "Synthetic Spark-sized store (50,000 distinct 60-frame stacks over 30 slices, a JVM's worth of leaf "
        "addresses; pure encoding, zlib level 1, no I/O): first checkpoint "
        f"{big['first_bytes'] / 2**20:.1f} MiB in {big['first_cpu_s']:.2f} CPU s; a later one with 1 % new stacks "
        f"{big['later_bytes'] / 2**10:.0f} KiB in {big['later_cpu_s']:.3f} CPU s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per profiler window (60)")
    parser.add_argument("--periods", default="0,30,5,1", help="--checkpoint values to measure (0,30,5,1)")
    parser.add_argument("--kill-period", type=float, default=5.0, help="--checkpoint of the killed run (5)")
    parser.add_argument("--threads", type=int, default=1, help="OpsLoop threads (1: keep the machine usable)")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write {DOC}")
    args = parser.parse_args(argv)
    command = command_line("bench_checkpoint.py", argv)
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        work = Path(tmp)
        subprocess.run([shutil.which("javac") or "javac", "-d", str(work), str(WORKLOAD)], check=True)
        jvm = OpsJvm(work, args.threads)
        try:
            time.sleep(5)  # JIT warm-up
            runs = []
            for period in (float(p) for p in args.periods.split(",")):
                runs.append(measured_run(jvm, work, args.window, period))
                print(runs[-1], flush=True)
            killed = killed_run(jvm, work, args.window, args.kill_period)
            print(killed, flush=True)
        finally:
            jvm.stop()
    return publish(report(runs, killed, args, command), DOC, args.no_write)


if __name__ == "__main__":
    sys.exit(main())
