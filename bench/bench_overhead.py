"""Overhead of `profiler run` at 99 Hz on a CPU-bound JVM, against no profiling and `perf record -F 99 -g`.

Interleaved windows on one warmed-up JVM (bench/OpsLoop.java): base, profiler, base, perf, ... ; the
loss of a profiled window is 1 - its throughput / the mean of the base windows around it; the median
over rounds is the result. Also the profiler's own CPU, kernel BPF time, post-run time and peak RSS.

usage: .venv/bin/python bench/bench_overhead.py [--quick] [--rounds N] [--window S] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from profiler.capture.read import read_overhead  # noqa: E402

WORKLOAD = Path(__file__).resolve().parent / "OpsLoop.java"
DOC = REPO / "docs" / "benchmarks" / "overhead.md"
PROFILE_TEXT = "Work: OpsLoop\n"  # one task; the matcher's cost is part of the post-run time


@dataclass(frozen=True)
class Window:
    condition: str  # "base", "profiler" or "perf"
    round: int
    units_per_s: float
    tool_cpu_s: float = 0.0  # CPU of the profiling tool's process tree during the window
    bpf_cpu_s: float = 0.0  # kernel time in the BPF programs during the window (profiler only)
    post_run_s: float = 0.0
    peak_rss_mb: float = 0.0
    workload_cpu_s: float = 0.0  # CPU the JVM got during the window

    @property
    def units_per_cpu_s(self) -> float:
        """Work per CPU-second the workload got: insensitive to how much CPU other jobs left it."""
        return self.units_per_s / self.workload_cpu_s if self.workload_cpu_s > 0 else 0.0

    @property
    def cost_ratio(self) -> float:
        """The tool's CPU (process + in-kernel BPF) relative to the workload's CPU in the window."""
        return (self.tool_cpu_s + self.bpf_cpu_s) / self.workload_cpu_s if self.workload_cpu_s else 0.0


class OpsJvm:
    def __init__(self, classes: Path, threads: int, flags: tuple[str, ...] = ("-XX:+PreserveFramePointer",)) -> None:
        java = shutil.which("java") or "java"
        self.process = subprocess.Popen(
            [java, *flags, "-Xmx256m", "-cp", str(classes), "OpsLoop", "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"OpsLoop did not start: {line!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def mark(self) -> tuple[int, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("mark\n")
        self.process.stdin.flush()
        _, units, nanos = self.process.stdout.readline().split()
        return int(units), int(nanos)

    def measure(self, seconds: float) -> tuple[float, float]:
        """(work units per second, CPU seconds of the JVM) over ``seconds``."""
        cpu0 = _tree_cpu(self.pid)
        units0, t0 = self.mark()
        time.sleep(seconds)
        units1, t1 = self.mark()
        cpu1 = _tree_cpu(self.pid)
        return (units1 - units0) / ((t1 - t0) / 1e9), cpu1 - cpu0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        Path(f"/tmp/perf-{self.pid}.map").unlink(missing_ok=True)


def _tree_cpu(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def _wait_status(status: Path, state: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("state") == state:
                return
        except (OSError, ValueError):
            pass
        if process.poll() is not None:
            raise RuntimeError(f"profiler run exited with {process.returncode} before '{state}'")
        time.sleep(0.05)
    raise RuntimeError(f"profiler run not '{state}' after {timeout} s")


def window_with_profiler(
    jvm: OpsJvm, seconds: float, frequency: int, work: Path, rnd: int, extra: list[str] | None = None
) -> Window:
    out = work / f"cap{rnd}"
    status = work / f"status{rnd}.json"
    known_spes = work / "known_spes.txt"
    known_spes.write_text("# matches nothing: only --pid is sampled\nbench  workload  none  no.such.MainClass\n")
    profile = work / "profile.txt"
    profile.write_text(PROFILE_TEXT)
    # The window is a little longer than the measurement so the measurement sits inside it.
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler", "run", "--duration", str(seconds + 2), "--out", str(out), "--force",
         "--pid", str(jvm.pid), "--frequency", str(frequency), "--known-spes", str(known_spes),
         "--profile", str(profile), "--status-file", str(status), "--no-exec-watch", *(extra or [])],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _wait_status(status, "sampling", process, 300)
        time.sleep(0.5)
        cpu0 = _tree_cpu(process.pid)
        rate, jvm_cpu = jvm.measure(seconds)
        cpu1 = _tree_cpu(process.pid)
        _, err = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"profiler run failed ({process.returncode}): {err.decode(errors='replace')[-500:]}")
    overhead = read_overhead(out)
    assert overhead is not None
    window = seconds + 2
    bpf = (overhead.bpf_run_time_ns or 0) / 1e9 * seconds / window
    shutil.rmtree(out, ignore_errors=True)
    return Window("profiler", rnd, rate, cpu1 - cpu0, bpf, overhead.post_run_seconds,
                  overhead.peak_rss_bytes / 2**20, jvm_cpu)


def window_with_perf(jvm: OpsJvm, seconds: float, frequency: int, work: Path, rnd: int) -> Window:
    data = work / f"perf{rnd}.data"
    process = subprocess.Popen(
        ["perf", "record", "-F", str(frequency), "-g", "-p", str(jvm.pid), "-o", str(data), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.5)  # perf attaches within a few hundred ms
        if process.poll() is not None:
            raise RuntimeError(f"perf record exited: {process.stderr.read().decode()[-300:]}")  # type: ignore[union-attr]
        cpu0 = _tree_cpu(process.pid)
        rate, jvm_cpu = jvm.measure(seconds)
        cpu1 = _tree_cpu(process.pid)
        process.send_signal(signal.SIGINT)
        started = time.monotonic()
        process.wait(timeout=120)
        post = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    data.unlink(missing_ok=True)
    return Window("perf", rnd, rate, cpu1 - cpu0, post_run_s=post, workload_cpu_s=jvm_cpu)


def base_window(jvm: OpsJvm, seconds: float, rnd: int) -> Window:
    rate, jvm_cpu = jvm.measure(seconds)
    return Window("base", rnd, rate, workload_cpu_s=jvm_cpu)


def run(args: argparse.Namespace) -> list[Window]:
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        javac = shutil.which("javac") or "javac"
        subprocess.run([javac, "-d", str(work), str(WORKLOAD)], check=True)
        jvm = OpsJvm(work, args.threads)
        try:
            base_window(jvm, args.window, -1)  # settle JIT and caches before the first counted window
            for rnd in range(args.rounds):
                windows.append(base_window(jvm, args.window, rnd))
                windows.append(window_with_profiler(jvm, args.window, args.frequency, work, rnd, args.profiler_arg))
                windows.append(base_window(jvm, args.window, rnd))
                if not args.no_perf:
                    windows.append(window_with_perf(jvm, args.window, args.frequency, work, rnd))
                    windows.append(base_window(jvm, args.window, rnd))
                print(f"round {rnd + 1}/{args.rounds}: "
                      + ", ".join(f"{w.condition} {w.units_per_s:.0f}/s" for w in windows if w.round == rnd),
                      flush=True)
        finally:
            jvm.stop()
    return windows


def losses(windows: list[Window], condition: str, per_cpu: bool = False) -> list[float]:
    """Per profiled window: 1 - throughput / mean of the base windows just before and after it
    (``per_cpu``: work per CPU-second of the workload instead of work per second)."""

    def value(w: Window) -> float:
        return w.units_per_cpu_s if per_cpu else w.units_per_s

    out = []
    for i, w in enumerate(windows):
        if w.condition != condition or value(w) <= 0:
            continue
        neighbours = [value(windows[j]) for j in (i - 1, i + 1)
                      if 0 <= j < len(windows) and windows[j].condition == "base" and value(windows[j]) > 0]
        if neighbours:
            out.append(1.0 - value(w) / statistics.mean(neighbours))
    return out


def machine_facts() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    load = os.getloadavg()
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), kernel {platform.release()}, {java}, "
            f"Python {platform.python_version()}; load average at the end "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")


def report(windows: list[Window], args: argparse.Namespace, command: str) -> str:
    prof = [w for w in windows if w.condition == "profiler"]
    loss_prof = losses(windows, "profiler")
    loss_perf = losses(windows, "perf")

    def pct(values: list[float]) -> str:
        return f"{100 * statistics.median(values):+.2f} %" if values else "n/a"

    def spread(values: list[float]) -> str:
        return f"{100 * min(values):+.2f} … {100 * max(values):+.2f} %" if values else "n/a"

    bases = [w.units_per_s for w in windows if w.condition == "base"]
    noise = [abs(1.0 - b / a) for a, b in zip(bases, bases[1:])]
    bases_cpu = [w.units_per_cpu_s for w in windows if w.condition == "base" and w.units_per_cpu_s > 0]
    noise_cpu = [abs(1.0 - b / a) for a, b in zip(bases_cpu, bases_cpu[1:])]
    cpu_core = [w.tool_cpu_s / args.window for w in prof]
    bpf_core = [w.bpf_cpu_s / args.window for w in prof]
    lines = [
        "# Overhead of `profiler run` (99 Hz) on a CPU-bound JVM",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{command}`",
        "",
        f"Machine: {machine_facts()}.",
        "",
        f"Workload: bench/OpsLoop.java, {args.threads} threads of hash-map/string/arithmetic work units, "
        "-XX:+PreserveFramePointer; throughput = work units per second, read by the JVM itself.",
        f"Method: {args.rounds} rounds of interleaved {args.window:g} s windows on the same warmed-up JVM "
        "(base, profiler, base" + ("" if args.no_perf else ", perf, base") + "); the loss of a profiled window "
        "is 1 − its throughput / the mean of the two base windows around it; the median over rounds is "
        "the result. `profiler run` samples only the workload (`--pid`, a known_spes file that matches nothing else).",
        "",
        "| measure | median | range | goal |",
        "|---|---|---|---|",
        f"| throughput loss with `profiler run --frequency {args.frequency}` | {pct(loss_prof)} | {spread(loss_prof)} "
        "| ≤ 0.5 % |",
    ]
    if loss_perf:
        lines.append(f"| throughput loss with `perf record -F {args.frequency} -g` | {pct(loss_perf)} | "
                     f"{spread(loss_perf)} | (reference) |")
    for label, condition in (("`profiler run`", "profiler"), ("`perf record -g`", "perf")):
        per_cpu = losses(windows, condition, per_cpu=True)
        if per_cpu:
            lines.append(f"| loss of work per workload CPU-second with {label} | {pct(per_cpu)} | "
                         f"{spread(per_cpu)} | ≤ 0.5 % |")
    cpus = os.cpu_count() or 1
    machine_share = [(w.tool_cpu_s + w.bpf_cpu_s) / args.window / cpus for w in prof]
    if machine_share:
        lines.append(f"| `profiler run` CPU (process + in-kernel BPF) as a share of all {cpus} CPUs: the most a "
                     f"CPU-saturated workload can lose to it | {100 * statistics.median(machine_share):.2f} % | "
                     f"{100 * min(machine_share):.2f} … {100 * max(machine_share):.2f} % | ≤ 0.5 % |")
    if noise_cpu:
        lines.append(f"| base-to-base variation of work per CPU-second (noise floor, absolute) | "
                     f"{100 * statistics.median(noise_cpu):.2f} % | {100 * min(noise_cpu):.2f} … "
                     f"{100 * max(noise_cpu):.2f} % | |")
    if noise:
        lines.append(f"| base-to-base variation of throughput (noise floor, absolute) | "
                     f"{100 * statistics.median(noise):.2f} % | "
                     f"{100 * min(noise):.2f} … {100 * max(noise):.2f} % | |")
    if cpu_core:
        lines += [
            f"| profiler process CPU while sampling (share of one core) | {100 * statistics.median(cpu_core):.2f} % | "
            f"{100 * min(cpu_core):.2f} … {100 * max(cpu_core):.2f} % | ≤ 1 % |",
            f"| kernel time in the BPF program (share of one core) | {100 * statistics.median(bpf_core):.3f} % | "
            f"{100 * min(bpf_core):.3f} … {100 * max(bpf_core):.3f} % | |",
            f"| post-run time (symbolize, match, write) | {statistics.median([w.post_run_s for w in prof]):.1f} s | "
            f"{min(w.post_run_s for w in prof):.1f} … {max(w.post_run_s for w in prof):.1f} s | |",
            f"| peak RSS of `profiler run` | {max(w.peak_rss_mb for w in prof):.0f} MB | | ≤ 200 MB |",
        ]
    lines += ["", "Windows:", "", "| round | condition | units/s | workload CPU s | tool CPU s |",
              "|---|---|---|---|---|"]
    lines += [f"| {w.round + 1} | {w.condition} | {w.units_per_s:.0f} | {w.workload_cpu_s:.1f} | {w.tool_cpu_s:.2f} |"
              for w in windows]
    lines += [
        "",
        "Caveat: the machine is shared (other jobs run at the same time, see the load average), so "
        "single windows vary by several percent; the interleaving and the median are there to cancel "
        "drift, not noise. A throughput loss smaller than the base-to-base variation is not measurable "
        "that way. Two rows do not depend on how much CPU other jobs leave the workload: the work per "
        "CPU-second the workload got (the in-context cost of sampling, BPF stack walks included, lands "
        "there), and the tool's own CPU (its process tree plus the kernel time of its BPF program from "
        "kernel.bpf_stats_enabled) as a share of the machine, which is what it can take from a workload "
        "that saturates every CPU.",
        "",
    ]
    return "\n".join(lines)


def command_line(script: str, argv: list[str] | None) -> str:
    """How the benchmark was run, for its results page."""
    return " ".join([f"python bench/{script}", *(argv if argv is not None else sys.argv[1:])]).strip()


def publish(text: str, doc: Path, no_write: bool) -> int:
    """Print a benchmark's results page and write it to ``doc`` (unless --no-write); main()'s end."""
    print(text)
    if not no_write:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
        print(f"wrote {doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 s windows")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--window", type=float, default=None, help="seconds per window")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frequency", type=int, default=99)
    parser.add_argument("--no-perf", action="store_true", help="skip the perf record comparison")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write {DOC}")
    parser.add_argument(
        "--profiler-arg", action="append", default=[], help="extra option of profiler run (repeatable), "
        "e.g. --profiler-arg=--stack-walk=kernel"
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.window = args.window or (10.0 if args.quick else 20.0)
    if os.geteuid() != 0:
        print("bench_overhead: needs root (eBPF, perf)", file=sys.stderr)
        return 3
    command = command_line("bench_overhead.py", argv)
    windows = run(args)
    return publish(report(windows, args, command), DOC, args.no_write)


if __name__ == "__main__":
    sys.exit(main())
