"""Time to the first sample: from launching `profiler run --pid <JVM> --duration 3` to its first sample, and
the command's CPU until then (issue 49: warm <= 2 s and <= 1 CPU-s, cold <= 10 s, within 3x of those with
two busy processes on the 2 cores).

The figures are the run's own (overhead.json): `first_sample_at`, seconds from the command's exec to the
first sample's kernel time, and `first_sample_cpu_seconds`, the agent's CPU (every thread) when its reader
filed that sample (at most 0.2 s later, so an upper bound). Beside them `window_start_at` (every program
loaded, the scope's first listing), the whole command's CPU (its rusage as a child) and wall time, and the
window's CPU of the targets' preparation (unwind tables, vmStructs: overhead.json's cpu_by_component).
Warm: one unmeasured run fills a fresh compile cache and unwind-table cache first; --cold: each run gets
empty ones (SPE_TASKPROF_BPF_CACHE, SPE_TASKPROF_CFI_CACHE), as after set-up or a kernel change. Python's
bytecode is kept between the runs (PYTHONPYCACHEPREFIX in the scratch directory; an installed agent has
it), unless --from-source: a fresh coordinator bundle on a host compiles every module at each run.
--against DIR: a before/after comparison, each measured run of this tree's agent paired with one of DIR's
(another checkout, e.g. `git worktree add`), in alternating order (each side its own caches and bytecode),
so the machine's drift falls on both. Needs root and a JDK; on a shared machine run under the heavy lock:

usage: flock /tmp/spe-heavy.lock .venv/bin/python bench/bench_first_sample.py [--repeat 3] [--cold] [--load 2]
       [--against ../other-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGETS = {"warm": (2.0, 1.0), "cold": (10.0, None)}  # seconds to the first sample, CPU-s until then
LOADED = 3.0  # with --load: within 3x of the idle targets
PRIME_SECONDS = 8.0  # the unmeasured first run's window


def profiler_run(
    cache_dir: Path, pid: int, out: Path, duration: float, pycache: Path | None, repo: Path = REPO
) -> dict[str, object]:
    """One `profiler run --pid PID` of ``repo``'s agent: the run's start-up figures, its CPU as a child and its
    wall time. ``pycache``: the bytecode kept there across runs (an installed agent); None: compiled from source."""
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "SPE_TASKPROF_BPF_CACHE": str(cache_dir),
        "SPE_TASKPROF_CFI_CACHE": str(
            cache_dir / "cfi"
        ),  # the unwind tables' cache (a checkout without one ignores it)
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pycache is None:  # an empty prefix per run, nothing written: every module compiled, as from a fresh bundle
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(out.parent / f"no-pycache-{out.name}")
    else:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    argv = [sys.executable, "-m", "profiler", "run", "--pid", str(pid), "--duration", f"{duration:g}",
            "--out", str(out), "--force"]  # fmt: skip
    before, launched = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    completed = subprocess.run(argv, env=env, cwd=repo, capture_output=True, text=True, timeout=600)
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - launched
    if completed.returncode != 0:
        raise SystemExit(f"bench_first_sample: profiler run exited {completed.returncode}: {completed.stderr[-400:]}")
    overhead = json.loads((out / "overhead.json").read_text())
    components = {entry["component"]: entry["cpu_seconds"] for entry in overhead.get("cpu_by_component") or ()}
    return {
        "first_sample_s": overhead.get("first_sample_at"),
        "first_sample_cpu_s": overhead.get("first_sample_cpu_seconds"),
        "window_start_s": overhead.get("window_start_at"),
        "command_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
        "command_wall_s": round(wall, 2),
        "preparation_cpu_s": components.get("preparation"),
    }


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def verdict(label: str, load: int, seconds: float, cpu: float) -> str:
    target_s, target_cpu = TARGETS[label]
    scale = LOADED if load else 1.0
    ok = seconds <= target_s * scale and (target_cpu is None or cpu <= target_cpu * scale)
    cpu_part = f" and <= {target_cpu * scale:g} CPU-s" if target_cpu is not None else ""
    return f"target <= {target_s * scale:g} s{cpu_part}: {'met' if ok else 'MISSED'}"


def measured_runs(args: argparse.Namespace, sides: dict[str, Path], pid: int, scratch: Path) -> dict[str, list]:
    """``args.repeat`` runs of each side's agent (pairs in alternating order), after one unmeasured run each
    that fills its compile cache and bytecode; the busy loops of --load beside the measured ones."""
    pycache = {side: None if args.from_source else scratch / side / "pycache" for side in sides}
    for side, repo in sides.items():
        (scratch / side).mkdir()
        if not args.cold or pycache[side] is not None:  # fills the BPF compile cache and the bytecode
            cache = scratch / side / ("cache-prime" if args.cold else "cache")
            # a window long enough for the preparation to store every unwind table (libjvm.so's parse ends
            # after a 3 s window beside load: the measured runs were not all warm)
            prime_duration = max(args.duration, PRIME_SECONDS)
            profiler_run(cache, pid, scratch / side / "prime", prime_duration, pycache[side], repo)
    loops = busy_loops(args.load)
    try:
        time.sleep(1.0 if loops else 0.0)
        print(f"loadavg {Path('/proc/loadavg').read_text().strip()}")
        runs: dict[str, list] = {side: [] for side in sides}
        for index in range(args.repeat):
            for side in list(sides) if index % 2 == 0 else list(reversed(sides)):
                cache = scratch / side / (f"cache-{index}" if args.cold else "cache")
                out = scratch / side / f"run-{index}"
                figures = profiler_run(cache, pid, out, args.duration, pycache[side], sides[side])
                print(json.dumps({"agent": side, **figures}))
                runs[side].append(figures)
        print(f"loadavg {Path('/proc/loadavg').read_text().strip()}")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="measured runs (default 3)")
    parser.add_argument("--cold", action="store_true", help="each run with an empty BPF compile cache")
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes beside the runs (default 0)")
    parser.add_argument("--duration", type=float, default=3.0, help="each run's window (default 3 s)")
    parser.add_argument(
        "--from-source", action="store_true",
        help="no bytecode kept between runs (a fresh coordinator bundle on a host compiles every module)",
    )  # fmt: skip
    parser.add_argument("--against", type=Path, help="another checkout whose agent each run is paired with")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_first_sample: needs root (BPF); run with sudo", file=sys.stderr)
        return 2
    sides = {"this": REPO}
    if args.against is not None:
        if not (args.against / "profiler" / "__main__.py").is_file():
            print(f"bench_first_sample: {args.against}: no profiler/ agent there; give a checkout", file=sys.stderr)
            return 2
        sides["against"] = args.against.resolve()
    from tests.fixtures.jvm import compile_workloads, start_cpu_split

    label = "cold" if args.cold else "warm"
    python = "Python compiled from source each run" if args.from_source else "bytecode kept"
    print(f"{label}, {python}, load {args.load} busy loop(s); agents {', '.join(map(str, sides.values()))}")
    with tempfile.TemporaryDirectory(prefix="first-sample-") as scratch_name:
        scratch = Path(scratch_name)
        jvm = start_cpu_split(compile_workloads(scratch / "classes"), threads=2)
        try:
            runs = measured_runs(args, sides, jvm.pid, scratch)
        finally:
            jvm.kill()
    status = 0
    for side, side_runs in runs.items():
        firsts = [float(r["first_sample_s"]) for r in side_runs if r["first_sample_s"] is not None]
        cpus = [float(r["first_sample_cpu_s"]) for r in side_runs if r["first_sample_cpu_s"] is not None]
        if len(firsts) < len(side_runs) or not cpus:
            print(f"bench_first_sample: a run of {sides[side]} recorded no first sample", file=sys.stderr)
            status = 1
            continue
        first, cpu = statistics.median(firsts), statistics.median(cpus)
        print(
            f"{label}, load {args.load}, {sides[side]}: median first sample {first:.2f} s after the command, "
            f"{cpu:.2f} CPU-s until then (max {max(firsts):.2f} s, {max(cpus):.2f} CPU-s); "
            f"{verdict(label, args.load, first, cpu)}"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
