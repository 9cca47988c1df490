"""The BPF walker's cost with Python frames: busy CPython workers sampled at 99 Hz by `profiler run`, the BPF
time per sample and the agent's CPU in % of a core (issue 52: "≤ 1 % of a core at 99 Hz").

The workers are tests/workloads/py_split.py (three functions burning CPU forever, ~50 Python frames deep at
most), one per CPython found (--workers each): the venv's and pyenv's 3.13.0 where installed, so both layouts'
walks (3.11's tstate_current, 3.13's thread list and shim frames) are in the figure. Nothing else is in the
scope (a known_spes file that finds nothing, the workers by --pid).

Conditions, interleaved per round: "bpf" (the default: our walker, the Python frames spliced in) and "kernel"
(`--stack-walk kernel`: bpf_get_stack, frame pointers only, no Python frames): `profiler run` has no switch for
the Python frames alone, so "kernel" is the floor of sampling without any user-space walk, not the walker
less its Python step. Each window is --settle + --window seconds of the agent's sampling; the agent's CPU is
read from overhead.json's timeline from --settle on (its once-per-process preparation: the ELF symbols, the
layout check, the CFI tables, is before), the BPF time from its statistics (kernel.bpf_stats_enabled 1 s in 10,
scaled to the window) per sample taken. Each "bpf" window also says the share of the workers' samples holding
a named Python frame (0 % means the Python step did not run: the figure would not be the walker's).

Run as root, alone on the host for a figure that means anything:
    .venv/bin/python bench/bench_python_walker.py --rounds 3 --window 20
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_offcpu import WINDOW_ENDED, _no_spes, _wait_state, profiler_run  # noqa: E402
from bench_offcpu_walker import cpu_since, uptime  # noqa: E402
from bench_overhead import command_line, publish  # noqa: E402

from profiler.capture.read import read_meta, read_overhead, read_pid_table, read_sampler_stats  # noqa: E402

DOC = REPO / "docs" / "benchmarks" / "python-walker.md"
WORKLOAD = REPO / "tests" / "workloads" / "py_split.py"
PYENV_313 = Path("~/.pyenv/versions/3.13.0/bin/python3.13").expanduser()
CONDITIONS = {"bpf": [], "kernel": ["--stack-walk", "kernel"]}
PYTHON_FRAME = re.compile(r"^\S+ \(\S+:\d+\)$")  # module.qualname (file:line)
GOAL_PERCENT = 1.0  # of a core, at 99 Hz


@dataclass(frozen=True)
class Window:
    condition: str
    round_no: int
    seconds: float  # the measured part (after --settle)
    samples: int  # the workers' samples over the agent's whole window
    agent_cpu_s: float  # the agent's CPU in the measured part
    bpf_ns: int  # its BPF programs' run time over the whole window (scaled from the statistics' slices)
    whole_seconds: float  # the agent's whole window (--settle included), the span of bpf_ns and samples
    bpf_runs: int
    named_share: float  # of the workers' samples, those holding a named Python frame
    load: float

    @property
    def agent_percent(self) -> float:
        return 100 * self.agent_cpu_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def bpf_percent(self) -> float:
        """The BPF programs' time in % of a core: spent in the sampled processes' interrupts, not the agent's."""
        return 100 * self.bpf_ns / 1e9 / self.whole_seconds if self.whole_seconds > 0 else 0.0

    @property
    def bpf_us_per_sample(self) -> float:
        return self.bpf_ns / 1e3 / self.samples if self.samples else 0.0


def interpreters() -> list[str]:
    """The venv's CPython and pyenv's 3.13.0 where installed (each once)."""
    found = [os.path.realpath(sys.executable)]
    if PYENV_313.exists() and os.path.realpath(PYENV_313) not in found:
        found.append(os.path.realpath(PYENV_313))
    return found


@contextmanager
def busy_workers(pythons: list[str], each: int) -> Iterator[list[int]]:
    """``each`` py_split.py processes per interpreter, burning CPU until the block ends; their pids."""
    processes: list[subprocess.Popen[str]] = []
    try:
        for python in pythons:
            for _ in range(each):
                process = subprocess.Popen(
                    [python, "-u", str(WORKLOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                processes.append(process)
                if process.stdout is None or process.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"{python} {WORKLOAD}: no 'ready' line")
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait(30)


def named_share(out: Path, pids: list[int]) -> float:
    """Of the workers' samples in the capture, the share whose stack holds a named Python frame."""
    total = named = 0
    for pid in pids:
        table = read_pid_table(out, pid)
        if table is None:
            continue
        text = table.stack_text(table.frame_texts())
        for stack_id, count in zip(table.stack_ids, table.counts, strict=True):
            total += count
            if any(PYTHON_FRAME.match(frame) for frame in text(stack_id).split(";")):
                named += count
    return named / total if total else 0.0


def measure(condition: str, round_no: int, pids: list[int], args: argparse.Namespace, scratch: Path) -> Window:
    """One `profiler run --pid ...` window of ``condition``."""
    out, status = scratch / f"cap-{condition}-{round_no}", scratch / f"status-{condition}-{round_no}.json"
    argv = [
        sys.executable, "-m", "profiler", "run", "--duration", str(args.settle + args.window), "--out", str(out),
        "--frequency", str(args.frequency), "--known-spes", str(_no_spes(scratch)), "--status-file", str(status),
        "--checkpoint", "0", "--force", *(f"--pid={pid}" for pid in pids), *CONDITIONS[condition],
    ]  # fmt: skip
    with profiler_run(argv) as agent:
        _wait_state(status, "sampling", agent)
        _wait_state(status, "writing", agent, or_after=WINDOW_ENDED)
    overhead, meta = read_overhead(out), read_meta(out)
    samples = sum(s.samples for pid in pids if (s := read_sampler_stats(out, pid)) is not None)
    measured = max(meta.duration - args.settle, 1e-3)
    return Window(
        condition=condition,
        round_no=round_no,
        seconds=measured,
        samples=samples,
        agent_cpu_s=cpu_since(overhead.timeline, args.settle) if overhead else 0.0,
        bpf_ns=(overhead.bpf_run_time_ns or 0) if overhead else 0,
        bpf_runs=(overhead.bpf_run_count or 0) if overhead else 0,
        whole_seconds=max(meta.duration, 1e-3),
        named_share=named_share(out, pids) if condition == "bpf" else 0.0,
        load=os.getloadavg()[0],
    )


def report(windows: list[Window], command: str, pythons: list[str], uptimes: tuple[str, str]) -> str:
    lines = [
        "# The BPF walker's cost with Python frames (bench/bench_python_walker.py)",
        "",
        f"Command: `{command}`",
        f"Workers: tests/workloads/py_split.py on {', '.join(pythons)}",
        f"Load: `uptime` before: {uptimes[0]}; after: {uptimes[1]}",
        "",
        "| condition | round | measured s | samples | agent CPU % of a core | BPF % of a core | BPF µs / sample |"
        " BPF µs / run | named Python | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in windows:
        per_run = w.bpf_ns / 1e3 / w.bpf_runs if w.bpf_runs else 0.0
        named = f"{100 * w.named_share:.1f} %" if w.condition == "bpf" else "–"
        lines.append(
            f"| {w.condition} | {w.round_no} | {w.seconds:.1f} | {w.samples:,} | {w.agent_percent:.2f} |"
            f" {w.bpf_percent:.3f} | {w.bpf_us_per_sample:.2f} | {per_run:.2f} | {named} | {w.load:.1f} |"
        )
    lines += [
        "",
        "BPF µs / sample: the BPF programs' whole time over the workers' samples (the perf event fires on every"
        " CPU at --frequency, for any process; the runs of other processes are filtered early and counted here);"
        " BPF µs / run: per program run. BPF % of a core is spent in the sampled processes' interrupts, beside"
        " the agent's own CPU. Samples vary with the CPU other jobs leave the workers.",
        "",
    ]
    for condition in CONDITIONS:
        chosen = [w for w in windows if w.condition == condition]
        if not chosen:
            continue
        percent = [w.agent_percent for w in chosen]
        lines.append(
            f"- {condition}: agent CPU {min(percent):.2f} / {statistics.median(percent):.2f} / {max(percent):.2f} % "
            f"of a core (min / median / max), BPF {statistics.median(w.bpf_us_per_sample for w in chosen):.2f} µs "
            f"per sample and {statistics.median(w.bpf_percent for w in chosen):.3f} % of a core (medians)"
            + (f"; the goal ≤ {GOAL_PERCENT:g} %: {'met' if max(percent) <= GOAL_PERCENT else 'NOT met'}"
               if condition == "bpf" else "")
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each one window per condition (3)")
    parser.add_argument("--window", type=float, default=20.0, help="measured seconds per window (20)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of each window before it is measured (5)")
    parser.add_argument("--frequency", type=int, default=99, help="samples per second per CPU (99)")
    parser.add_argument("--workers", type=int, default=1, help="busy workers per CPython (1)")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write {DOC}")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.window <= 0 or args.settle < 0 or args.workers < 1:
        parser.error("--rounds and --workers must be at least 1, --window positive and --settle not negative")
    if os.geteuid() != 0:
        parser.error("run as root: `profiler run` loads eBPF")
    before = uptime()
    print(f"uptime: {before}", flush=True)
    pythons = interpreters()
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="bench-python-walker-") as name, busy_workers(
        pythons, args.workers
    ) as pids:
        time.sleep(1.0)  # the workers past their imports
        for round_no in range(args.rounds):
            for condition in CONDITIONS:
                window = measure(condition, round_no, pids, args, Path(name))
                windows.append(window)
                print(
                    f"round {round_no} {condition}: agent {window.agent_percent:.2f} % of a core, "
                    f"BPF {window.bpf_us_per_sample:.2f} µs/sample over {window.samples} samples, "
                    f"named Python {100 * window.named_share:.1f} %, load {window.load:.1f}",
                    flush=True,
                )
    return publish(report(windows, command_line("bench_python_walker.py", argv), pythons, (before, uptime())),
                   DOC, args.no_write)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
