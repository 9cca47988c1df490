"""Slowdown of a workload doing >= 50,000 context switches a second under `profiler run --off-cpu` at the
defaults (the walker in the switch-out path), against the same workload with no agent: issue 50's "≤ 1 %
slowdown at ≥ 50,000 switches/s".

The workload is bench/PingPongRate.java: thread pairs handing a token over with park/unpark (every hand-off
is a futex wait and wake, a voluntary context switch), each player computing --work xorshift rounds before
its hand-off. The JVM runs without -XX:+PreserveFramePointer (as issue 50 has it), so a blocked thread's Java
frames come only from the walker (HotSpot's code cache and interpreter, CFI for glibc and libjvm).

Windows are interleaved in pairs, A B, B A, A B ... (the JVM's rate drifts through a run): A, no agent (the JVM
alone for --window seconds); B,
`profiler run --pid JVM --off-cpu` (plus --profiler-arg's), its sampling window of --window seconds (the
agent's start-up and post-run are outside it). A pair's slowdown is 1 - B's hand-offs per second / A's; the
result is the min / median / max over the pairs (and the mean ± standard error). Also per JVM CPU-second
(insensitive to the CPU other jobs leave the JVM). The switch rate is the JVM's threads'
voluntary_ctxt_switches (and all context switches) from /proc/PID/task/*/status over each window.

In each B window the capture is checked: the share of the ping-pong threads' blocked time whose stack holds
the Java frame `PingPongRate$Pair::play` below the wait (only the walker finds it: no frame pointers, no perf
map); 0 % means the walker was not in the switch-out path (meta.json's warnings are printed). Also the
agent's own CPU and its BPF programs' kernel time (overhead.json).

The goal's rate is checked, not assumed: a window whose JVM made fewer than 50,000 voluntary context switches a
second is marked BELOW in its line and the table, and the bench exits with status 2 after its report (the
default --work 6500 gave ~60,000 alone on the 2-CPU host: 48,357 at 8000, 64,300 at 6000, load 3.7).

Run as root (the agent loads eBPF), alone on the host for a figure that means anything:
    .venv/bin/python bench/bench_offcpu_walker.py --pairs 10 --window 20
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_offcpu import WINDOW_ENDED, Jvm, _no_spes, _wait_state, profiler_run, warm_jvm  # noqa: E402

from profiler.bpf.stats import STATS_SYSCTL  # noqa: E402
from profiler.capture.format import OverheadPoint  # noqa: E402
from profiler.capture.read import read_meta, read_overhead  # noqa: E402

GOAL_SWITCHES = 50_000  # context switches a second the goal is stated at (the JVM's voluntary ones)
BELOW = f"BELOW {GOAL_SWITCHES:,} voluntary switches/s"  # marks a window short of the goal's rate
DEFAULT_WORK = 6500  # xorshift rounds per hand-off: ~60,000 voluntary switches/s alone on 2 CPUs
WALKED_FRAME = "PingPongRate$Pair::play"  # a Java frame under the wait: only a walk of the Java stack has it


@dataclass(frozen=True)
class Reading:
    at: float  # monotonic seconds
    handoffs: int
    cpu_s: float  # the JVM's user + system CPU seconds
    voluntary: int  # its threads' voluntary context switches
    switches: int  # all its threads' context switches


@dataclass(frozen=True)
class Window:
    agent: bool
    pair: int
    seconds: float
    handoffs_per_s: float
    handoffs_per_cpu_s: float
    voluntary_per_s: float
    switches_per_s: float
    load: float  # 1-minute load average at the window's end
    agent_cpu_s: float = 0.0  # the agent's CPU seconds in its window
    bpf_cpu_s: float = 0.0  # its BPF programs' kernel time in the window (scaled from the statistics' slices)
    bpf_us_per_run: float = 0.0
    walked_share: float = 0.0  # of the ping-pong threads' blocked time, the part whose stack holds WALKED_FRAME
    warnings: tuple[str, ...] = ()
    programs: tuple[tuple[str, float, float], ...] = ()  # --per-program: (name, ns per run, runs per second)
    components: tuple[tuple[str, float], ...] = ()  # the agent's CPU seconds in the window by component, largest first
    agent_cpu_measured_s: float = 0.0  # of agent_cpu_s, the part in the measured window (after --settle)
    # the agent's whole sampling window, --settle included (its start-up work: tables parsed, threads named)
    whole_handoffs_per_s: float = 0.0
    whole_handoffs_per_cpu_s: float = 0.0


def read_jvm(jvm: Jvm) -> Reading:
    """The JVM's hand-offs, CPU and its threads' context switches now."""
    voluntary, total = jvm.context_switches()
    return Reading(time.monotonic(), jvm.handoffs(), jvm.cpu_seconds(), voluntary, total)


def window_of(agent: bool, pair: int, start: Reading, end: Reading) -> Window:
    seconds = end.at - start.at
    handoffs, cpu = end.handoffs - start.handoffs, end.cpu_s - start.cpu_s
    return Window(
        agent=agent,
        pair=pair,
        seconds=seconds,
        handoffs_per_s=handoffs / seconds,
        handoffs_per_cpu_s=handoffs / cpu if cpu > 0 else 0.0,
        voluntary_per_s=(end.voluntary - start.voluntary) / seconds,
        switches_per_s=(end.switches - start.switches) / seconds,
        load=os.getloadavg()[0],
    )


def walked_share(folded: Path) -> float:
    """Of the ping-pong threads' blocked nanoseconds in offcpu.folded (``cause ns switches stack``, the
    thread's name first), the share whose stack holds WALKED_FRAME; 0.0 without any."""
    blocked = walked = 0
    if not folded.is_file():
        return 0.0
    for line in folded.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4 or not parts[3].startswith("pingpong-"):
            continue
        blocked += int(parts[1])
        if WALKED_FRAME in parts[3]:
            walked += int(parts[1])
    return walked / blocked if blocked else 0.0


def without_agent(jvm: Jvm, pair: int, seconds: float) -> Window:
    start = read_jvm(jvm)
    time.sleep(seconds)
    return window_of(False, pair, start, read_jvm(jvm))


def agent_programs(pid: int) -> dict[int, tuple[int, int]]:
    """BPF program id -> (run_time_ns, run_cnt) of the programs process ``pid`` holds (its fdinfo)."""
    found: dict[int, tuple[int, int]] = {}
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if "prog_id" in fields and "run_cnt" in fields:
            found[int(fields["prog_id"])] = (int(fields["run_time_ns"]), int(fields["run_cnt"]))
    return found


def program_names() -> dict[int, str]:
    shown = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=False, timeout=30)
    try:
        return {int(p["id"]): str(p.get("name", "?")) for p in json.loads(shown.stdout or "[]")}
    except (ValueError, KeyError, TypeError):
        return {}


@contextmanager
def stats_sysctl() -> Iterator[None]:
    """kernel.bpf_stats_enabled = 1 for the block, restored after (every BPF program of the host pays two clock
    reads a run meanwhile: --per-program's figures are a diagnosis, not the slowdown's)."""
    before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        yield
    finally:
        STATS_SYSCTL.write_text(before)


def per_program(pid: int, first: dict[int, tuple[int, int]], seconds: float) -> tuple[tuple[str, float, float], ...]:
    """(name, ns per run, runs per second) of each of the agent's programs since ``first``."""
    last, names = agent_programs(pid), program_names()
    rows = []
    for prog_id, (run_ns, runs) in sorted(last.items()):
        ns0, runs0 = first.get(prog_id, (0, 0))
        if runs > runs0:
            rows.append(
                (f"{names.get(prog_id, '?')} ({prog_id})", (run_ns - ns0) / (runs - runs0), (runs - runs0) / seconds)
            )
    return tuple(rows)


def with_agent(
    jvm: Jvm, pair: int, seconds: float, scratch: Path, extra: list[str], settle: float = 0.0, programs: bool = False
) -> Window:
    """A window of `profiler run --pid JVM --off-cpu *extra`, the JVM read when the agent starts sampling,
    ``settle`` seconds later (after the work it does once per process: the walker's tables parsed, ...) and when
    it stops (its start-up and post-run outside): measured from the second reading to the last, and whole.
    ``programs``: each of the agent's BPF programs' time per run over the measured part too, the statistics on
    meanwhile (kernel.bpf_stats_enabled, restored after)."""
    out, status = scratch / f"cap-{pair}", scratch / f"status-{pair}.json"
    argv = [
        sys.executable, "-m", "profiler", "run", "--duration", str(settle + seconds), "--out", str(out),
        "--pid", str(jvm.pid), "--known-spes", str(_no_spes(scratch)), "--status-file", str(status),
        "--checkpoint", "0", "--force", "--off-cpu", *extra,
    ]  # fmt: skip
    rows: tuple[tuple[str, float, float], ...] = ()
    with profiler_run(argv) as agent:
        _wait_state(status, "sampling", agent)
        with stats_sysctl() if programs else nullcontext():
            begin = read_jvm(jvm)
            time.sleep(settle)
            first = agent_programs(agent.pid) if programs else {}
            start = read_jvm(jvm)
            _wait_state(status, "writing", agent, or_after=WINDOW_ENDED)
            end = read_jvm(jvm)
            rows = per_program(agent.pid, first, end.at - start.at) if programs else ()
    overhead, meta = read_overhead(out), read_meta(out)
    run_ns = (overhead.bpf_run_time_ns or 0) if overhead else 0
    runs = (overhead.bpf_run_count or 0) if overhead else 0
    whole = window_of(True, pair, begin, end)
    return replace(
        window_of(True, pair, start, end),
        whole_handoffs_per_s=whole.handoffs_per_s,
        whole_handoffs_per_cpu_s=whole.handoffs_per_cpu_s,
        agent_cpu_s=overhead.profiler_cpu_seconds if overhead else 0.0,
        # per `seconds` of the agent's own window: a starved agent's window runs past --duration
        bpf_cpu_s=run_ns / 1e9 / max(meta.duration, 1e-3) * seconds,
        bpf_us_per_run=run_ns / 1e3 / max(runs, 1),
        walked_share=walked_share(out / "pids" / str(jvm.pid) / "offcpu.folded"),
        warnings=tuple(w for w in meta.warnings if "walker" in w.lower() or "off-cpu" in w.lower()),
        programs=rows,
        components=tuple(sorted(((c.component, c.cpu_seconds) for c in overhead.cpu_by_component), key=lambda c: -c[1]))
        if overhead
        else (),
        agent_cpu_measured_s=cpu_since(overhead.timeline, settle) if overhead else 0.0,
    )


def cpu_since(timeline: tuple[OverheadPoint, ...], since: float) -> float:
    """The agent's CPU seconds from ``since`` seconds into its window to its end, from overhead.json's timeline
    (the point nearest ``since``; 0.0: no timeline)."""
    if len(timeline) < 2:
        return 0.0
    first = min(timeline, key=lambda point: abs(point.t - since))
    return timeline[-1].cpu_seconds - first.cpu_seconds if since > 0 else timeline[-1].cpu_seconds


def spread(values: list[float]) -> str:
    """min / median / max (and mean ± standard error with two or more) of fractions, in percent."""
    text = f"{100 * min(values):+.2f} / {100 * statistics.median(values):+.2f} / {100 * max(values):+.2f} %"
    if len(values) >= 2:
        mean, error = statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5
        text += f" (mean {100 * mean:+.2f} % ± {100 * error:.2f})"
    return text


def slowdowns(windows: list[Window], key: str, agent_key: str = "") -> list[float]:
    """Per pair, 1 - the agent window's ``agent_key`` (else ``key``) / the no-agent window's ``key``."""
    by_pair: dict[int, dict[bool, Window]] = {}
    for window in windows:
        by_pair.setdefault(window.pair, {})[window.agent] = window
    return [
        1 - getattr(both[True], agent_key or key) / getattr(both[False], key)
        for _, both in sorted(by_pair.items())
        if len(both) == 2 and getattr(both[False], key) > 0
    ]


def report(windows: list[Window], args: argparse.Namespace, uptimes: tuple[str, str]) -> str:
    agent = [w for w in windows if w.agent]
    rates = [w.voluntary_per_s for w in windows]
    short = sum(1 for w in windows if below(w))
    extra = "".join(f" --profiler-arg={a}" for a in args.profiler_arg)
    lines = [
        f"Command: `.venv/bin/python bench/bench_offcpu_walker.py --pairs {args.pairs} --window {args.window:g} "
        f"--work {args.work} --thread-pairs {args.thread_pairs} --settle {args.settle:g}"
        f"{' --frame-pointers' if args.frame_pointers else ''}"
        f"{' --per-program' if args.per_program else ''}"
        f"{extra}`",
        f"Load: `uptime` before: {uptimes[0]}; after: {uptimes[1]}",
        "",
        "| window | pair | hand-offs/s | hand-offs / JVM CPU-s | voluntary switches/s | all switches/s |"
        " agent CPU s (measured part) | BPF CPU s | BPF µs / run | walked | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in windows:
        lines.append(
            f"| {'--off-cpu' if w.agent else 'no agent'} | {w.pair} | {w.handoffs_per_s:,.0f} |"
            f" {w.handoffs_per_cpu_s:,.0f} | {w.voluntary_per_s:,.0f}{below(w)} | {w.switches_per_s:,.0f} |"
            + (
                f" {w.agent_cpu_s:.2f} ({w.agent_cpu_measured_s:.2f}) | {w.bpf_cpu_s:.3f} | {w.bpf_us_per_run:.3f} |"
                f" {100 * w.walked_share:.0f} % |"
                if w.agent
                else " – | – | – | – |"
            )
            + f" {w.load:.1f} |"
        )
    lines += [
        "",
        f"Voluntary context switches/s of the JVM, min / median / max over all windows: {min(rates):,.0f} / "
        f"{statistics.median(rates):,.0f} / {max(rates):,.0f}"
        f" ({'every window' if not short else 'NOT every window'} ≥ {GOAL_SWITCHES:,}"
        f"{f': {short} windows {BELOW}' if short else ''})",
        f"Slowdown per pair (1 - with / without), min / median / max over {len(slowdowns(windows, 'handoffs_per_s'))}"
        f" pairs: hand-offs per second {spread(slowdowns(windows, 'handoffs_per_s'))};"
        f" per JVM CPU-second {spread(slowdowns(windows, 'handoffs_per_cpu_s'))}"
        + (
            f". The agent's whole window, its first {args.settle:g} s included: per second"
            f" {spread(slowdowns(windows, 'handoffs_per_s', 'whole_handoffs_per_s'))}; per JVM CPU-second"
            f" {spread(slowdowns(windows, 'handoffs_per_cpu_s', 'whole_handoffs_per_cpu_s'))}"
            if args.settle > 0
            else ""
        ),
    ]
    if agent:
        lines.append(
            f"The agent: BPF {statistics.median(w.bpf_cpu_s for w in agent):.3f} CPU-s per {args.window:g} s window, "
            f"{statistics.median(w.bpf_us_per_run for w in agent):.3f} µs per run (medians); its own CPU "
            f"{statistics.median(w.agent_cpu_s for w in agent):.2f} s in its whole window, "
            f"{statistics.median(w.agent_cpu_measured_s for w in agent):.2f} s in the measured part;"
            " the walker's Java frames in "
            f"{100 * min(w.walked_share for w in agent):.0f}–{100 * max(w.walked_share for w in agent):.0f} % of the"
            " ping-pong threads' blocked time"
        )
    warnings = sorted({text for w in agent for text in w.warnings})
    lines += [f"Warning (meta.json): {text}" for text in warnings]
    return "\n".join(lines) + "\n"


def below(window: Window) -> str:
    """The mark of a window short of the goal's rate (" **BELOW 50,000 ...**"), else nothing."""
    return f" **{BELOW}**" if window.voluntary_per_s < GOAL_SWITCHES else ""


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pairs", type=int, default=5, help="pairs of windows, no agent and --off-cpu, order alternating (5)"
    )
    parser.add_argument("--window", type=float, default=20.0, help="seconds per window (20)")
    parser.add_argument(
        "--work",
        type=int,
        default=DEFAULT_WORK,
        help=f"xorshift rounds per hand-off ({DEFAULT_WORK}: ~60,000 voluntary switches/s alone on 2 CPUs; a window"
        f" under {GOAL_SWITCHES:,} is marked and the bench exits with 2)",
    )
    parser.add_argument("--thread-pairs", type=int, default=2, help="PingPongRate's thread pairs (2)")
    parser.add_argument(
        "--settle", type=float, default=10.0,
        help="seconds of the agent's window before its measured --window (10): its once-per-process start-up work"
        " (the walker's CFI tables of libjvm and glibc parsed, threads named) is reported apart, as the whole window",
    )  # fmt: skip
    parser.add_argument("--frame-pointers", action="store_true", help="run the JVM with -XX:+PreserveFramePointer")
    parser.add_argument(
        "--profiler-arg", action="append", default=[], metavar="ARG",
        help="one more `profiler run` argument, repeatable (e.g. --profiler-arg=--stack-walk --profiler-arg=kernel)",
    )  # fmt: skip
    parser.add_argument(
        "--per-program", action="store_true",
        help="also each of the agent's BPF programs' ns per run (statistics on all window: a diagnosis only)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.pairs < 1 or args.window <= 0 or args.settle < 0:
        parser.error("--pairs must be at least 1, --window positive and --settle not negative")
    if os.geteuid() != 0:
        parser.error("run as root: `profiler run` loads eBPF")
    before = uptime()
    print(f"uptime: {before}", flush=True)
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="bench-offcpu-walker-") as name:
        scratch = Path(name)
        with warm_jvm(scratch, args.thread_pairs, args.work, args.frame_pointers) as jvm:
            for pair in range(args.pairs):
                alone = functools.partial(without_agent, jvm, pair, args.window)
                profiled = functools.partial(
                    with_agent, jvm, pair, args.window, scratch, args.profiler_arg, args.settle, args.per_program
                )
                # A B, B A, A B, ...: the JVM's rate drifts through a run (it rose ~0.8 % a window at stop 61),
                # which a fixed order would charge to one side
                for run in (alone, profiled) if pair % 2 == 0 else (profiled, alone):
                    window = run()
                    windows.append(window)
                    print(
                        f"pair {pair} {'--off-cpu' if window.agent else 'no agent'}: {window.handoffs_per_s:,.0f}"
                        f" hand-offs/s, {window.handoffs_per_cpu_s:,.0f} per JVM CPU-s, {window.voluntary_per_s:,.0f}"
                        f" voluntary switches/s, load {window.load:.1f}"
                        + (f", walked {100 * window.walked_share:.0f} %" if window.agent else "")
                        + (f"  <-- {BELOW}: not the goal's rate" if below(window) else ""),
                        flush=True,
                    )
                    if window.agent:
                        parts = ", ".join(f"{name} {cpu:.2f}" for name, cpu in window.components[:5])
                        print(
                            f"    agent CPU {window.agent_cpu_s:.2f} s ({window.agent_cpu_measured_s:.2f} after"
                            f" --settle): {parts}; BPF {window.bpf_cpu_s:.3f} s, {window.bpf_us_per_run:.3f} µs/run",
                            flush=True,
                        )
                    for name, ns, rate in window.programs:
                        print(f"    {name}: {ns:,.0f} ns per run, {rate:,.0f} runs/s", flush=True)
    print()
    print(report(windows, args, (before, uptime())))
    short = [w for w in windows if below(w)]
    if short:
        print(
            f"bench_offcpu_walker: {len(short)} of {len(windows)} windows {BELOW} (the goal's rate): lower --work or"
            " run alone",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
