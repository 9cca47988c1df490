"""Generate an archive of coordinator run directories from real captured executor stacks.

Default: 100 runs × 8 hosts × 4 executors (+ one driver), each executor's stacks.folded drawn from
tests/data/spark_executor_real.folded (a real local Spark Structured Streaming executor capture):

- every real stack is kept by an executor with probability --keep (0.6), its count scaled so an
  executor has about 900 s × 99 Hz × 2 busy threads of samples, times a log-normal factor;
- a fraction --variants (0.1) of the kept stacks gets a frame specific to that JVM (a hidden-class
  lambda name ``$$Lambda/0x…`` as JDK 17 prints them), so distinct stacks grow with the archive
  as they do across real JVM restarts;
- counters: cycles = samples / 99 Hz × 2.4 GHz; labels load=<10k..100k>, engine=spark.

Deterministic for a given --seed. --compact writes the same samples as stack tables (capture format 4,
``stacks.tpc``, as a ring-buffer capture of 900 s writes them) instead of stacks.folded: each stack's
samples spread over --intervals (90) 10-second slices of the window (a stack with fewer samples than
slices in as many slices as it has samples), so a table holds the (interval, stack) rows a real
window gives; --intervals 0 writes tables without a timeline (stack-map collection). The summed
stacks are the folded archive's, sample for sample.

usage: .venv/bin/python bench/make_archive.py OUT_DIR [--runs 100 --hosts 8 --executors 4] [--quick]
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profiler.capture import format as capture  # noqa: E402
from profiler.capture.folded import FRAME_SEPARATOR, KERNEL_SUFFIX, read_folded  # noqa: E402
from profiler.capture.stacktable import KERNEL, THREAD, StackTable, StackTableBuilder, write_table  # noqa: E402
from profiler.files.atomic import atomic_write_chunks  # noqa: E402
from tests.fixtures.captures import PidSpec, write_run_dir  # noqa: E402

REAL_STACKS = ROOT / "tests" / "data" / "spark_executor_real.folded"
PROFILE = ROOT / "application_profiles" / "spark_structured_streaming.txt"
SAMPLES_PER_EXECUTOR = 900 * 99 * 2
HZ = 99
CLOCK = 2.4e9
INTERVALS = 90  # 10 s slices of a 900 s window


def executor_stacks(
    pool: list[tuple[str, int]], rng: random.Random, jvm: int, keep: float, variants: float
) -> dict[str, int]:
    pool_samples = sum(count for _, count in pool)
    scale = SAMPLES_PER_EXECUTOR / pool_samples
    stacks: dict[str, int] = {}
    for stack, count in pool:
        if rng.random() >= keep:
            continue
        samples = max(1, round(count * scale * rng.lognormvariate(0.0, 0.5)))
        if rng.random() < variants:
            frames = stack.split(";")
            index = rng.randrange(1, len(frames)) if len(frames) > 1 else 0
            frames[index] = f"{frames[index]}$$Lambda/0x{0x7F0000000000 + jvm * 0x1000 + index:x}"
            stack = ";".join(frames)
        stacks[stack] = stacks.get(stack, 0) + samples
    return stacks


def executor_table(stacks: dict[str, int], rng: random.Random, intervals: int) -> StackTable:
    """An executor's stacks as the stack table a ring-buffer capture writes: each stack's samples spread
    evenly over ``min(intervals, samples)`` slices drawn at random (no timeline when ``intervals`` is 0)."""
    builder = StackTableBuilder(timeline=intervals > 0)
    for stack, count in stacks.items():
        parts = stack.split(FRAME_SEPARATOR)
        frames = [builder.frame(parts[0], THREAD)]
        for part in parts[1:]:
            if part.endswith(KERNEL_SUFFIX):
                frames.append(builder.frame(part[: -len(KERNEL_SUFFIX)], KERNEL))
            else:
                frames.append(builder.frame(part, "unknown"))
        stack_id = builder.stack(tuple(frames))
        slices = sorted(rng.sample(range(intervals), min(intervals, count))) if intervals else [0]
        share, rest = divmod(count, len(slices))
        for position, interval in enumerate(slices):
            builder.add(interval, stack_id, None, share + (1 if position < rest else 0))
    return builder.build()


def write_tables(run_dir: Path, run_hosts: dict[str, list[PidSpec]], seed: int, intervals: int) -> None:
    """The executors' stacks.tpc of one run directory (written without stacks.folded)."""
    for host, specs in run_hosts.items():
        capture_dir = run_dir / "hosts" / host
        for spec in specs:
            if spec.role == "workload":
                rng = random.Random(f"{seed}:{run_dir.name}:{host}:{spec.pid}")
                table = executor_table(dict(spec.stacks), rng, intervals)
                write_table(capture.table_path(capture_dir, spec.pid), table, atomic_write_chunks)


def make_archive(
    out: Path,
    runs: int,
    hosts: int,
    executors: int,
    keep: float,
    variants: float,
    seed: int,
    compact: bool = False,
    intervals: int = INTERVALS,
    start: int = 0,
) -> dict:
    pool = sorted(read_folded(REAL_STACKS).items())
    profile_text = PROFILE.read_text(encoding="utf-8")
    if out.exists() and not start:
        shutil.rmtree(out)
    total_samples = total_lines = 0
    distinct: set[str] = set()
    for run in range(start, start + runs):
        run_hosts: dict[str, list[PidSpec]] = {}
        for host in range(hosts):
            pids = []
            if host == 0:
                pids.append(PidSpec(pid=1000, role="managing", kind="driver", cycles=1.0e9, cpu_seconds=0.4))
            for executor in range(executors):
                jvm = (run * hosts + host) * executors + executor
                rng = random.Random(seed * 1_000_003 + jvm)
                stacks = executor_stacks(pool, rng, jvm, keep, variants)
                samples = sum(stacks.values())
                total_samples += samples
                total_lines += len(stacks)
                distinct.update(stacks)
                pids.append(
                    PidSpec(
                        pid=2000 + executor,
                        stacks=stacks,
                        write_stacks=not compact,
                        cycles=samples / HZ * CLOCK,
                        cpu_seconds=samples / HZ,
                        instructions=samples / HZ * CLOCK * 1.3,
                    )
                )
            run_hosts[f"host{host:02d}"] = pids
        load = f"{10 * (1 + run % 10)}k"
        options = {"duration": 900.0, "stack_collection": "ringbuf"} if compact and intervals else {}
        run_dir = write_run_dir(
            out / f"run{run:03d}", f"run{run:03d}", run_hosts, profile_text, labels={"load": load, "engine": "spark"},
            **options,
        )
        if compact:
            write_tables(run_dir, run_hosts, seed, intervals)
    size = sum(p.stat().st_size for pattern in ("stacks.folded", "stacks.tpc") for p in out.rglob(pattern))
    return {
        "runs": runs,
        "hosts": hosts,
        "executors": executors,
        "stack_files": runs * hosts * executors,
        "lines": total_lines,
        "samples": total_samples,
        "distinct_stacks": len(distinct),
        "stack_bytes": size,
        "pool_stacks": len(pool),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--executors", type=int, default=4)
    parser.add_argument("--keep", type=float, default=0.6)
    parser.add_argument("--variants", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="10 runs instead of 100")
    parser.add_argument("--compact", action="store_true", help="stack tables (capture format 4) instead of folded")
    parser.add_argument(
        "--start", type=int, default=0, help="number of the first run; with it OUT_DIR is added to, not replaced"
    )
    parser.add_argument(
        "--intervals", type=int, default=INTERVALS, help="--compact: timeline slices per table (0: no timeline)"
    )
    args = parser.parse_args(argv)
    runs = 10 if args.quick else args.runs
    started = time.monotonic()
    facts = make_archive(
        args.out, runs, args.hosts, args.executors, args.keep, args.variants, args.seed, args.compact, args.intervals,
        args.start,
    )
    facts["seconds"] = round(time.monotonic() - started, 1)
    mb = facts["stack_bytes"] / 1e6
    print(
        f"{args.out}: {facts['runs']} runs × {facts['hosts']} hosts × {facts['executors']} executors, "
        f"{facts['lines']} stack lines ({facts['distinct_stacks']} distinct), {facts['samples']} samples, "
        f"{mb:.0f} MB of stacks from {facts['pool_stacks']} real stacks, in {facts['seconds']} s"
    )
    return 0 if math.isfinite(mb) else 1


if __name__ == "__main__":
    sys.exit(main())
