"""Start-up cost of the agent's BPF programs, compiled (cold) and loaded from the compile cache (warm).

For each program (exec watch, thread names, network, off-CPU, the stack walker) a fresh Python process
builds it as the agent does (``compile_program`` and the ``load_func`` calls its caller makes) once
with an empty cache directory (cold: bcc and LLVM compile, the entry is written) and once more with the
same directory (warm: no LLVM). Then ``profiler run --pid <a busy process> --duration 5`` whole,
cold and warm: the command's CPU (user + sys of it and its children) and wall time.
Needs root; run under the shared lock on a shared machine:

usage: flock /tmp/spe-heavy.lock .venv/bin/python bench/bench_bpf_start.py [--programs exec,walker] [--no-run]

Measured 2026-11-29 on the 2-core dev VM (kernel 6.18, bcc 0.26), load 2.1-1.7: CPU-s cold -> warm:
exec 0.29 -> 0.014, threads 0.57 -> 0.016, net 0.78 -> 0.022, offcpu 0.64 -> 0.038, walker 6.13 -> 0.96
(the kernel's verifier); `profiler run --pid --duration 5`: 6.59 CPU-s, 11.6 s wall -> 2.70 CPU-s, 7.7 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Each program: the text its caller builds, and the functions its caller loads itself (bcc's autoloaded
# probes are loaded inside compile_program).
PROGRAM_SCRIPT = r"""
import json, resource, sys, time
sys.path.append("/usr/lib/python3/dist-packages")
from bcc import BPF
from profiler.bpf.compiler import compile_program

def text_and_loads(name):
    if name == "exec":
        from profiler.scope.execwatch import bpf_source
        return bpf_source(), []
    if name == "threads":
        from profiler.scope.threadwatch import ThreadWatch
        return ThreadWatch([]).bpf_text(), [b"on_set_native_thread_name"]
    if name == "net":
        from profiler.sampling.net import NetTracer
        return NetTracer().bpf_text(), []
    if name == "offcpu":
        from profiler.sampling.offcpu import OffCpuTracer
        return OffCpuTracer().bpf_text(), []
    from profiler.sampling.sampler import StackSampler
    return StackSampler().bpf_text("walker"), [b"walk_more", b"on_cpu_clock"]

name = sys.argv[1]
text, loads = text_and_loads(name)
types = {b"on_set_native_thread_name": BPF.KPROBE}
before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
program = compile_program(BPF, text)
for function in loads:
    program.load_func(function, types.get(function, BPF.PERF_EVENT))
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(json.dumps({"class": type(program).__name__, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                  "peak_rss_mb": round(after.ru_maxrss / 1024, 1)}))
program.cleanup()
"""

PROGRAMS = ("exec", "threads", "net", "offcpu", "walker")


def environment(cache_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "SPE_TASKPROF_BPF_CACHE": str(cache_dir)}


def load_program(name: str, cache_dir: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM_SCRIPT, name], env=environment(cache_dir), cwd=REPO,
        capture_output=True, text=True, timeout=600, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def profiler_run(cache_dir: Path, pid: int, out: Path) -> dict[str, object]:
    """``profiler run --pid PID --duration 5``: CPU of the command and its children, and wall time."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "profiler", "run", "--pid", str(pid), "--duration", "5", "--out", str(out), "--force"],
        env=environment(cache_dir), cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - started
    return {
        "exit": completed.returncode,
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "sys_s": round(after.ru_stime - before.ru_stime, 2),
        "wall_s": round(wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS), help=f"comma-separated subset of {PROGRAMS}")
    parser.add_argument("--no-run", action="store_true", help="skip the whole `profiler run` cold/warm pair")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_bpf_start: needs root (BPF); run with sudo", file=sys.stderr)
        return 2
    print(f"load {Path('/proc/loadavg').read_text().strip()}")
    with tempfile.TemporaryDirectory(prefix="bpf-start-") as scratch:
        for name in args.programs.split(","):
            cache_dir = Path(scratch) / f"cache-{name}"
            cold, warm = load_program(name, cache_dir), load_program(name, cache_dir)
            print(f"{name:8} cold {cold['cpu_s']:6.2f} CPU-s {cold['wall_s']:6.2f} s wall ({cold['class']})   "
                  f"warm {warm['cpu_s']:6.3f} CPU-s {warm['wall_s']:6.3f} s wall ({warm['class']})")
        if not args.no_run:
            target = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                cache_dir = Path(scratch) / "cache-run"
                for label in ("cold", "warm"):
                    figures = profiler_run(cache_dir, target.pid, Path(scratch) / f"run-{label}")
                    print(f"profiler run --pid --duration 5, {label}: {json.dumps(figures)}")
            finally:
                target.kill()
                target.wait()
    print(f"load {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
