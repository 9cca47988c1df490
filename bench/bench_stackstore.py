"""Memory of the ring-buffer sampler's stack store over a synthetic 900 s window.

Feeds profiler.capture.stackstore.StackStore the samples of a busy 2-CPU host over 900 s at 99 Hz (178,000
samples by default) drawn from a pool of Java-deep user stacks (40 shared root frames, 5-40 distinct
leaf frames) with a skewed popularity, a fifth of them with a short kernel stack, 8 threads of one name,
10 s intervals and a perf-map epoch per minute; reports the bytes Python allocated per distinct stack
(tracemalloc). The real captures' figures are in docs/benchmarks/long-window.md.

``--root-frames 600`` models deep JVM stacks (Scala/Spark recursion: 600 shared frames under each leaf).
``--tasks-per-second N`` names the threads as Spark's executor does, one task (stage, TID) after the
other, N tasks a second over the 8 threads; ``--names`` says where the name goes: ``context`` (the
profiler's way: the thread kind in the stack key, the full name a counted context beside it) or
``in-key`` (the full name in the stack key, what we must not do: every task multiplies the stacks).

``--packed`` holds user stacks as the sampler does during the window (profiler/capture/packedchunks.py);
``--values N`` draws every frame from N pcs (a JVM's stacks reuse few values; 0: every frame a new value,
packing's worst case).

usage: .venv/bin/python bench/bench_stackstore.py [--samples N] [--pool N] [--root-frames N]
                                                  [--tasks-per-second N] [--names context|in-key]
                                                  [--values N] [--packed]
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.capture.stackstore import StackStore

SECOND = 10**9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=178_000, help="samples over the 900 s window (178000)")
    parser.add_argument("--pool", type=int, default=100_000, help="distinct user stacks to draw from (100000)")
    parser.add_argument("--root-frames", type=int, default=40, help="frames of each of the 20 shared roots (40)")
    parser.add_argument("--tasks-per-second", type=float, default=0.0, help="Spark tasks a second (0: no renames)")
    parser.add_argument("--names", choices=("context", "in-key"), default="context", help="where task names go")
    parser.add_argument("--values", type=int, default=0, help="frames drawn from this many pcs (0: all distinct)")
    parser.add_argument("--packed", action="store_true", help="user stacks packed, as the sampler's window holds them")
    args = parser.parse_args(argv)
    rng = random.Random(1)
    pcs = [rng.randrange(1 << 40) for _ in range(args.values)]

    def pc() -> int:
        return rng.choice(pcs) if pcs else rng.randrange(1 << 40)

    roots = [[pc() for _ in range(args.root_frames)] for _ in range(20)]
    pool = []
    for _ in range(args.pool):
        frames = [pc() for _ in range(rng.randrange(5, 40))] + rng.choice(roots)
        pool.append(struct.pack(f"<{len(frames)}Q", *frames))
    kernel = [struct.pack("<5Q", *[rng.randrange(1 << 40) for _ in range(5)]) for _ in range(50)]
    store = StackStore(10 * SECOND)
    store.begin(0)
    if args.packed:
        store.pack_user_stacks()
    tracemalloc.start()
    cpu = time.process_time()
    for sample in range(args.samples):
        time_ns = sample * (900 * SECOND // args.samples)
        popular = rng.random() < 0.5
        user = pool[int(rng.paretovariate(1.2)) % len(pool)] if popular else pool[rng.randrange(len(pool))]
        kernel_stack: bytes | int = bytes(bytearray(rng.choice(kernel))) if rng.random() < 0.2 else -1
        thread_name, context = b"Executor task launch worker", None
        if args.tasks_per_second:
            task = int(time_ns * args.tasks_per_second / SECOND) // 8 * 8 + sample % 8  # the thread's task now
            context = f"Executor task launch worker for task {task % 200}.0 in stage {task // 200}.0 (TID {task})"
            if args.names == "in-key":
                thread_name, context = context.encode(), None
        # copies, as each ring-buffer record arrives as new bytes
        store.add(100 + sample % 2, sample % 8, thread_name, time_ns, bytes(bytearray(user)), kernel_stack,
                  epoch=time_ns // (60 * SECOND), context=context)
    current, _peak = tracemalloc.get_traced_memory()
    cpu = time.process_time() - cpu
    print(
        f"samples {args.samples}, tasks {store.contexts}, distinct stacks {store.distinct_stacks}, raw addresses "
        f"{store.stored_bytes / 2**20:.1f} MiB, allocated {current / 2**20:.1f} MiB = "
        f"{current / max(1, store.distinct_stacks):.0f} bytes per distinct stack; "
        f"{cpu:.1f} CPU s filing them (traced, drawing samples included)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
