"""How long `profiler run` takes to its first sample of an honest JVM, with and without hostile tenants on the
host (issue 46: "sampling starts within the same time with and without the hostile tenants present").

An honest CpuSplit JVM runs throughout. Each round launches the real CLI (``python -m profiler run --pid
<honest> [--pid <tenant>...] --duration D --interval 0.1``) once without tenants and once with the tenants of
tests/integration/test_hostile_*.py running as ``nobody`` (their own builders, imported): a process spinning
in a crafted ``.eh_frame`` bomb and an unterminated 33 MiB ``.symtab`` string table (test_hostile_parsers,
profiled), a 32 MiB command line (test_hostile_proc, met by the scope's scan), and two "Spark drivers"
whose REST API trickles a byte a second or sends a JSON list without end (test_hostile_rest, asked by the
event counter and the plan collector). The order alternates round by round. Measured per run, from the
launch (wall clock, taken just before the command starts): the window's start (meta.json's start_time) and
the honest JVM's first sample (the first 0.1 s interval of its timeline: +0.1 s resolution).

Needs root, setpriv, /usr/bin/python3 and a JDK; run it alone, under the shared lock:

usage: flock /tmp/spe-heavy.lock .venv/bin/python bench/bench_hostile_start.py [--repeat N] [--duration S] [--control]

``--control`` adds a third run per round with only the spinning tenant, its files plain: the same CPU taken
from the agent on the 2 cores, nothing crafted (what part of a difference is the tenants' CPU, not the agent).

Figures: docs/benchmarks/hostile-start.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from profiler.capture.read import iter_timeline, pid_timeline_file, read_meta  # noqa: E402
from tests.fixtures import hostile  # noqa: E402
from tests.fixtures.jvm import compile_workloads, start_cpu_split  # noqa: E402
from tests.integration import test_hostile_parsers as parsers  # noqa: E402
from tests.integration import test_hostile_proc as proc  # noqa: E402
from tests.unit.fuzz import crafted  # noqa: E402

INTERVAL = 0.1


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    """A tenant process that says READY (or its port) on its first line."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    first = process.stdout.readline().strip()
    if not first:
        process.kill()
        raise RuntimeError(f"tenant {argv[:6]} said nothing")
    return process


@functools.cache
def _images(benign: bool) -> tuple[bytes, bytes]:
    """test_hostile_parsers' two crafted ELF files (built once); ``benign``: the same spinning code in two plain
    ELF files (the control: the same CPU taken from the agent, nothing crafted)."""
    if benign:
        plain = crafted.elf_image([(".text", 1, parsers.SPIN, parsers.CODE_AT, 0, 0)], code=(parsers.CODE_AT, 16))
        return plain, plain
    return parsers._bomb_image(), parsers._strtab_image()


@contextmanager
def hostile_tenants(area: Path, control: bool = False) -> Iterator[list[int]]:
    """Every tenant started as ``nobody``; yields the pids to profile (the crafted parser's); all killed after.
    ``control``: only the spinning process, its two files plain (what the tenants' CPU alone costs the start)."""
    processes: list[subprocess.Popen[str]] = []
    try:
        home = area / "shared" / "parsers"
        home.mkdir(parents=True)
        bomb, strtab = home / "libbomb.so", home / "libstrtab.so"
        bomb.write_bytes(_images(control)[0])
        strtab.write_bytes(_images(control)[1])
        for path in (area / "shared", home, bomb, strtab):
            hostile.give_to_tenant(path)
        spinner = _spawn(
            proc._as_tenant(parsers.TENANT_PYTHON, "-c", parsers.TENANT, str(parsers.CODE_AT), str(bomb), str(strtab))
        )
        processes.append(spinner)
        if not control:
            processes.append(_spawn(proc._as_tenant(sys.executable, "-c", proc.HUGE_ARGV, str(proc.HUGE_CMDLINE))))
            for mode in hostile.REST_TENANT_MODES:
                processes.append(hostile.start_rest_tenant(area, mode).process)
        yield [spinner.pid]
    finally:
        for process in processes:
            process.kill()
            process.wait(30)


def one_run(honest: int, tenants: list[int], duration: float, work: Path) -> dict[str, float]:
    """``profiler run`` once: seconds from the launch to the window's start and to the honest JVM's first sample."""
    out = work / "cap"
    argv = [sys.executable, "-m", "profiler", "run", "--duration", str(duration), "--interval", str(INTERVAL)]
    for pid in (honest, *tenants):
        argv += ["--pid", str(pid)]
    launched = time.time()
    done = subprocess.run(
        [*argv, "--out", str(out), "--force"], capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"profiler run exited {done.returncode}: {done.stderr[-1500:]}")
    meta = read_meta(out)
    timeline = pid_timeline_file(out, honest)
    if timeline is None:
        raise RuntimeError(f"no timeline of the honest JVM in {out}")
    first = min(interval for interval, _stack, count in iter_timeline(timeline) if count > 0)
    return {
        "window_s": meta.start_time - launched,
        "first_sample_s": meta.start_time + first * INTERVAL - launched,
        "run_s": ended - launched,
    }


def summary(values: list[float]) -> str:
    return f"min {min(values):6.2f}  median {statistics.median(values):6.2f}  max {max(values):6.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (one run without, one with tenants) [3]")
    parser.add_argument("--duration", type=float, default=3.0, help="each run's window in seconds [3]")
    parser.add_argument(
        "--control", action="store_true",
        help="a third run per round: only the tenants' spinning process, its files plain (their CPU, nothing crafted)",
    )  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (profiler run, tenants as nobody)")
    area = Path(tempfile.mkdtemp(prefix="tenant-", dir="/var/tmp"))  # traversable by the tenant
    os.chmod(area, 0o755)
    cases = ("without", "with", "control") if args.control else ("without", "with")
    results: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, area, True)
        classes = compile_workloads(area / "classes")
        honest_jvm = start_cpu_split(classes, threads=1)
        stack.callback(honest_jvm.kill)
        for round_index in range(args.repeat):
            order = cases if round_index % 2 == 0 else cases[::-1]
            for case in order:
                with ExitStack() as tenants_stack:
                    tenants = []
                    if case != "without":
                        where = area / f"t{round_index}-{case}"
                        tenants = tenants_stack.enter_context(hostile_tenants(where, control=case == "control"))
                    work = Path(tempfile.mkdtemp(prefix="hostile-start-"))
                    tenants_stack.callback(shutil.rmtree, work, True)
                    figures = one_run(honest_jvm.pid, tenants, args.duration, work)
                results[case].append(figures)
                print(f"round {round_index + 1} {case:7s} " + json.dumps({k: round(v, 2) for k, v in figures.items()}),
                      flush=True)  # fmt: skip
    print()
    for key in ("first_sample_s", "window_s", "run_s"):
        without = [r[key] for r in results["without"]]
        for case in cases:
            print(f"{key:15s} {case + ':':8s} {summary([r[key] for r in results[case]])}")
        for case in cases[1:]:
            difference = statistics.median([r[key] for r in results[case]]) - statistics.median(without)
            print(f"{key:15s} median difference ({case} - without): {difference:+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
