"""How whole are the stacks of running processes with and without .eh_frame unwinding, and what it costs.

Attaches the minimal BPF walker of tests/fixtures/cfi_walker.py (frame-pointer steps, plus the CFI step
of profiler/unwind/cfi_step.h unless --no-cfi) to the given processes for a window and reports per process:
samples, the share whose walk reached an outermost frame (clone3, _start: the thread's start), and why
the others stopped (a CFI step failed, a frame-pointer read failed, the chain ended at a zero frame
pointer, the depth ran out); the table load time and size per ELF; the BPF program's time per sample
(kernel.bpf_stats_enabled is switched on for the window).

With --capture DIR (a host capture, e.g. runs/<id>/hosts/localhost) it reads the product's own
folded stacks instead: per workload PID, the share of samples whose stack reaches a thread start frame
(one of the three outermost user frames, as the sampler's java_unwalkable rule), and sampler.json's
stacks_cut counts (the causes of docs/unwinding.md).

The tables come from the product's table cache (profiler/unwind/tablecache.py; SPE_TASKPROF_CFI_CACHE=<empty
dir> for a cold load, =off to parse every time).

usage: .venv/bin/python bench/bench_cfi.py --match TaskManagerRunner [--seconds 30] [--no-cfi]
       .venv/bin/python bench/bench_cfi.py --pid 1234 --pid 5678
       .venv/bin/python bench/bench_cfi.py --capture runs/<id>/hosts/localhost
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures.cfi_walker import (  # noqa: E402
    END_CFI,
    END_CFI_FAIL,
    END_DEPTH,
    END_FP_FAIL,
    END_FP_ZERO,
    CfiWalker,
    Walk,
)

END_NAMES = {
    END_CFI: "whole (outermost by CFI)",
    END_FP_ZERO: "frame pointer 0",
    END_CFI_FAIL: "CFI step failed",
    END_FP_FAIL: "frame-pointer read failed",
    END_DEPTH: "depth limit",
}
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


def matching_pids(pattern: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if pattern in cmdline and int(entry) != os.getpid():
                pids.append(int(entry))
    return sorted(pids)


def prog_stats(bpf: Any) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of a bcc object's loaded programs (kernel.bpf_stats_enabled on)."""
    run_time = run_count = 0
    for function in bpf.funcs.values():
        with open(f"/proc/self/fdinfo/{function.fd}", encoding="ascii") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key == "run_time_ns":
                    run_time += int(value)
                elif key == "run_cnt":
                    run_count += int(value)
    return run_time, run_count


def reached_start(walks: list[Walk], pids: list[int]) -> dict[int, tuple[int, int, Counter[str]]]:
    """Per process: walks whose outermost frame is a thread start, those with one in the outermost
    three (the sampler's java_unwalkable rule), and the outermost frames of the others."""
    from profiler.symbols.frames import ROOT_WINDOW, THREAD_ROOTS
    from profiler.symbols.procsyms import ProcessSymbols

    result = {}
    for pid in pids:
        symbols = ProcessSymbols(pid)
        strict = loose = 0
        others: Counter[str] = Counter()
        try:
            for walk in walks:
                if walk.tgid != pid:
                    continue
                names = [symbols.resolve(pc).name.split("(")[0] for pc in walk.pcs]
                strict += names[-1] in THREAD_ROOTS
                if any(name in THREAD_ROOTS for name in names[-ROOT_WINDOW:]):
                    loose += 1
                else:
                    others[names[-1]] += 1
        finally:
            symbols.close()
        result[pid] = (strict, loose, others)
    return result


def report(walker: CfiWalker, pids: list[int], seconds: float, load_seconds: float) -> None:
    walks = walker.walks()
    roots = reached_start(walks, pids)
    print(f"window {seconds:.0f} s, {'CFI + frame pointers' if walker.use_cfi else 'frame pointers only'}")
    for pid in pids:
        mine = [walk for walk in walks if walk.tgid == pid]
        ends = Counter(walk.end for walk in mine)
        total = len(mine) or 1
        whole = ends[END_CFI]
        strict, loose, others = roots[pid]
        print(
            f"pid {pid}: {len(mine)} samples; outermost frame a thread start: {100 * strict / total:.2f} %, "
            f"one of the outermost {3}: {100 * loose / total:.2f} %; walk ended by CFI as outermost: "
            f"{100 * whole / total:.2f} %; other walks ended:"
        )
        for end, name in END_NAMES.items():
            if end != END_CFI and ends[end]:
                print(f"    {name}: {ends[end]} ({100 * ends[end] / total:.2f} %)")
        print(f"    outermost frames of walks not reaching a start: {others.most_common(6)}")
        if walker.use_cfi:
            print(f"    step health: {walker.loader.health(pid)}")
    if walker.use_cfi:
        loader = walker.loader
        print(f"tables loaded in {load_seconds:.2f} s wall; rows {loader.rows_used}, pages {loader.pages_used}")
        for table in sorted(loader.tables.values(), key=lambda t: -t.rows):
            print(
                f"    {table.path}: {table.rows} rows ({table.rows * 8 / 1024:.0f} KiB), {table.pages} pages "
                f"({table.pages * 8 / 1024:.0f} KiB), "
                f"{'from the table cache' if table.from_cache else 'parse'} {table.parse_seconds * 1000:.0f} ms CPU"
                + (f" [{table.cause}]" if table.cause else "")
            )
        print(f"    map memory preallocated: {loader.memory_bytes() / 2**20:.1f} MiB")
        cache = loader.table_cache
        if cache is not None:
            print(f"    table cache {cache.directory}: {cache.hits} hits, {cache.misses} misses {cache.problems[:2]}")


def capture_report(capture_dir: Path) -> None:
    """Whole-stack shares of a capture's workload PIDs, from their stacks.folded and sampler.json."""
    import json

    from profiler.symbols.frames import ROOT_WINDOW, THREAD_ROOTS

    for pid_dir in sorted((capture_dir / "pids").iterdir()):
        folded = pid_dir / "stacks.folded"
        if not folded.exists():
            continue
        total = reached = 0
        ends: Counter[str] = Counter()
        for line in folded.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            count = int(count_text)
            user = [frame for frame in stack.split(";")[1:] if not frame.endswith("_[k]")]
            total += count
            if any(frame.split("(")[0] in THREAD_ROOTS for frame in user[:ROOT_WINDOW]):
                reached += count
            else:
                ends[user[0] if user else "(no user frame)"] += count
        stats = json.loads((pid_dir / "sampler.json").read_text())
        cuts = stats.get("stacks_cut")
        print(
            f"pid {pid_dir.name}: {total} samples, {100 * reached / max(total, 1):.2f} % reach a thread start; "
            f"{100 * (total - reached) / max(total, 1):.2f} % do not, outermost frames: {ends.most_common(5)}; "
            f"stacks_cut {cuts}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, action="append", default=[])
    parser.add_argument("--match", help="every process whose command line contains this")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--frequency", type=int, default=99)
    parser.add_argument("--depth", type=int, default=128, help="a power of two")
    parser.add_argument("--no-cfi", action="store_true", help="frame-pointer steps only (today's walk)")
    parser.add_argument("--capture", type=Path, help="report on a host capture directory instead")
    args = parser.parse_args(argv)
    if args.capture:
        capture_report(args.capture)
        return 0
    pids = args.pid + (matching_pids(args.match) if args.match else [])
    if not pids:
        parser.error("no process: give --pid or a --match that finds one")
    walker = CfiWalker(args.frequency, args.depth, use_cfi=not args.no_cfi)
    stats_before = Path(BPF_STATS).read_text().strip()
    Path(BPF_STATS).write_text("1")
    try:
        began = time.monotonic()
        for pid in pids:
            walker.add_pid(pid)
        load_seconds = time.monotonic() - began
        walker.walks()
        walker._walks.clear()
        time_before, count_before = prog_stats(walker.bpf)
        cpu_before = time.process_time()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(0.2)
            walker.poll()
        time_after, count_after = prog_stats(walker.bpf)
        report(walker, pids, args.seconds, load_seconds)
        runs = count_after - count_before
        print(
            f"BPF program: {runs} runs, {(time_after - time_before) / max(runs, 1):.0f} ns per run "
            f"(all CPUs' samples, also of other processes); reader CPU {time.process_time() - cpu_before:.2f} s"
        )
    finally:
        Path(BPF_STATS).write_text(stats_before)
        walker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
