"""Cost of `profiler run --off-cpu` on a workload with many context switches, against the same run without it.

A warmed-up JVM (bench/PingPongRate.java: pairs of threads handing a token over with park/unpark) runs
interleaved windows: base (no profiler), on-CPU only (`profiler run --pid`), on-CPU + `--off-cpu`, ...
The slowdown of a window is 1 - its hand-offs per second / the mean of the base windows; the median over
rounds is the result. Also hand-offs per CPU-second of the JVM (insensitive to how much CPU other jobs
left it), context switches per second, and the profiler's own CPU and kernel BPF time (overhead.json).

With --work N each player computes N rounds of a xorshift before each hand-off (a pipeline's stages do
some CPU work per switch; 0, the default, is nothing but hand-offs, the worst case for a tracer that runs at
every switch).

usage: .venv/bin/python bench/bench_offcpu.py [--rounds N] [--window S] [--pairs N] [--work N] [--conditions A,B]
       [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from profiler.capture.read import read_meta, read_overhead  # noqa: E402

WORKLOAD = Path(__file__).resolve().parent / "PingPongRate.java"
DOC = REPO / "docs" / "benchmarks" / "offcpu.md"
# condition -> extra `profiler run` arguments (None: no profiler)
CONDITIONS: dict[str, list[str] | None] = {
    "base": None,
    "on-cpu": [],
    "off-cpu": ["--off-cpu"],
    "off-cpu 1/10": ["--off-cpu", "--off-cpu-sample-every", "10"],
    "off-cpu 1/100": ["--off-cpu", "--off-cpu-sample-every", "100"],
    "off-cpu 1/1000": ["--off-cpu", "--off-cpu-sample-every", "1000"],  # ~ the program's floor: no walks
    # the same program with a sleeping process in the scope instead of the JVM: every switch of the host
    # is someone else's, the floor that all other work on a profiled host pays
    "off-cpu elsewhere": ["--off-cpu"],
}
ELSEWHERE = {"off-cpu elsewhere"}
Reading = tuple[float, int, float, int]  # monotonic time, hand-offs, JVM CPU seconds, context switches


@dataclass(frozen=True)
class Window:
    condition: str
    round: int
    handoffs_per_s: float
    handoffs_per_cpu_s: float
    switches_per_s: float
    profiler_cpu_s: float = 0.0
    bpf_cpu_s: float = 0.0  # kernel time in the profiler's BPF programs, per `window` seconds of its window
    load: float = 0.0  # the host's 1-minute load average at the window's end
    bpf_us_per_run: float = 0.0  # mean run time of the profiler's BPF programs (the tracer runs at every switch)


class Jvm:
    def __init__(self, classes: Path, pairs: int, work: int = 0, frame_pointers: bool = True) -> None:
        java = Path(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")) / "bin" / "java"
        argv = [
            str(java),
            *(["-XX:+PreserveFramePointer"] if frame_pointers else []),
            "-Xmx64m",
            "-cp",
            str(classes),
            "com.example.PingPongRate",
            "--pairs",
            str(pairs),
            "--work",
            str(work),
        ]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "READY"
        self.pid = self.process.pid

    def handoffs(self) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def context_switches(self) -> tuple[int, int]:
        """Its threads' voluntary context switches and all of them (from /proc/PID/task/*/status)."""
        voluntary = total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                lines = (task / "status").read_text().splitlines()
            except OSError:
                continue  # a thread that ended
            for line in lines:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    count = int(line.split()[1])
                    total += count
                    voluntary += count if line.startswith("voluntary") else 0
        return voluntary, total

    def switches(self) -> int:
        return self.context_switches()[1]

    def reading(self) -> Reading:
        return time.monotonic(), self.handoffs(), self.cpu_seconds(), self.switches()

    def close(self) -> None:
        self.process.kill()
        self.process.wait(30)


@contextmanager
def warm_jvm(scratch: Path, pairs: int, work: int = 0, frame_pointers: bool = True) -> Iterator[Jvm]:
    """PingPongRate compiled into ``scratch``, started with ``pairs`` thread pairs doing ``work`` xorshift rounds
    per hand-off (with -XX:+PreserveFramePointer unless ``frame_pointers`` is false), and warmed up; killed after."""
    javac = Path(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")) / "bin" / "javac"
    subprocess.run([str(javac), "-d", str(scratch / "classes"), str(WORKLOAD)], check=True, timeout=180)
    jvm = Jvm(scratch / "classes", pairs, work, frame_pointers)
    try:
        time.sleep(3)  # JIT warm-up
        yield jvm
    finally:
        jvm.close()


def _wait_state(
    status: Path, state: str, profiler: subprocess.Popen[str], timeout: float = 300, or_after: tuple[str, ...] = ()
) -> None:
    """Until the status file says ``state`` (or one of ``or_after``, the states that follow it). The file is read
    before the exit is checked: a short capture's profiler may write, say "done" and exit between two polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = profiler.poll() is not None
        try:
            if json.loads(status.read_text())["state"] in (state, *or_after):
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        if exited:
            raise RuntimeError(f"profiler exited early: {profiler.stderr.read() if profiler.stderr else ''}")
        time.sleep(0.05)
    raise RuntimeError(f"profiler never reached {state!r}")


WINDOW_ENDED = ("done",)  # or_after for "writing": the window has ended either way


@contextmanager
def profiler_run(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """`profiler run` (``argv``) started from the tree for the block; then waited for (killed if the block
    failed), and a failed exit raised with its last line."""
    agent = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield agent
        _, stderr = agent.communicate(timeout=600)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
    if agent.returncode != 0:
        raise RuntimeError(f"profiler run failed: {stderr.strip().splitlines()[-1:]}")


def _no_spes(scratch: Path) -> Path:
    """A known_spes.txt that finds nothing: only the bench's JVM (--pid) is in the scope, not other jobs' JVMs."""
    path = scratch / "no_spes.txt"
    path.write_text("# bench_offcpu: the scope is --pid only\nbench workload none com.example.NoSuchMainClass\n")
    return path


def measure(jvm: Jvm, condition: str, round_no: int, window: float, scratch: Path, sleeper: int) -> Window:
    """One window of ``condition``; ``sleeper``: the PID profiled instead of the JVM's (ELSEWHERE)."""
    extra = CONDITIONS[condition]
    if extra is None:
        start = jvm.reading()
        time.sleep(window)
        return _window(condition, round_no, start, jvm.reading())
    name = condition.replace(" ", "").replace("/", "_")
    out, status = scratch / f"cap-{name}-{round_no}", scratch / f"status-{name}-{round_no}.json"
    argv = [
        sys.executable,
        "-m",
        "profiler",
        "run",
        "--duration",
        str(window),
        "--out",
        str(out),
        "--pid",
        str(sleeper if condition in ELSEWHERE else jvm.pid),
        "--known-spes",
        str(_no_spes(scratch)),
        "--status-file",
        str(status),
        "--checkpoint",
        "0",
        "--force",
        *extra,
    ]
    with profiler_run(argv) as profiler:
        _wait_state(status, "sampling", profiler)
        start = jvm.reading()
        _wait_state(status, "writing", profiler, or_after=WINDOW_ENDED)
        end = jvm.reading()
    overhead = read_overhead(out)
    assert overhead is not None
    # per second of the profiler's own window: a starved profiler's window runs past --duration
    bpf = (overhead.bpf_run_time_ns or 0) / 1e9 / max(read_meta(out).duration, 1e-3) * window
    result = _window(condition, round_no, start, end)
    per_run = (overhead.bpf_run_time_ns or 0) / 1e3 / max(overhead.bpf_run_count or 0, 1)
    return replace(result, profiler_cpu_s=overhead.profiler_cpu_seconds, bpf_cpu_s=bpf, bpf_us_per_run=per_run)


def _window(condition: str, round_no: int, start: Reading, end: Reading) -> Window:
    seconds, cpu = end[0] - start[0], end[2] - start[2]
    handoffs = end[1] - start[1]
    per_cpu = handoffs / cpu if cpu > 0 else 0.0
    switches = (end[3] - start[3]) / seconds
    return Window(condition, round_no, handoffs / seconds, per_cpu, switches, load=os.getloadavg()[0])


def paired_cost(windows: list[Window], condition: str, against: str = "on-cpu") -> tuple[float, float, int] | None:
    """``condition``'s own cost over ``against`` per JVM CPU-second, paired by round (the two windows of a
    round are adjacent, so the host's drift between rounds cancels): mean, standard error, rounds. None with
    fewer than two rounds that have both."""
    per_round = {(w.condition, w.round): w.handoffs_per_cpu_s for w in windows}
    costs = [
        1 - per_round[(condition, r)] / per_round[(against, r)]
        for r in sorted({w.round for w in windows})
        if per_round.get((against, r)) and (condition, r) in per_round
    ]
    if len(costs) < 2:
        return None
    return statistics.mean(costs), statistics.stdev(costs) / len(costs) ** 0.5, len(costs)


def summarize(windows: list[Window], conditions: list[str]) -> dict[str, dict[str, float]]:
    """Per condition: median hand-offs/s and per CPU-s, median slowdown against the base windows and its
    spread over the rounds (min, max), CPU costs."""
    base = [w for w in windows if w.condition == "base"]
    base_rate = statistics.mean(w.handoffs_per_s for w in base)
    base_per_cpu = statistics.mean(w.handoffs_per_cpu_s for w in base)
    summary = {}
    for condition in conditions:
        mine = [w for w in windows if w.condition == condition]
        per_s = [1 - w.handoffs_per_s / base_rate for w in mine]
        per_cpu = [1 - w.handoffs_per_cpu_s / base_per_cpu for w in mine]
        summary[condition] = {
            "handoffs_per_s": statistics.median(w.handoffs_per_s for w in mine),
            "switches_per_s": statistics.median(w.switches_per_s for w in mine),
            "slowdown": statistics.median(per_s),
            "slowdown_min": min(per_s),
            "slowdown_max": max(per_s),
            "slowdown_per_cpu": statistics.median(per_cpu),
            "slowdown_per_cpu_min": min(per_cpu),
            "slowdown_per_cpu_max": max(per_cpu),
            "profiler_cpu_s": statistics.median(w.profiler_cpu_s for w in mine),
            "bpf_cpu_s": statistics.median(w.bpf_cpu_s for w in mine),
            "bpf_us_per_run": statistics.median(w.bpf_us_per_run for w in mine),
        }
    return summary


def _pct(summary: dict[str, float], key: str) -> str:
    return f"{100 * summary[key]:+.1f} % ({100 * summary[key + '_min']:+.1f} … {100 * summary[key + '_max']:+.1f})"


def report(summary: dict[str, dict[str, float]], args: argparse.Namespace, windows: list[Window]) -> str:
    conditions = list(summary)
    loads = [w.load for w in windows]
    lines = [
        "# Off-CPU tracing cost (`bench/bench_offcpu.py`)",
        "",
        f"Command: `.venv/bin/python bench/bench_offcpu.py --rounds {args.rounds} --window {args.window:g} "
        f"--pairs {args.pairs} --work {args.work} --conditions {','.join(c.replace(' ', '_') for c in conditions)}`; "
        f"host "
        f"{platform.node()}, kernel {platform.release()}, {os.cpu_count()} CPUs, shared with other jobs while it "
        f"ran: load average (1 min) {min(loads):.0f}–{max(loads):.0f} over the windows.",
        "",
        "Workload: bench/PingPongRate.java, thread pairs handing a token over with park/unpark (every hand-off"
        f" is a futex wait and wake), {args.work} xorshift rounds of work before each hand-off. Windows interleaved ("
        + " / ".join(conditions)
        + "), each condition once per round; medians over rounds, (min … max) the spread."
        " Slowdown against the mean of the base windows."
        " The fair comparison for --off-cpu is against on-CPU only (the profiler's start-up, perf-map dumps and"
        " sampling are in both).",
        "",
        "| condition | hand-offs/s | context switches/s | slowdown (per s) | slowdown (per JVM CPU-s) |"
        " profiler CPU s / window | BPF CPU s / window | BPF µs / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for condition in conditions:
        s = summary[condition]
        lines.append(
            f"| {condition} | {s['handoffs_per_s']:,.0f} | {s['switches_per_s']:,.0f} | {_pct(s, 'slowdown')} |"
            f" {_pct(s, 'slowdown_per_cpu')} | {s['profiler_cpu_s']:.2f} | {s['bpf_cpu_s']:.2f} |"
            f" {s['bpf_us_per_run']:.2f} |"
        )
    paired = [(c, paired_cost(windows, c)) for c in conditions if c.startswith("off-cpu") and "on-cpu" in conditions]
    rows = [(c, cost) for c, cost in paired if cost is not None]
    if rows:
        title = "Own cost over on-CPU sampling alone, per JVM CPU-s, paired by round (mean ± standard error):"
        lines += ["", title, ""]
        lines += [f"- {c}: {100 * m:+.2f} % ± {100 * e:.2f} ({n} rounds)" for c, (m, e, n) in rows]
    lines += [
        "",
        "Windows (condition, round, hand-offs/s, per JVM CPU-s, switches/s, profiler CPU s, BPF CPU s, load):",
        "",
    ]
    lines += [
        f"- {w.condition} {w.round}: {w.handoffs_per_s:,.0f}, {w.handoffs_per_cpu_s:,.0f}, {w.switches_per_s:,.0f},"
        f" {w.profiler_cpu_s:.2f}, {w.bpf_cpu_s:.2f}, {w.bpf_us_per_run:.2f}, {w.load:.0f}"
        for w in windows
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--work", type=int, default=0, help="xorshift rounds per hand-off (0: hand-offs only)")
    parser.add_argument(
        "--conditions", default=",".join(c.replace(" ", "_") for c in CONDITIONS),
        help="comma-separated, '_' for ' ' (base is always measured): " + ", ".join(CONDITIONS),
    )  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help=f"print only, do not write {DOC}")
    args = parser.parse_args()
    conditions = ["base"] + [c.replace("_", " ") for c in args.conditions.split(",") if c and c != "base"]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        parser.error(f"--conditions: unknown {unknown[0]!r}; choose from {', '.join(CONDITIONS)}")
    with tempfile.TemporaryDirectory(prefix="bench-offcpu-") as scratch_name:
        scratch = Path(scratch_name)
        sleeper = subprocess.Popen(["sleep", "86400"])
        try:
            with warm_jvm(scratch, args.pairs, args.work) as jvm:
                windows = [
                    measure(jvm, condition, round_no, args.window, scratch, sleeper.pid)
                    for round_no in range(args.rounds)
                    for condition in conditions
                ]
        finally:
            sleeper.kill()
            sleeper.wait(30)
    text = report(summarize(windows, conditions), args, windows)
    print(text)
    if not args.no_write:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
